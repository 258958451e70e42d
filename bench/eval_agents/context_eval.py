"""The context economy measured: input cost per task with ragtoll against no ragtoll, on a
provider that caches prompts as OpenAI does, agents with a fixed ~1,400-token preamble and
~300-token evidence chunks (provider.py).

    python -m bench.eval_agents.context_eval [--quick] [--styles lean,runaway] [--out FILE]

Runs, each on a fresh provider cache (so no run inherits another's cached prefixes):
  baseline       no ragtoll: budgets in shadow, evidence cache off, no rewrites (context off)
  budgets        the embedded budget defaults alone (context off)
  cache_key      prompt_cache_key alone (budgets in shadow), in the mode chosen on half A
  evidence_once  evidence sent once alone (budgets in shadow)
  depth          adaptive depth alone (budgets in shadow), with the cut chosen on half A
  widen          widening a weak first pass alone (budgets in shadow), thresholds chosen on half A
  defaults       ragtoll's embedded defaults as they are (no context config)
  defaults+widen the embedded defaults with widening on, as chosen on half A
  note           the budget note alone (budgets in shadow: the note still says what is left)
  defaults+note  the embedded defaults with the budget note on (the scripted models do not read
                 it: this measures what it costs, not what a model reading it would save)
  all            the embedded defaults, with the route's prompt_cache_key and depth as chosen
The key mode (`task` or `system`), the depth cut and the widening thresholds are chosen on half A
of the tasks (every other task of each style) by input cost at no lost answer, and reported on
half B as well as on all tasks. Input
cost is the provider's billing: uncached prompt tokens at the input price, cached ones at the
model's cached price (gpt-4.1 headline: $2.00 / $0.50 per million; gpt-4o and gpt-5 beside it).
The floor: what the fixed preamble alone costs over the run's LLM calls, every call a cache hit.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from . import harness, provider
from .workload import STYLES, Gold, Task, load_gold, load_tasks

# $/Mtok: input, cached read, cache write (OpenAI bills no writes; Claude's 5-minute cache: 1.25x)
OPENAI_PRICES = {"gpt-4.1": (2.00, 0.50, 2.00), "gpt-4o": (2.50, 1.25, 2.50), "gpt-5": (1.25, 0.125, 1.25)}
ANTHROPIC_PRICES = {"claude-sonnet-4-5": (3.00, 0.30, 3.75), "claude-haiku-4-5": (1.00, 0.10, 1.25)}
PRICES = dict(OPENAI_PRICES)
HEADLINE = "gpt-4.1"
TARGET_RATIO = 0.6
DEPTH_CANDIDATES = ((0.15, 0.0), (0.25, 0.0), (0.5, 0.0), (0.0, 0.5))  # (depth_gap, depth_floor)
# (widen_margin, widen_floor, widen_top_k) on top of the embedded defaults; the retriever's scores
# are BM25 (the questions' top scores run from about 3 to 19), so a floor of 5 marks the poorest quarter
WIDEN_CANDIDATES = ((0.05, 0.0, 12), (0.1, 0.0, 12), (0.0, 5.0, 12), (0.05, 0.0, 20))
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "context_eval.json")


def key_route(mode: str) -> dict[str, Any]:
    return {"routes": {"llm": {"prompt_cache_key": mode}}}


def run(stack_tasks: Sequence[Task], gold: Mapping[str, Gold], label: str, raw: dict[str, Any], shadow: bool,
        workdir: str) -> dict[str, Any]:
    """One run on a fresh provider cache: per task, correct, LLM calls and the provider's billing."""
    cache: Any = provider.AnthropicPromptCache() if HEADLINE in ANTHROPIC_PRICES else provider.OpenAIPromptCache()
    with harness.stack_up(cache, chunk_tokens=300) as stack:
        runs, _records = harness.run_workload(stack, label, list(stack_tasks), gold, raw, shadow=shadow,
                                              workdir=workdir)
    ledger = stack.ledger
    assert ledger is not None
    preamble = harness.agents_preamble_tokens()
    out: dict[str, Any] = {}
    for r in runs:
        ctx = r.record.get("context") or {}
        out[r.task.id] = {
            "style": r.task.style, "correct": r.correct, "calls": ledger.calls[r.task_id],
            "uncached": ledger.uncached[r.task_id], "cached": ledger.cached[r.task_id],
            "written": ledger.written[r.task_id],
            "preamble": preamble * ledger.calls[r.task_id],
            "chunks_referenced": ctx.get("chunks_referenced", 0),
            "resent_tokens": sum(c.resent_tokens for c in r.calls),
            "evidence_chars_saved": ctx.get("evidence_chars_saved", 0),
            "searches_widened": ctx.get("searches_widened", 0), "budget_notes": ctx.get("budget_notes", 0),
        }
    return out


