"""Does a budget stop the loop or the answer? Agent styles x one workload, shadow vs enforced.

    python -m bench.eval_agents [--quick] [--config ragtoll.yaml] [--recommend [--recommend-percentile P]] [--records DIR]
                                [--out bench/results/eval_agents.json] [--styles lean,runaway] [--check]

Run 1, shadow: budgets evaluated, nothing rejected, evidence cache off (the baseline). Run 2,
enforced: the config under test (`--config`, a ragtoll YAML: its `budgets`, `cache` and `pricing`
apply; default: ragtoll's embedded defaults, i.e. no budgets section). With `--recommend`, run 3:
`ragtoll recommend` over the shadow run's task records, its snippet pasted under `budgets:` of the
same config, enforced. Prints one table per enforced run and writes everything as JSON; with
`--check`, exits 1 when an enforced run misses one of the targets (scoring.py).
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import yaml
from ragtoll.proxy.tools import recommend, report

from . import harness, scoring
from .workload import STYLES, load_gold, load_tasks

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "eval_agents.json")


def recommended(records_file: str, pct: float = 100.0) -> tuple[str, list[recommend.Advice]]:
    """`ragtoll recommend <records_file> --percentile pct` (no wall-clock limit): the YAML it
    prints and its advice (the simulated cuts)."""
    advice = recommend.recommend(report.read_jsonl(records_file), pct)
    return recommend.format_advice(advice, pct), advice


def prediction(advice: list[recommend.Advice], c: scoring.Comparison) -> str:
    """What recommend's simulation predicted over the shadow records against what the run measured."""
    cuts = [cut for a in advice for cut in a.cuts]
    predicted = sum(cut.saved_usd for cut in cuts)
    shadow = sum(t.cost_shadow for t in c.tasks)
    saved = shadow - sum(t.cost_enforced for t in c.tasks)
    correct = [cut.task_id.removeprefix("eval-shadow-") for cut in cuts if cut.correct]
    lost = [t.id for t in c.tasks if t.lost]
    return (f"recommend predicted (from the shadow records): {len(cuts)} task(s) cut, {len(correct)} of them "
            f"correct{': ' + ', '.join(correct) if correct else ''}; saving ${predicted:.4f} "
            f"({predicted / shadow:.1%})\n"
            f"measured (run 3 against run 1, the config's evidence cache included): saved ${saved:.4f} "
            f"({saved / shadow:.1%}); "
            f"{len(lost)} correct answer(s) lost{': ' + ', '.join(lost) if lost else ''}\n")


def with_recommendation(raw: dict[str, Any], snippet: str) -> dict[str, Any]:
    """The config with the snippet pasted under `budgets:`: each profile recommend speaks of gets
    exactly its limits; a configured profile no task used (so absent from the snippet) stays."""
    doc = copy.deepcopy(raw)
    pasted = ((yaml.safe_load(snippet) or {}).get("budgets") or {}).get("profiles") or {}
    budgets = doc.setdefault("budgets", {})
    budgets["profiles"] = {**(budgets.get("profiles") or {}), **{k: v or {} for k, v in pasted.items()}}
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval_agents", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first 3 tasks of each style")
    ap.add_argument("--config", help="ragtoll YAML under test (default: the embedded defaults)")
    ap.add_argument("--recommend", action="store_true", help="also run with `ragtoll recommend`'s limits")
    ap.add_argument("--recommend-percentile", type=float, default=100.0, metavar="P",
                    help="run 3 with `ragtoll recommend --percentile P` (default 100: the most a correct task used)")
    ap.add_argument("--records", help="keep the task records (and the recommended YAML) in this directory")
    ap.add_argument("--out", default=DEFAULT_OUT, help="JSON results (default bench/results/eval_agents.json)")
    ap.add_argument("--check", action="store_true", help="exit 1 when an enforced run misses a target")
    ap.add_argument("--styles", default=",".join(STYLES), help=f"comma-separated subset of {','.join(STYLES)}")
    args = ap.parse_args(argv)
    styles = tuple(s for s in args.styles.split(",") if s)
    if unknown := set(styles) - set(STYLES):
        ap.error(f"unknown styles: {', '.join(sorted(unknown))}")
    raw: dict[str, Any] = {}
    if args.config:
        with open(args.config, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
        for key in ("upstreams", "admin", "identity", "tasks"):  # the harness sets these
            raw.pop(key, None)
    config_name = args.config or "ragtoll's embedded defaults (no budgets section)"
    tasks, gold = load_tasks(args.quick, styles), load_gold()
    counts = {s: sum(1 for t in tasks if t.style == s) for s in styles}
    t0 = time.perf_counter()
    out: dict[str, Any] = {"tasks": len(tasks), "per_style": counts, "quick": args.quick, "config": config_name}
    w = sys.stdout.write
    w(f"eval_agents: {len(tasks)} tasks ({', '.join(f'{n} {s}' for s, n in counts.items())})\n"
      f"run 1 shadow (nothing rejected, cache off); run 2 enforced: {config_name}"
      + ("; run 3 enforced: `ragtoll recommend` over run 1, pasted under budgets:" if args.recommend else "")
      + "\nnumbers: ragtoll's task records and call spans\n\n")
    with tempfile.TemporaryDirectory(prefix="ragtoll-eval-") as tmp, harness.stack_up() as stack:
        shadow, shadow_file = harness.run_workload(stack, "shadow", tasks, gold, raw, shadow=True, workdir=tmp)
        runs = [("enforced", raw)]
        snippet, advice = None, []
        if args.recommend:
            snippet, advice = recommended(shadow_file, args.recommend_percentile)
            runs.append(("recommend", with_recommendation(raw, snippet)))
            out["recommend_yaml"] = snippet
        files = {"shadow": shadow_file}
        out["comparisons"] = {}
        for label, cfg in runs:
            enforced, files[label] = harness.run_workload(stack, label, tasks, gold, cfg, shadow=False, workdir=tmp)
            c = scoring.compare(label, shadow, enforced, gold)
            title = config_name if label == "enforced" else (
                "`ragtoll recommend` limits (" + ("the most" if args.recommend_percentile >= 100
                else f"p{args.recommend_percentile:g} of what") + " a correct shadow task used)")
            w(f"== {label}: {title}\n")
            w(scoring.table(c))
            w(scoring.details(c))
            if label == "recommend":
                w(prediction(advice, c))
            w("\n")
            out["comparisons"][label] = scoring.as_json(c)
        if args.records:
            os.makedirs(args.records, exist_ok=True)
            for label, path in files.items():
                shutil.copyfile(path, os.path.join(args.records, f"{label}.jsonl"))
            if snippet is not None:
                with open(os.path.join(args.records, "recommend.yaml"), "w", encoding="utf-8") as fh:
                    fh.write(snippet)
    if snippet is not None:
        w("the recommended limits (run 3):\n" + snippet + "\n")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    harness.write_results(args.out, out)
    w(f"wrote {args.out}; finished in {out['seconds']:.1f} s\n")
    missed = [f"{label}: {name}" for label, c in out["comparisons"].items()
              for name, t in c["targets"].items() if not t["pass"]]
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
