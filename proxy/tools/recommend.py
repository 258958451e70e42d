"""`ragtoll recommend`: budget limits per profile under which no correctly answered task is cut.

Pure: `recommend` takes parsed task records (report.read_jsonl / read_stream) and returns one
`Advice` per profile; `simulate` replays limits over records (which tasks they cut, where, and
what those tasks spent past that point); `format_advice` prints a complete `budgets:` section
that `ragtoll check-config` accepts.

The rule. The *basis* of a profile is every task not judged wrong (judged correct, or never
judged: it may have been right). Each limit is the most a basis task used, rounded up, so every
basis task stays admitted (a limit of N admits N: core/budget.py). A tighter `--percentile`
applies to the limits that refuse a retrieval or rerank only (unique queries, retrieval and rerank
calls: the agent keeps its evidence and may still answer), and the output lists exactly the
correct tasks it would cut; limits that refuse an LLM call (steps, calls, tokens, cost) stay at
the most a basis task used, since a refused LLM call costs most agents their answer.

Preference. Counts of work are always proposed; tokens and cost only where the simulation says
they would save more than the counts (a money limit that stops nothing earlier is noise, and it
depends on prices and on in-flight reservations). The
wall clock (`max_latency_ms`) depends on the machine and its load: omitted unless asked for, and
then never below the basis tasks' p99 x LATENCY_MARGIN.

Progress. The counts above are ceilings; what stops a loop is the progress policy, which records
cannot tune (a runaway that answered correctly after 15 rewordings looks, in its record, like a
task that needed them). Each profile gets the embedded default's policy (PROGRESS_POLICY: stall
and fruitless limits with `on_exhausted: finish` and `on_exhausted_retrieval: empty`): a task it
stops is made to answer from its evidence, not refused. Its effect on answers is measured by
bench/eval_agents, not shown from records; `progress=False` leaves it out.

The saving is simulated per task from its record's totals: a task cut by a limit of L on a
dimension it used U of is taken to stop after L/U of its work (its spend assumed to grow evenly
with that counter), the first limit it meets decides, and it saves its cost past that point.
Records carry totals, not per-call timelines, so the figure is an approximation, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ..config import DEFAULT_PROFILES
from ..core.budget import NANO
from .report import ReportError, format_usd, percentile

# record key -> dimension, in order of preference. First the counts that refuse a retrieval or
# rerank: the agent keeps the evidence it holds and may still answer (the only ones --percentile
# tightens). Then the counts that refuse an LLM call too, the answering one included.
RETRIEVAL_COUNTS = (
    ("unique_queries", "max_unique_queries"),
    ("retrieval_calls", "max_retrieval_calls"),
    ("rerank_calls", "max_rerank_calls"),
)
LLM_COUNTS = (
    ("steps", "max_steps"),
    ("calls", "max_calls"),
)
AMOUNTS = (
    ("context_tokens", "max_context_tokens"),
    ("completion_tokens", "max_completion_tokens"),
    ("cost_usd", "max_cost_usd"),
)
LATENCY = ("duration_ms", "max_latency_ms")
LATENCY_MARGIN = 3.0  # a wall-clock limit is at least p99 of the basis tasks' durations x this
LATENCY_PERCENTILE = 99.0
UNCLASSIFIED = "unclassified"  # by class: the profile of tasks without a class (the default profile)
SHOWN_CUTS = 5  # cut tasks listed per profile besides the correct ones (those are all listed)
# the embedded default profile's progress limits and what happens when one is reached
PROGRESS_POLICY: tuple[tuple[str, object], ...] = tuple(
    (key, getattr(DEFAULT_PROFILES["bounded"], key))
    for key in ("max_stalled_retrievals", "max_fruitless_retrievals", "on_exhausted", "on_exhausted_retrieval"))
APPROXIMATION = "approximated by proportion: records carry per-task totals, not per-call timelines"


@dataclass(frozen=True)
class Limit:
    dimension: str
    key: str  # the record field it limits
    value: float
    most: float  # the most a basis task used
    most_task: str  # ... which task
    note: str = ""


@dataclass(frozen=True)
class Cut:
    """A recorded task the limits would have stopped, at its first limit."""

    task_id: str
    profile: str
    correct: bool | None  # None: never judged
    dimension: str
    used: float
    limit: float
    done: float  # share of the task's work done when stopped (approximation)
    cost_usd: float
    saved_usd: float  # what it spent past that point


@dataclass(frozen=True)
class Advice:
    profile: str
    tasks: int
    basis: int
    basis_label: str  # "7 correct + 1 unjudged"
    limits: tuple[Limit, ...]
    left_out: tuple[str, ...]  # comment lines: dimensions not proposed, and why
    cuts: tuple[Cut, ...]
    cost_usd: float  # what the profile's tasks spent
    cls: str | None = None  # the query class the profile is for (recommend by class)
    policy: tuple[tuple[str, object], ...] = ()  # the progress policy (PROGRESS_POLICY), or none


def _round_up(value: float, dimension: str) -> float:
    """The smallest tidy value >= `value`: whole units; cost to 4 significant digits; latency to 2."""
    if value <= 0:
        return 0.0
    if dimension == "max_cost_usd":  # in whole nano-USD, as records and the ledger hold it
        nusd = math.ceil(round(value * NANO, 3))
        step: int = 10 ** max(0, len(str(nusd)) - 4)
        return math.ceil(nusd / step) * step / NANO
    if dimension == "max_latency_ms":
        step = 10 ** max(0, math.floor(math.log10(value)) - 1)
        return float(math.ceil(value / step) * step)
    return float(math.ceil(value - 1e-9))


def admits(dimension: str, used: float, limit: float) -> bool:
    """Whether a task that used `used` stays admitted under `limit` (core/budget.first_exceeded:
    counts, tokens and cost admit up to the limit; the deadline refuses once it is reached)."""
    return used < limit if dimension == "max_latency_ms" else used <= limit


def _correct(rec: Mapping[str, Any]) -> bool | None:
    outcome = rec.get("outcome")
    return None if outcome is None else bool(outcome["correct"])


def _basis(recs: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], str]:
    basis = [r for r in recs if _correct(r) is not False]
    correct = sum(1 for r in basis if _correct(r))
    unjudged = len(basis) - correct
    label = f"{correct} correct" + (f" + {unjudged} unjudged" if unjudged else "")
    return basis, label


def _limit(key: str, dim: str, basis: Sequence[Mapping[str, Any]], pct: float, headroom: float) -> Limit | None:
    used = [float(r[key]) for r in basis]
    if not used or max(used) <= 0:
        return None
    top = max(basis, key=lambda r: float(r[key]))
    value = percentile(used, pct) * headroom
    if dim == "max_latency_ms":  # the deadline refuses once reached: one past the slowest task
        value = max(value, percentile(used, LATENCY_PERCENTILE) * LATENCY_MARGIN, max(used) + 1)
        note = f"p{LATENCY_PERCENTILE:g} {percentile(used, LATENCY_PERCENTILE):.0f} ms x {LATENCY_MARGIN:g}"
        return Limit(dim, key, _round_up(value, dim), max(used), str(top["task_id"]), note)
    return Limit(dim, key, _round_up(value, dim), max(used), str(top["task_id"]))


def simulate(records: Iterable[Mapping[str, Any]], limits: Sequence[Limit]) -> list[Cut]:
    """The tasks `limits` would stop, each at the first limit it meets (see the module docstring)."""
    cuts = []
    for rec in records:
        first: tuple[float, Limit] | None = None
        for lim in limits:
            used = float(rec[lim.key])
            if admits(lim.dimension, used, lim.value):
                continue
            done = min(1.0, lim.value / used)
            if first is None or done < first[0]:
                first = (done, lim)
        if first is not None:
            done, lim = first
            cost = float(rec["cost_usd"])
            cuts.append(Cut(str(rec["task_id"]), str(rec.get("profile") or "-"), _correct(rec), lim.dimension,
                            float(rec[lim.key]), lim.value, done, cost, cost * (1 - done)))
    return cuts


def _saved(cuts: Iterable[Cut]) -> float:
    return sum(c.saved_usd for c in cuts)


def advise(name: str, recs: Sequence[Mapping[str, Any]], pct: float = 100.0, headroom: float = 1.0,
           latency: bool = False, progress: bool = True) -> Advice:
    """One profile's limits (see the module docstring for the rule and the preference)."""
    basis, label = _basis(recs)
    limits = [lim for key, dim in RETRIEVAL_COUNTS if (lim := _limit(key, dim, basis, pct, headroom))]
    limits += [lim for key, dim in LLM_COUNTS if (lim := _limit(key, dim, basis, 100, headroom))]
    left_out = []
    refused = [str(r["task_id"]) for r in recs
               if _correct(r) is False and (r.get("rejections") or r.get("exhausted"))]
    if refused:
        left_out.append(f"WARNING: {len(refused)} task(s) judged wrong after ragtoll refused a call "
                        f"({', '.join(refused[:SHOWN_CUTS])}{' ...' if len(refused) > SHOWN_CUTS else ''}): "
                        "the refusal may be why, yet they are not in the basis; recommend from shadow records")
    for key, dim in AMOUNTS:
        lim = _limit(key, dim, basis, 100, headroom)
        if lim is None:
            continue
        if _saved(simulate(recs, [*limits, lim])) > _saved(simulate(recs, limits)) + 1e-12:
            limits.append(lim)
        else:
            left_out.append(f"{dim}: {_value(lim)} would stop no task earlier than the counts above")
    lim = _limit(*LATENCY, basis, 100, headroom)
    if lim is not None and latency:
        limits.append(lim)
    elif lim is not None:
        left_out.append(f"max_latency_ms: omitted, machine-dependent (--latency proposes {_value(lim)}, "
                        f"at least {lim.note})")
    cost = sum(float(r["cost_usd"]) for r in recs)
    return Advice(name, len(recs), len(basis), label, tuple(limits), tuple(left_out),
                  tuple(simulate(recs, limits)), cost, policy=PROGRESS_POLICY if progress else ())


