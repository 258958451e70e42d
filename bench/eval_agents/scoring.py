"""What the harness computes from two runs of the workload (shadow and enforced). Pure.

Per task, from ragtoll's task records: correct or not (the outcome the harness posted), cost,
retrieval calls, the limit that stopped it. From ragtoll's call spans of the shadow run: the oracle
cost. From the agent's tool log: when the evidence was complete and which retrievals were fruitless.

**Oracle** (per task, from its shadow run). The evidence is complete after the first retrieval
whose results, with everything the task retrieved before, include every gold evidence chunk (the
chunk that states the answer; for multi-hop and two-hop questions, every hop's chunk). The oracle
cost is what ragtoll charged for the task's calls up to and including the first LLM step after that
retrieval: the step that could have answered. For an unanswerable task (gold: not in the
documents), one ordinary attempt: the calls up to and including the first LLM step after the first
retrieval. A task answered wrongly in shadow, or whose evidence never came together, gets its
shadow cost as oracle (nothing avoidable).

**Avoidable spend** = shadow cost - oracle cost (at least 0). **Saved** = shadow cost - enforced
cost. **Captured** = saved, clipped to [0, avoidable], and 0 for a task whose correct answer was
lost (a saving that costs an answer is not captured). Captured share of a group = the sum of captured
over the sum of avoidable.

**Fruitless retrieval**: a retrieval (upstream or served from cache; not a refused one) that brought
no chunk new to the task, or a reworded repeat: its query shares at least half of its terms
(Jaccard over the demo analyzer's stemmed terms) with an earlier query of the task and none of its
top 3 results is new. A **runaway** is a task whose shadow run made more than 3 fruitless
retrievals; it is **stopped within 3** when its enforced run made at most 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ragtoll.proxy.tools.demo.text import terms
from ragtoll.proxy.tools.report import render_table

from .agents import ToolCall
from .harness import CallSpan, TaskRun
from .workload import STYLES, Gold

REWORD_JACCARD = 0.5
TOP_NEW = 3
RUNAWAY_FRUITLESS = 3
TARGET_CAPTURED = 0.80
TARGET_LOST_OVERALL = 0.01


def fruitless_flags(log: Sequence[ToolCall]) -> list[bool]:
    """One flag per retrieval that returned results (refused ones are skipped), in order."""
    seen: set[str] = set()
    earlier: list[set[str]] = []
    flags = []
    for call in log:
        if call.name != "retrieve" or call.error is not None:
            continue
        q = set(terms(call.query))
        new = [i for i in call.ids if i not in seen]
        top_new = [i for i in call.ids[:TOP_NEW] if i not in seen]
        reworded = any(q and e and len(q & e) / len(q | e) >= REWORD_JACCARD for e in earlier)
        flags.append(not new or (reworded and not top_new))
        seen.update(call.ids)
        earlier.append(q)
    return flags


def evidence_retrieval(log: Sequence[ToolCall], gold: Gold) -> int | None:
    """0-based number of the retrieval after which the evidence was complete (the first one for an
    unanswerable task); None if it never was."""
    seen: set[str] = set()
    n = -1
    for call in log:
        if call.name != "retrieve" or call.error is not None:
            continue
        n += 1
        seen.update(call.ids)
        if gold.answer is None or set(gold.evidence) <= seen:
            return n
    return None


def oracle_cost(calls: Sequence[CallSpan], retrieval: int) -> tuple[float, int]:
    """(cost of the calls up to the first LLM step after the `retrieval`-th retrieval, that step
    included; the number of LLM steps in that prefix)."""
    seen, end = -1, len(calls) - 1
    for i, c in enumerate(calls):
        if c.operation == "retrieval":
            seen += 1
        elif c.operation == "chat" and seen >= retrieval:
            end = i
            break
    prefix = calls[: end + 1]
    return sum(c.cost_usd for c in prefix), sum(1 for c in prefix if c.operation == "chat")


@dataclass
class TaskScore:
    id: str
    style: str
    question: str
    correct_shadow: bool
    correct_enforced: bool
    lost: bool
    cost_shadow: float
    cost_enforced: float
    oracle_cost: float
    oracle_steps: int  # LLM steps the oracle pays for
    avoidable: float
    saved: float
    captured: float
    retrievals_shadow: int  # retrieval calls sent upstream (task records)
    retrievals_enforced: int
    steps_shadow: int
    steps_enforced: int
    fruitless_shadow: int
    fruitless_enforced: int
    runaway: bool
    cache_hits_enforced: int
    exhausted: str | None  # the first limit the enforced run exhausted (task record)
    refused: dict[str, int]  # calls ragtoll refused in the enforced run, per limit (task record)
    stop: str  # how the enforced run ended
    sdk_retries_shadow: int
    sdk_retries_enforced: int
    llm_requests_seen: int  # LLM requests ragtoll saw in the enforced run (its call spans)
    note: str = ""
    # ragtoll's groundedness of the last answer (task records; None: no answer with a claim)
    grounded_shadow: float | None = None
    grounded_enforced: float | None = None


def score_task(shadow: TaskRun, enforced: TaskRun, gold: Gold) -> TaskScore:
    s_rec, e_rec = shadow.record, enforced.record
    s_ok = bool((s_rec.get("outcome") or {}).get("correct"))
    e_ok = bool((e_rec.get("outcome") or {}).get("correct"))
    cost_s, cost_e = float(s_rec["cost_usd"]), float(e_rec["cost_usd"])
    note = ""
    retrieval = evidence_retrieval(shadow.tool_log, gold)
    n_retrieval_spans = sum(1 for c in shadow.calls if c.operation == "retrieval")
    n_retrievals = sum(1 for c in shadow.tool_log if c.name == "retrieve" and c.error is None)
    if n_retrieval_spans != n_retrievals:
        raise RuntimeError(f"{shadow.task_id}: {n_retrieval_spans} retrieval spans, {n_retrievals} retrievals")
    span_total = sum(c.cost_usd for c in shadow.calls)
    if abs(span_total - cost_s) > 1e-6:
        raise RuntimeError(f"{shadow.task_id}: call spans cost {span_total}, task record {cost_s}")
    if not s_ok:
        oracle, steps, note = cost_s, int(s_rec["steps"]), "wrong in shadow: nothing counted avoidable"
    elif retrieval is None:
        oracle, steps, note = cost_s, int(s_rec["steps"]), "evidence never complete in shadow"
    else:
        oracle, steps = oracle_cost(shadow.calls, retrieval)
    avoidable = max(0.0, round(cost_s - oracle, 9))  # the records round cost to 1e-9 USD
    saved = cost_s - cost_e
    lost = s_ok and not e_ok
    captured = 0.0 if lost else min(max(saved, 0.0), avoidable)
    fs, fe = fruitless_flags(shadow.tool_log), fruitless_flags(enforced.tool_log)
    if enforced.answer is None:
        stop = f"no answer: {enforced.stopped}"
    elif enforced.tool_errors:
        stop = f"answered after a tool error: {enforced.tool_errors[0]}"
    elif enforced.stopped:
        stop = f"answered; {enforced.stopped}"
    else:
        stop = "answered"
    return TaskScore(
        shadow.task.id, shadow.task.style, shadow.task.question, s_ok, e_ok, lost, cost_s, cost_e,
        oracle, steps, avoidable, saved, captured,
        int(s_rec["retrieval_calls"]), int(e_rec["retrieval_calls"]), int(s_rec["steps"]), int(e_rec["steps"]),
        sum(fs), sum(fe), sum(fs) > RUNAWAY_FRUITLESS, int(e_rec.get("cache_hits", 0)),
        e_rec.get("exhausted"), dict(e_rec.get("rejections") or {}), stop, shadow.sdk_retries, enforced.sdk_retries,
        sum(1 for c in enforced.calls if c.operation == "chat"), note,
        s_rec.get("groundedness"), e_rec.get("groundedness"),
    )


@dataclass
class GroupScore:
    group: str
    tasks: int
    correct_shadow: int
    correct_enforced: int
    lost: list[str]
    cost_shadow: float  # per task
    cost_enforced: float
    oracle_cost: float
    retrievals_shadow: float
    retrievals_enforced: float
    avoidable: float  # total
    captured: float  # total
    captured_share: float | None
    saved_share: float | None  # (shadow - enforced) / shadow, all tasks
    runaways: int
    runaways_stopped: int  # within RUNAWAY_FRUITLESS fruitless retrievals
    max_fruitless_enforced: int  # over runaways
    sdk_retries: int  # enforced run
    sdk_retries_shadow: int
    refused: dict[str, int] = field(default_factory=dict)  # limit -> tasks with a call it refused
    grounded_shadow: float | None = None  # mean over the graded tasks (ragtoll's records)
    grounded_enforced: float | None = None
    graded: int = 0  # enforced tasks whose last answer was graded


def group(name: str, rows: Sequence[TaskScore]) -> GroupScore:
    n = len(rows)
    avoidable = sum(r.avoidable for r in rows)
    captured = sum(r.captured for r in rows)
    shadow_total = sum(r.cost_shadow for r in rows)
    runaways = [r for r in rows if r.runaway]
    refused: dict[str, int] = {}
    for r in rows:
        for dim in r.refused:
            refused[dim] = refused.get(dim, 0) + 1
    return GroupScore(
        name, n, sum(r.correct_shadow for r in rows), sum(r.correct_enforced for r in rows),
        [r.id for r in rows if r.lost],
        shadow_total / n, sum(r.cost_enforced for r in rows) / n, sum(r.oracle_cost for r in rows) / n,
        sum(r.retrievals_shadow for r in rows) / n, sum(r.retrievals_enforced for r in rows) / n,
        avoidable, captured, captured / avoidable if avoidable > 0 else None,
        (shadow_total - sum(r.cost_enforced for r in rows)) / shadow_total if shadow_total > 0 else None,
        len(runaways), sum(1 for r in runaways if r.fruitless_enforced <= RUNAWAY_FRUITLESS),
        max((r.fruitless_enforced for r in runaways), default=0),
        sum(r.sdk_retries_enforced for r in rows), sum(r.sdk_retries_shadow for r in rows), refused,
        _mean([r.grounded_shadow for r in rows]), _mean([r.grounded_enforced for r in rows]),
        sum(1 for r in rows if r.grounded_enforced is not None),
    )


def _mean(values: Sequence[float | None]) -> float | None:
    graded = [v for v in values if v is not None]
    return sum(graded) / len(graded) if graded else None


@dataclass
class Comparison:
    label: str
    styles: list[GroupScore]
    overall: GroupScore
    tasks: list[TaskScore]
    targets: dict[str, Any]


def compare(label: str, shadow: Sequence[TaskRun], enforced: Sequence[TaskRun], gold: Mapping[str, Gold]) -> Comparison:
    by_id = {r.task.id: r for r in enforced}
    rows = [score_task(s, by_id[s.task.id], gold[s.task.id]) for s in shadow]
    styles = [group(st, [r for r in rows if r.style == st]) for st in STYLES if any(r.style == st for r in rows)]
    overall = group("overall", rows)
    lost_share = len(overall.lost) / overall.tasks
    targets = {
        "no_lost_answers_per_style": {
            "pass": all(not g.lost for g in styles),
            "styles_losing": {g.group: g.lost for g in styles if g.lost},
        },
        "lost_overall_at_most_1pct": {"pass": lost_share <= TARGET_LOST_OVERALL, "lost": overall.lost,
                                      "share": lost_share},
        "captured_at_least_80pct": {"pass": overall.captured_share is None  # nothing was avoidable
                                    or overall.captured_share >= TARGET_CAPTURED,
                                    "share": overall.captured_share},
        "runaways_stopped_within_3": {
            "pass": overall.runaways_stopped == overall.runaways,
            "runaways": overall.runaways,
            "not_stopped": [r.id for r in rows if r.runaway and r.fruitless_enforced > RUNAWAY_FRUITLESS],
        },
        "no_sdk_retries": {"pass": overall.sdk_retries == 0, "retries": overall.sdk_retries},
    }
    return Comparison(label, styles, overall, rows, targets)


# --- output -----------------------------------------------------------------------------------------


def _money(v: float) -> str:
    return f"${v:.4f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def table(c: Comparison) -> str:
    header = ["style", "tasks", "correct: shadow -> enforced", "grounded: shadow -> enforced (graded)", "lost",
              "cost/task: shadow -> enforced (oracle)", "retrievals/task", "avoidable captured", "runaways stopped",
              "SDK retries"]
    body = []
    for g in [*c.styles, c.overall]:
        body.append([
            g.group, str(g.tasks), f"{g.correct_shadow} -> {g.correct_enforced}",
            f"{_pct(g.grounded_shadow)} -> {_pct(g.grounded_enforced)} ({g.graded})", str(len(g.lost)),
            f"{_money(g.cost_shadow)} -> {_money(g.cost_enforced)} ({_money(g.oracle_cost)})",
            f"{g.retrievals_shadow:.1f} -> {g.retrievals_enforced:.1f}",
            f"{_pct(g.captured_share)} of {_money(g.avoidable / g.tasks)}",
            f"{g.runaways_stopped}/{g.runaways}" if g.runaways else "-",
            str(g.sdk_retries),
        ])
    return render_table(header, body)


def short_stop(r: TaskScore) -> str:
    if not r.stop.startswith("no answer"):
        return r.stop.split(":")[0]
    if "fatal for this agent" in r.stop:
        return "no answer: the agent ends the task on a tool error"
    if "final call failed" in r.stop:
        return "no answer: its last call (tool_choice none) refused"
    if "HTTP 429" in r.stop:
        return "no answer: an LLM call refused"
    return r.stop[:80]


def details(c: Comparison) -> str:
    out = []
    lost = [r for r in c.tasks if r.lost]
    out.append(f"lost answers ({len(lost)}): correct in shadow, not in {c.label}" + (":" if lost else ""))
    for r in lost:
        refused = ", ".join(f"{k} x{v}" for k, v in r.refused.items()) or "nothing"
        timing = " [timing-dependent: a wall-clock limit]" if "max_latency_ms" in r.refused else ""
        out.append(f"  {r.id:<16} refused {refused}; {short_stop(r)}{timing}")
    refused = c.overall.refused
    out.append("tasks with a call refused, by limit: "
               + (", ".join(f"{k} {v}" for k, v in sorted(refused.items())) or "none"))
    runaways = [r for r in c.tasks if r.runaway]
    bad = [r for r in runaways if r.fruitless_enforced > RUNAWAY_FRUITLESS]
    out.append(f"runaways (>{RUNAWAY_FRUITLESS} fruitless retrievals in shadow): {len(runaways)}; "
               f"not stopped within {RUNAWAY_FRUITLESS}: {len(bad)}" + (":" if bad else ""))
    for style in dict.fromkeys(r.style for r in bad):
        rows = [r for r in bad if r.style == style]
        ends: dict[str, int] = {}
        for r in rows:
            ends[short_stop(r)] = ends.get(short_stop(r), 0) + 1
        ids = ", ".join(r.id for r in rows) if len(rows) <= 4 else f"{rows[0].id} .. {rows[-1].id}"
        out.append(f"  {style}: {len(rows)} ({ids}); fruitless retrievals "
                   f"{min(r.fruitless_enforced for r in rows)}-{max(r.fruitless_enforced for r in rows)}; "
                   + ", ".join(f"{k} ({v})" for k, v in ends.items()))
    t = c.targets
    lines = [
        ("0 lost answers on every style", t["no_lost_answers_per_style"]["pass"],
         ", ".join(f"{k} {len(v)}" for k, v in t["no_lost_answers_per_style"]["styles_losing"].items()) or "none lost"),
        ("<= 1% lost overall", t["lost_overall_at_most_1pct"]["pass"],
         f"{t['lost_overall_at_most_1pct']['share'] * 100:.1f}%"),
        (">= 80% of avoidable spend captured", t["captured_at_least_80pct"]["pass"],
         _pct(t["captured_at_least_80pct"]["share"])),
        ("every runaway stopped within 3 fruitless retrievals", t["runaways_stopped_within_3"]["pass"],
         f"{c.overall.runaways_stopped}/{c.overall.runaways}"),
        ("0 SDK retries", t["no_sdk_retries"]["pass"], str(t["no_sdk_retries"]["retries"])),
    ]
    out.append(f"targets ({c.label}):")
    out.extend(f"  {'PASS' if ok else 'FAIL'}  {name}: {what}" for name, ok, what in lines)
    return "\n".join(out) + "\n"


def as_json(c: Comparison) -> dict[str, Any]:
    return {
        "label": c.label,
        "styles": {g.group: asdict(g) for g in c.styles},
        "overall": asdict(c.overall),
        "targets": c.targets,
        "tasks": [asdict(r) for r in c.tasks],
    }