def cost(row: Mapping[str, Any], model: str | None = None) -> float:
    inp, cached, write = PRICES[model or HEADLINE]
    return (row["uncached"] * inp + row["cached"] * cached + row["written"] * write) / 1e6


def floor(row: Mapping[str, Any], model: str | None = None) -> float:
    return row["preamble"] * PRICES[model or HEADLINE][1] / 1e6


def compare(base: Mapping[str, Any], arm: Mapping[str, Any], ids: Sequence[str],
            model: str | None = None) -> dict[str, Any]:
    """Per style and overall: tasks, correct (baseline -> arm), lost, input cost per task and the ratio."""
    out: dict[str, Any] = {}
    styles = list(dict.fromkeys(base[i]["style"] for i in ids))
    for style in [*styles, "overall"]:
        sel = [i for i in ids if style == "overall" or base[i]["style"] == style]
        if not sel:
            continue
        b = sum(cost(base[i], model) for i in sel)
        a = sum(cost(arm[i], model) for i in sel)
        prompt = sum(arm[i]["uncached"] + arm[i]["cached"] + arm[i]["written"] for i in sel)
        base_prompt = sum(base[i]["uncached"] + base[i]["cached"] + base[i]["written"] for i in sel)
        out[style] = {
            "tasks": len(sel),
            "correct": [sum(base[i]["correct"] for i in sel), sum(arm[i]["correct"] for i in sel)],
            "lost": sum(1 for i in sel if base[i]["correct"] and not arm[i]["correct"]),
            "input_cost_per_task": [b / len(sel), a / len(sel)],
            "ratio": a / b if b else None,
            "floor_ratio": sum(floor(arm[i], model) for i in sel) / b if b else None,
            "cached_share": [sum(base[i]["cached"] for i in sel) / base_prompt if base_prompt else None,
                             sum(arm[i]["cached"] for i in sel) / prompt if prompt else None],
            "prompt_tokens_per_task": [base_prompt / len(sel), prompt / len(sel)],
            "chunks_referenced": sum(arm[i]["chunks_referenced"] for i in sel),
            "searches_widened": sum(arm[i].get("searches_widened", 0) for i in sel),
            "budget_notes": sum(arm[i].get("budget_notes", 0) for i in sel),
            "llm_calls_per_task": [sum(base[i]["calls"] for i in sel) / len(sel), sum(arm[i]["calls"] for i in sel) / len(sel)],
            "evidence_resent_tokens_per_task": [sum(base[i]["resent_tokens"] for i in sel) / len(sel),
                                                sum(arm[i]["resent_tokens"] for i in sel) / len(sel)],
        }
    return out


def table(title: str, c: Mapping[str, Any]) -> str:
    lines = [f"== {title}",
             (f"{'style':<13} {'tasks':>5} {'correct':>9} {'lost':>4} {'input $/task: none -> ragtoll':>31} "
             f"{'ratio':>6} {'floor':>6} {'cached share':>14} {'prompt tok/task':>17}")]
    for style, s in c.items():
        b, a = s["input_cost_per_task"]
        cs = s["cached_share"]
        pb, pa = s["prompt_tokens_per_task"]
        rb, ra = s["evidence_resent_tokens_per_task"]
        lines.append(
            f"{style:<13} {s['tasks']:>5} {s['correct'][0]:>4}->{s['correct'][1]:<4} {s['lost']:>4} "
            f"{f'${b:.5f} -> ${a:.5f}':>31} {s['ratio']:>6.2f} {s['floor_ratio']:>6.2f} "
            f"{f'{cs[0]:.0%} -> {cs[1]:.0%}':>14} "
            f"{f'{pb:.0f}->{pa:.0f}':>17} {f'{rb:.0f}->{ra:.0f}':>17}")
    return "\n".join(lines) + "\n"