def recommend(records: Iterable[Mapping[str, Any]], percentile_: float = 100.0, headroom: float = 1.0,
              latency: bool = False, by: str = "profile", progress: bool = True) -> list[Advice]:
    """Limits over each group's basis, sorted by name. `by="profile"`: per profile (records without
    one are left out); `by="class"`: a profile per query class (format_advice maps each class to
    it), tasks without a class under UNCLASSIFIED."""
    if not 0 < percentile_ <= 100:
        raise ReportError(f"percentile {percentile_!r} must be in (0, 100]")
    if not headroom >= 1:
        raise ReportError(f"headroom {headroom!r} must be >= 1 (a limit below what a task used cuts it)")
    if by not in ("profile", "class"):
        raise ReportError(f"cannot recommend by {by!r}; expected profile or class")
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for rec in records:
        groups.setdefault(str(rec.get(by) or "-"), []).append(rec)
    if by == "profile":
        groups.pop("-", None)
    elif "-" in groups:
        groups[UNCLASSIFIED] = groups.pop("-") + groups.get(UNCLASSIFIED, [])
    advice = [advise(name, groups[name], percentile_, headroom, latency, progress) for name in sorted(groups)]
    return [replace(a, cls=a.profile) for a in advice] if by == "class" else advice


# ---- output -------------------------------------------------------------------------------------


