"""Does groundedness track correctness? ragtoll's grade of answers against the evidence each task retrieved.

    python -m bench.eval_agents.grounding_eval [--quick] [--out bench/results/grounding_eval.json]

One shadow run of the eval's workload (the scripted model through ragtoll) gives each task its
answer, ragtoll's record (with the answer's groundedness) and the chunks the task retrieved. The
scripted model only ever quotes a sentence of its evidence, so every answer it gives is correct
and fully grounded: a correlation needs wrong answers too. Per answerable task that was answered,
the same grading (proxy/core/grounding.py) is applied to five answers, and the demo's judge says
which are correct:

  answer     the agent's own answer (as ragtoll graded it on the wire: checked equal)
  framed     the answer behind a framing clause the evidence does not hold (correct, less grounded)
  padded     the answer plus an invented sentence (correct, half grounded)
  swapped    the answer with its fact replaced by another task's (wrong)
  borrowed   another task's answer, citation and all (wrong)

The claim threshold (SUPPORT_SHARE) is chosen on half A of the tasks (every other task of each
style) by the area under the ROC curve of groundedness for correct against wrong answers, and
reported on half B, with the point-biserial correlation and the mean groundedness of each kind.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ragtoll.proxy.core import grounding
from ragtoll.proxy.tools.demo import scoring as demo_scoring

from . import harness
from .workload import STYLES, Gold, load_chunks, load_gold, load_tasks

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "grounding_eval.json")
THRESHOLDS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# the short framing a model puts around a quoted fact (two or three words the evidence does not hold)
FRAMES = ("According to the documentation, ", "Good news: the documents confirm that ", "In short, as documented, ")
INVENTED = ("This changed after the Lisbon datacenter migration in March 2021.",
            "Enterprise customers can ask their account manager for a written exception.",
            "The rule is enforced by the compliance robot every Sunday night.")
KINDS = ("answer", "framed", "padded", "swapped", "borrowed")


def candidates(i: int, answer: str, gold: str, others: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(kind, text) of the five answers graded for a task (module docstring); `others`: (answer,
    gold) of the other answered tasks, the one borrowed from chosen by `i`."""
    other_answer, other_gold = next((a, g) for k, (a, g) in enumerate(others[i:] + others[:i])
                                    if g.casefold() != gold.casefold() or k == len(others) - 1)
    at = answer.casefold().find(gold.casefold())
    swapped = answer[:at] + other_gold + answer[at + len(gold):] if at >= 0 else answer + " " + other_gold
    return [("answer", answer), ("framed", FRAMES[i % len(FRAMES)] + answer[:1].lower() + answer[1:]),
            ("padded", f"{answer} {INVENTED[i % len(INVENTED)]}"), ("swapped", swapped), ("borrowed", other_answer)]


def auc(correct: Sequence[float], wrong: Sequence[float]) -> float | None:
    """P(a correct answer's grade > a wrong one's), ties count half (Mann-Whitney)."""
    if not correct or not wrong:
        return None
    wins = sum((c > w) + 0.5 * (c == w) for c in correct for w in wrong)
    return wins / (len(correct) * len(wrong))


def point_biserial(grades: Sequence[float], correct: Sequence[bool]) -> float | None:
    """Pearson's r between the grade and correctness (1/0)."""
    n = len(grades)
    ys = [1.0 if c else 0.0 for c in correct]
    mx, my = sum(grades) / n, sum(ys) / n
    sx = sum((x - mx) ** 2 for x in grades) ** 0.5
    sy = sum((y - my) ** 2 for y in ys) ** 0.5
    if not sx or not sy:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(grades, ys, strict=True)) / (sx * sy)


def grade_all(items: Sequence[Mapping[str, Any]], threshold: float) -> list[dict[str, Any]]:
    """Every candidate of every task graded at `threshold` (the module constant, set and restored)."""
    saved, grounding.SUPPORT_SHARE = grounding.SUPPORT_SHARE, threshold
    try:
        out = []
        for item in items:
            ev = grounding.TaskEvidence()
            for cid, text in item["chunks"]:
                ev.add(cid, text)
            for kind, text in item["candidates"]:
                share = ev.ground(text).share
                out.append({"task": item["task"], "kind": kind, "grade": 0.0 if share is None else share,
                            "correct": demo_scoring.judge(text, item["gold"])})
        return out
    finally:
        grounding.SUPPORT_SHARE = saved