def passes(c: Mapping[str, Any]) -> bool:
    return all(s["lost"] == 0 and s["ratio"] is not None and s["ratio"] <= TARGET_RATIO for s in c.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval_agents.context_eval", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first 3 tasks of each style")
    ap.add_argument("--styles", default=",".join(STYLES))
    ap.add_argument("--out", default=None, help="JSON results (default bench/results/context_eval_<provider>.json)")
    ap.add_argument("--provider", choices=("openai", "anthropic"), default="openai")
    ap.add_argument("--arms", default="", help="only these full runs (comma-separated labels), after the selections")
    args = ap.parse_args(argv)
    global PRICES, HEADLINE
    if args.provider == "anthropic":
        PRICES, HEADLINE = dict(ANTHROPIC_PRICES), "claude-sonnet-4-5"
    args.out = args.out or DEFAULT_OUT.replace(".json", f"_{args.provider}.json")
    styles = tuple(s for s in args.styles.split(",") if s)
    tasks, gold = load_tasks(args.quick, styles), load_gold()
    half_a = [t for s in styles for t in [x for x in tasks if x.style == s][0::2]]
    half_b = [t for t in tasks if t not in half_a]
    ids_a, ids_b, ids = [t.id for t in half_a], [t.id for t in half_b], [t.id for t in tasks]
    w = sys.stdout.write
    t0 = time.perf_counter()
    out: dict[str, Any] = {"tasks": len(tasks), "half_a": ids_a, "half_b": ids_b, "prices": PRICES,
                           "preamble_tokens": harness.agents_preamble_tokens(), "chunk_tokens": 300}
    cache_kind = (f"OpenAI-style prefix cache ({provider.MACHINES} machines, spill past {provider.SPILL_PER_MIN}/min, "
                  f"fleet {provider.RATE_PER_MIN} calls/min)" if args.provider == "openai" else
                  "Claude-style explicit breakpoints (20-block lookback, writes 1.25x, reads 0.1x)")
    out["provider"] = args.provider
    w(f"context_eval: {len(tasks)} tasks; preamble {out['preamble_tokens']} tokens; chunks ~300 tokens; "
      f"provider: {cache_kind}; prices {HEADLINE} {PRICES[HEADLINE]} $/Mtok (input, cached, write)\n\n")
    with tempfile.TemporaryDirectory(prefix="ragtoll-ctx-") as tmp:
        base = run(tasks, gold, "baseline", {}, True, tmp)
        # the prompt_cache_key mode, chosen on half A (cost at no lost answer)
        chosen, best = "system", None
        selection: dict[str, Any] = {}
        for mode in ("task", "system") if args.provider == "openai" else ():
            arm = run(half_a, gold, f"select-{mode}",
                      {"context": {"evidence_once": False, "depth": False, **key_route(mode)}}, True, tmp)
            c = compare(base, arm, ids_a)["overall"]
            selection[mode] = {"ratio": c["ratio"], "lost": c["lost"]}
            if c["lost"] == 0 and (best is None or c["ratio"] < best):
                chosen, best = mode, c["ratio"]
        if selection:
            out["key_mode"] = {"chosen_on_half_a": chosen, "half_a": selection}
            picked = ", ".join(f"{m}: {v['ratio']:.3f}x, {v['lost']} lost" for m, v in selection.items())
            w(f"prompt_cache_key mode chosen on half A: {chosen} ({picked})\n\n")
        # no cache assist, no depth: each piece is measured alone
        alone = {"breakpoints": False, "prompt_cache_key": "off", "depth": False}
        # adaptive depth's cut, chosen on half A the same way (docs route: the eval's retrieval)
        depth_pick: dict[str, Any] | None = None
        best = None
        depth_sel: dict[str, Any] = {}
        for gap, floor_share in DEPTH_CANDIDATES:
            cfg = {**alone, "evidence_once": False, "depth": True, "depth_gap": gap, "depth_floor": floor_share}
            arm = run(half_a, gold, f"select-depth-{gap}-{floor_share}", {"context": cfg}, True, tmp)
            c = compare(base, arm, ids_a)["overall"]
            depth_sel[f"gap={gap},floor={floor_share}"] = {"ratio": c["ratio"], "lost": c["lost"]}
            if c["lost"] == 0 and (best is None or c["ratio"] < best):
                depth_pick, best = {"depth": True, "depth_gap": gap, "depth_floor": floor_share}, c["ratio"]
        out["depth"] = {"chosen_on_half_a": depth_pick, "half_a": depth_sel}
        picked = ", ".join(f"{k}: {v['ratio']:.3f}x, {v['lost']} lost" for k, v in depth_sel.items())
        w(f"adaptive depth chosen on half A: {depth_pick} ({picked})\n\n")
        depth_cfg = depth_pick or {"depth": False}  # the embedded default is depth on, gap 0.15, floor 0
        assist = ({"cache_key": ({"context": {"evidence_once": False, "depth": False, **key_route(chosen)}}, True)}
                  if args.provider == "openai" else
                  {"breakpoints": ({"context": {"evidence_once": False, "depth": False}}, True)})
        arms = {
            "budgets": ({"context": {"enabled": False}}, False),
            **assist,
            "evidence_once": ({"context": alone}, True),
            "depth": ({"context": {**alone, "evidence_once": False, **depth_cfg}}, True),
            "defaults": ({}, False),
            "all": ({"context": {**(key_route(chosen) if args.provider == "openai" else {}), **depth_cfg}}, False),
        }
        # widening, chosen on half A against the embedded defaults (it changes what depth passes on)
        defaults_a = compare(base, run(half_a, gold, "select-defaults", {}, False, tmp), ids_a)["overall"]
        widen_sel: dict[str, Any] = {"defaults": {"ratio": defaults_a["ratio"], "lost": defaults_a["lost"]}}
        widen_pick: dict[str, Any] | None = None
        best = None
        for margin, wfloor, wide in WIDEN_CANDIDATES:
            cfg = {"widen": True, "widen_margin": margin, "widen_floor": wfloor, "widen_top_k": wide}
            c = compare(base, run(half_a, gold, f"select-widen-{margin}-{wfloor}-{wide}", {"context": cfg}, False,
                                  tmp), ids_a)["overall"]
            widen_sel[f"margin={margin},floor={wfloor},top_k={wide}"] = {
                "ratio": c["ratio"], "lost": c["lost"], "searches_widened": c["searches_widened"]}
            # the best candidate that widened anything (one that never fires is the defaults again)
            if c["lost"] == 0 and c["searches_widened"] and (best is None or c["ratio"] < best):
                widen_pick, best = cfg, c["ratio"]
        out["widen"] = {"chosen_on_half_a": widen_pick, "half_a": widen_sel,
                        "helps_on_half_a": best is not None and best < defaults_a["ratio"]}
        picked = ", ".join(f"{k}: {v['ratio']:.3f}x, {v['lost']} lost" for k, v in widen_sel.items())
        w(f"widening chosen on half A: {widen_pick} ({picked})\n\n")
        widen_cfg = widen_pick or {"widen": True}
        arms["widen"] = ({"context": {**alone, "evidence_once": False, "depth": False, **widen_cfg}}, True)
        arms["defaults+widen"] = ({"context": widen_cfg}, False)
        arms["note"] = ({"context": {**alone, "evidence_once": False, "depth": False, "budget_note": True}}, True)
        arms["defaults+note"] = ({"context": {"budget_note": True}}, False)
        arms["all"] = arms.pop("all")
        if args.arms:
            arms = {k: v for k, v in arms.items() if k in args.arms.split(",")}
        out["runs"] = {}
        for label, (raw, shadow) in arms.items():
            arm = run(tasks, gold, label, raw, shadow, tmp)
            full, b_half = compare(base, arm, ids), compare(base, arm, ids_b)
            other = {m: compare(base, arm, ids, m)["overall"]["ratio"] for m in PRICES if m != HEADLINE}
            out["runs"][label] = {"all_tasks": full, "half_b": b_half, "other_prices_overall_ratio": other}
            w(table(f"{label} (all tasks)", full))
            at_other = ", ".join(f"{m} {r:.3f}" for m, r in other.items())
            w(f"half B overall: ratio {b_half['overall']['ratio']:.3f}, lost {b_half['overall']['lost']}; "
              f"overall ratio at other prices: {at_other}\n\n")
        if "all" in out["runs"]:
            out["target"] = {"ratio": TARGET_RATIO, "all_pass": passes(out["runs"]["all"]["all_tasks"]),
                             "half_b_pass": passes(out["runs"]["all"]["half_b"])}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if "target" in out:
        w(f"target (all: input cost <= {TARGET_RATIO}x at 0 lost on every style): all tasks "
          f"{'PASS' if out['target']['all_pass'] else 'MISS'}, "
          f"half B {'PASS' if out['target']['half_b_pass'] else 'MISS'}\n")
    harness.write_results(args.out, out)
    w(f"wrote {args.out}; {out['seconds']:.1f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