def _value(lim: Limit) -> str:
    """Exact and plain (no exponent: YAML would read `1e-05` as a string)."""
    if lim.dimension == "max_cost_usd":
        return f"{lim.value:.9f}".rstrip("0").rstrip(".")
    return str(round(lim.value))


def _yaml_key(name: str) -> str:
    return name if name.replace("_", "").replace("-", "").isalnum() else orjson.dumps(name).decode()


def _rule(percentile_: float, headroom: float) -> str:
    times = f" x {headroom:g}" if headroom != 1 else ""
    if percentile_ >= 100:
        return f"the most a task not judged wrong used{times}"
    return (f"p{percentile_:g} of what tasks not judged wrong used{times} for the limits that refuse a "
            f"retrieval or rerank; the most for the rest")


def _cut_line(c: Cut) -> str:
    verdict = {True: "correct", False: "wrong", None: "unjudged"}[c.correct]
    used = f"{c.used:g}" if c.dimension == "max_cost_usd" else f"{c.used:.0f}"
    return (f"#   {c.task_id} ({verdict}): {c.dimension} {used} > {c.limit:g}, stopped after ~{c.done:.0%} "
            f"of its work, saves {format_usd(c.saved_usd)} of {format_usd(c.cost_usd)}")


def format_advice(advice: Sequence[Advice], percentile_: float = 100.0, headroom: float = 1.0) -> str:
    """A `budgets:` section: each profile's limits, commented with the most a basis task used and
    the simulated saving; every correct task a tighter percentile cuts is listed."""
    total = sum(a.cost_usd for a in advice)
    cuts = [c for a in advice for c in a.cuts]
    lost = [c for c in cuts if c.correct]
    lines = [
        f"# ragtoll recommend: per {'query class' if any(a.cls for a in advice) else 'profile'}, "
        + _rule(percentile_, headroom),
        f"# expected saving on these records: {format_usd(_saved(cuts))} of {format_usd(total)}"
        + (f" ({_saved(cuts) / total:.1%})" if total > 0 else "")
        + f", {len(cuts)} task(s) cut, {len(lost)} of them correct",
        f"# ({APPROXIMATION})",
    ]
    if lost:
        lines.append(f"# CORRECT TASKS THESE LIMITS CUT ({len(lost)}): drop --percentile to keep them")
        lines += [_cut_line(c) for c in lost]
    lines.append("budgets:")
    names = [a.profile for a in advice]
    if UNCLASSIFIED in names and any(a.cls for a in advice):
        lines.append(f"  default_profile: {UNCLASSIFIED}  # tasks without a class")
    elif advice:
        default = max(advice, key=lambda a: a.tasks).profile
        lines.append(f"  default_profile: {_yaml_key(default)}  # the profile most tasks used")
    classes = [a.cls for a in advice if a.cls and a.cls != UNCLASSIFIED]
    if classes:
        lines.append("  classes: {" + ", ".join(f"{_yaml_key(c)}: {_yaml_key(c)}" for c in classes) + "}")
    lines.append("  profiles:" if advice else "  profiles: {}  # no task records with a profile")
    for a in advice:
        lines += _profile_lines(a)
    return "\n".join(lines) + "\n"