def summary(graded: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    good = [g["grade"] for g in graded if g["correct"]]
    bad = [g["grade"] for g in graded if not g["correct"]]
    by_kind = {k: [g for g in graded if g["kind"] == k] for k in KINDS}
    return {
        "answers": len(graded), "correct": len(good), "auc": auc(good, bad),
        "point_biserial": point_biserial([g["grade"] for g in graded], [g["correct"] for g in graded]),
        "mean_correct": sum(good) / len(good) if good else None, "mean_wrong": sum(bad) / len(bad) if bad else None,
        "kinds": {k: {"mean": sum(g["grade"] for g in v) / len(v), "correct": sum(g["correct"] for g in v),
                      "n": len(v)} for k, v in by_kind.items() if v},
    }


def items_of(runs: Sequence[harness.TaskRun], gold: Mapping[str, Gold]) -> list[dict[str, Any]]:
    """Per answered, answerable task: its retrieved chunks, gold, and the five candidates."""
    texts = {c.id: c.text for c in load_chunks()}
    answered = [r for r in runs if r.answer and gold[r.task.id].answer and r.correct]
    pairs = [(r.answer or "", gold[r.task.id].answer or "") for r in answered]
    out = []
    for i, r in enumerate(answered):
        ids = list(dict.fromkeys(cid for call in r.tool_log if call.name == "retrieve" for cid in call.ids))
        others = pairs[:i] + pairs[i + 1:]
        out.append({"task": r.task.id, "style": r.task.style, "gold": pairs[i][1],
                    "chunks": [(cid, texts[cid]) for cid in ids if cid in texts],
                    "candidates": candidates(i, pairs[i][0], pairs[i][1], others),
                    "recorded": r.record.get("groundedness")})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval_agents.grounding_eval", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first 3 tasks of each style")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    tasks, gold = load_tasks(args.quick), load_gold()
    half_a = {t.id for s in STYLES for t in [x for x in tasks if x.style == s][0::2]}
    t0 = time.perf_counter()
    w = sys.stdout.write
    with tempfile.TemporaryDirectory(prefix="ragtoll-grounding-") as tmp, harness.stack_up() as stack:
        runs, _ = harness.run_workload(stack, "shadow", tasks, gold, {}, shadow=True, workdir=tmp)
    items = items_of(runs, gold)
    # ragtoll's grade on the wire equals the offline grade of the same answer over the same chunks
    wire = [(it["recorded"], g["grade"]) for it, g in zip(items, [
        x for x in grade_all(items, grounding.SUPPORT_SHARE) if x["kind"] == "answer"], strict=True)]
    mismatched = [i for i, (rec, off) in enumerate(wire) if rec != off]
    a_items = [it for it in items if it["task"] in half_a]
    b_items = [it for it in items if it["task"] not in half_a]
    selection = {t: summary(grade_all(a_items, t)) for t in THRESHOLDS}
    chosen = max(THRESHOLDS, key=lambda t: (selection[t]["auc"] or 0.0, -abs(t - grounding.SUPPORT_SHARE)))
    out: dict[str, Any] = {
        "tasks": len(tasks), "graded_tasks": len(items), "wire_matches_offline": not mismatched,
        "selection_half_a": {str(t): s for t, s in selection.items()}, "chosen": chosen,
        "half_b": summary(grade_all(b_items, chosen)), "all": summary(grade_all(items, chosen)),
        "per_style_records": {s: _style(runs, s) for s in STYLES},
    }
    w(f"grounding_eval: {len(tasks)} tasks, {len(items)} answered answerable tasks graded x {len(KINDS)} answers\n")
    w(f"ragtoll's recorded groundedness equals the offline grade for {len(wire) - len(mismatched)}/{len(wire)} answers\n")
    w("half A, by claim threshold: " + ", ".join(f"{t}: AUC {selection[t]['auc']:.3f}" for t in THRESHOLDS) + "\n")
    w(f"chosen on half A: {chosen}\n")
    for name in ("half_b", "all"):
        s = out[name]
        w(f"{name}: {s['answers']} answers ({s['correct']} correct); AUC {s['auc']:.3f}, point-biserial r "
          f"{s['point_biserial']:.3f}; mean groundedness correct {s['mean_correct']:.2f}, wrong {s['mean_wrong']:.2f}; "
          + ", ".join(f"{k} {v['mean']:.2f} ({v['correct']}/{v['n']} correct)" for k, v in s["kinds"].items()) + "\n")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    harness.write_results(args.out, out)
    w(f"wrote {args.out}; finished in {out['seconds']:.1f} s\n")
    return 0


def _style(runs: Sequence[harness.TaskRun], style: str) -> dict[str, Any]:
    rows = [r for r in runs if r.task.style == style]
    grades = [r.record["groundedness"] for r in rows if r.record.get("groundedness") is not None]
    return {"tasks": len(rows), "correct": sum(r.correct for r in rows), "graded": len(grades),
            "groundedness": sum(grades) / len(grades) if grades else None}


if __name__ == "__main__":
    sys.exit(main())