def _profile_lines(a: Advice) -> list[str]:
    head = (f"    {_yaml_key(a.profile)}:  # {a.tasks} task(s), basis {a.basis_label}; cuts {len(a.cuts)}, "
            f"saves {format_usd(_saved(a.cuts))} of {format_usd(a.cost_usd)}")
    lines = [head]
    if not a.limits and not a.policy:
        lines.append("      {}  # nothing to limit: no basis task used anything")
    for lim in a.limits:
        cut = [c for c in a.cuts if c.dimension == lim.dimension]
        most = f"{lim.most:g}" if lim.dimension == "max_cost_usd" else f"{lim.most:.0f}"
        extra = f"; MACHINE-DEPENDENT: at least {lim.note}" if lim.note else ""
        lines.append(f"      {lim.dimension}: {_value(lim)}".ljust(36)
                     + f"# most used: {most} ({lim.most_task}); stops {len(cut)} first, saves "
                     f"{format_usd(_saved(cut))}{extra}")
    if a.policy:
        lines.append("      # progress policy (the embedded default's): a task stuck by these answers from its evidence")
        lines += [f"      {key}: {value}" for key, value in a.policy]
    lines += [f"      # {note}" for note in a.left_out]
    others = [c for c in a.cuts if not c.correct]
    lines += ["      " + _cut_line(c) for c in others[:SHOWN_CUTS]]
    if len(others) > SHOWN_CUTS:
        lines.append(f"      # ... and {len(others) - SHOWN_CUTS} more task(s) judged wrong or unjudged")
    return lines
