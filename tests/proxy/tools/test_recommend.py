"""`ragtoll recommend`: its limits never cut a correct recorded task (checked by replaying each task's
calls through the budget core's own admit rule), the wall clock, the saving simulation, the YAML."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragtoll.proxy import config
from ragtoll.proxy.cli import main
from ragtoll.proxy.core.budget import Charge, Ledger, apply_charge, first_exceeded, to_units
from ragtoll.proxy.tasks.records import END_EXPLICIT, task_record
from ragtoll.proxy.tools import recommend, report

FIXTURE = pathlib.Path(__file__).parents[3] / "tests" / "fixtures" / "task_records.jsonl"
PROPERTY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- random tasks: calls through the budget core, then the record ragtoll would write --------------


@dataclass(frozen=True)
class Call:
    at_ms: int  # since the task's first call
    charge: Charge
    query: str | None


@dataclass(frozen=True)
class Task:
    task_id: str
    profile: str
    cls: str
    correct: bool | None
    calls: tuple[Call, ...]


def _call(kind: str, gap: int, tokens: int, out: int, nusd: int, query: int) -> tuple[str, int, Charge, str | None]:
    if kind == "llm":
        return kind, gap, Charge(steps=1, context_tokens=tokens, prompt_tokens=tokens, completion_reserve=out,
                                 cost_certain=nusd, cost_reserve=out * 10_000), None
    if kind == "retrieval":
        return kind, gap, Charge(retrieval_calls=1, cost_certain=nusd, query_key=f"q{query}"), f"q{query}"
    return kind, gap, Charge(rerank_calls=1, cost_certain=nusd), None


CALL = st.builds(_call, st.sampled_from(["llm", "retrieval", "rerank"]), st.integers(0, 3000),
                 st.integers(0, 9000), st.integers(1, 800), st.integers(0, 3_000_000), st.integers(0, 6))


@st.composite
def tasks(draw: st.DrawFn) -> list[Task]:
    out = []
    for i in range(draw(st.integers(1, 14))):
        at, calls = 0, []
        for n, (_, gap, charge, query) in enumerate(draw(st.lists(CALL, min_size=1, max_size=14))):
            at += gap if n else 0
            calls.append(Call(at, charge, query))
        out.append(Task(f"t{i}", draw(st.sampled_from(["tight", "bounded"])),
                        draw(st.sampled_from(["simple_fact", "multi_hop", ""])),
                        draw(st.sampled_from([True, True, False, None])), tuple(calls)))
    return out


T0 = 1_700_000_000_000


def replay(task: Task, limits: dict[str, int] | None = None) -> tuple[Ledger, str | None]:
    """The task's calls through core/budget (admit, then charge) until one is refused."""
    ledger = Ledger(task.task_id, task.profile, task.cls, started_ms=T0, last_ms=T0)
    queries: set[str] = set()
    for call in task.calls:
        new = call.query is not None and call.query not in queries
        if limits is not None and (dim := first_exceeded(limits, ledger, call.charge, new, T0 + call.at_ms)):
            return ledger, dim
        apply_charge(ledger, call.charge, new, T0 + call.at_ms)
        ledger.last_ms = T0 + call.at_ms
        queries.update([call.query] if call.query else [])
    return ledger, None


def records_of(ts: list[Task]) -> list[dict[str, object]]:
    out = []
    for t in ts:
        ledger, _ = replay(t)
        outcome = None if t.correct is None else {"correct": t.correct}
        raw = task_record(ledger, ended_ms=ledger.last_ms, end_reason=END_EXPLICIT, outcome=outcome)
        out.append(report.parse_record(raw, t.task_id))
    return out


def limits_from_yaml(text: str) -> dict[str, dict[str, int]]:
    """The printed section, parsed as ragtoll parses a config file, in the ledger's units."""
    parsed = config.parse(yaml.safe_load(text))
    return {name: to_units(p.limits()) for name, p in parsed.budgets.profiles.items()}


# ---- the promise --------------------------------------------------------------------------------


def profile_of(t: Task, text: str, by: str) -> str:
    """The profile ragtoll would pick for `t` under the printed section (by class: its class's)."""
    budgets = config.parse(yaml.safe_load(text)).budgets
    return budgets.classes.get(t.cls, budgets.default_profile) if by == "class" else t.profile


@pytest.mark.slow
@PROPERTY
@given(tasks(), st.floats(1.0, 2.0), st.booleans(), st.sampled_from(["profile", "class"]))
def test_recommended_limits_admit_every_call_of_every_task_not_judged_wrong(
    ts: list[Task], headroom: float, latency: bool, by: str
) -> None:
    advice = recommend.recommend(records_of(ts), 100, headroom, latency, by)
    text = recommend.format_advice(advice, 100, headroom)
    limits = limits_from_yaml(text)
    for t in ts:
        if t.correct is not False:
            profile = profile_of(t, text, by)
            assert replay(t, limits[profile])[1] is None, (t, limits[profile])
    assert "0 of them correct" in text


@pytest.mark.slow
@PROPERTY
@given(tasks(), st.floats(5, 100), st.booleans())
def test_a_tighter_percentile_names_every_correct_task_it_cuts(ts: list[Task], pct: float, latency: bool) -> None:
    advice = recommend.recommend(records_of(ts), pct, 1.0, latency)
    text = recommend.format_advice(advice, pct)
    limits = limits_from_yaml(text)
    simulated = {c.task_id for a in advice for c in a.cuts}
    refused = {t.task_id for t in ts if replay(t, limits[t.profile])[1] is not None}
    assert refused <= simulated  # a task the core would refuse is never missing from the simulation
    listed = text.split("budgets:")[0]
    for t in ts:
        if t.correct and t.task_id in refused:
            assert f"#   {t.task_id} (correct):" in listed


# ---- the saving simulation ----------------------------------------------------------------------


def _rec(task_id: str, correct: bool | None, **used: float) -> dict[str, object]:
    raw = {"task_id": task_id, "profile": "p", "outcome": None if correct is None else {"correct": correct}}
    return report.parse_record(raw | used, task_id)


def test_saving_is_what_cut_tasks_spend_past_their_first_limit() -> None:
    records = [
        _rec("ok1", True, retrieval_calls=4, unique_queries=2, steps=5, cost_usd=0.010),
        _rec("ok2", True, retrieval_calls=2, unique_queries=4, steps=3, cost_usd=0.008),
        # a loop judged wrong: 10 retrievals and 5 unique queries against limits of 4 and 4
        _rec("loop", False, retrieval_calls=10, unique_queries=5, steps=12, cost_usd=0.020),
    ]
    (advice,) = recommend.recommend(records)
    assert {lim.dimension: lim.value for lim in advice.limits}["max_retrieval_calls"] == 4
    (cut,) = advice.cuts
    # unique queries would stop it after 4/5 of its work, steps after 5/12, retrievals after 4/10,
    # cost after 1/2 (so no cost limit: it would save nothing more): the first limit it meets is
    # the one that leaves the least done
    assert (cut.task_id, cut.dimension, cut.used, cut.limit) == ("loop", "max_retrieval_calls", 10, 4)
    assert cut.done == pytest.approx(0.4) and cut.saved_usd == pytest.approx(0.012)
    text = recommend.format_advice([advice])
    assert "expected saving on these records: $0.0120 of $0.0380 (31.6%), 1 task(s) cut, 0 of them correct" in text
    assert "approximated by proportion" in text


def test_money_limits_only_where_they_cut_more_than_the_counts() -> None:
    records = [
        _rec("a", True, steps=3, context_tokens=1000, cost_usd=0.004),
        _rec("b", False, steps=3, context_tokens=9000, cost_usd=0.020),  # same counts, far more tokens
    ]
    (advice,) = recommend.recommend(records)
    dims = [lim.dimension for lim in advice.limits]
    assert dims[0] == "max_steps" and "max_context_tokens" in dims
    # once tokens cut "b" at 1/9 of its work, a cost limit (0.004, 1/5 of it) would stop it no earlier
    assert "max_cost_usd" not in dims
    assert any(note.startswith("max_cost_usd: 0.004 would stop no task earlier") for note in advice.left_out)


def test_a_percentile_tightens_only_the_limits_that_refuse_a_retrieval() -> None:
    records = [_rec(f"t{i}", True, retrieval_calls=i, steps=2 * i, completion_tokens=100 * i, cost_usd=0.001 * i)
               for i in range(1, 11)]
    (advice,) = recommend.recommend(records, 50)
    limits = {lim.dimension: lim.value for lim in advice.limits}
    assert limits["max_retrieval_calls"] == 6  # p50 of 1..10 = 5.5, rounded up
    assert limits["max_steps"] == 20  # a refused LLM call is a lost answer: the most stays
    assert "max_completion_tokens" not in limits and "max_cost_usd" not in limits
    assert [c.task_id for c in advice.cuts] == ["t7", "t8", "t9", "t10"]
    assert all(c.dimension == "max_retrieval_calls" and c.correct for c in advice.cuts)


def test_tasks_judged_wrong_after_a_refusal_are_called_out() -> None:
    cut = _rec("c", False, steps=8) | {"rejections": {"max_steps": 1}, "exhausted": "max_steps"}
    (advice,) = recommend.recommend([_rec("a", True, steps=3), cut])
    (warning,) = [n for n in advice.left_out if n.startswith("WARNING")]
    assert "1 task(s) judged wrong after ragtoll refused a call (c)" in warning
    (advice,) = recommend.recommend([_rec("a", True, steps=3), _rec("b", False, steps=8)])
    assert not [n for n in advice.left_out if n.startswith("WARNING")]


def test_progress_limits_come_from_the_policy_not_from_final_streaks() -> None:
    """Records carry a task's final stall streak, not its longest: no stall value is derived from
    them; the profile gets the embedded default's progress policy instead (or none, if asked)."""
    recs = [_rec("a", True, retrieval_calls=5, stalled_retrievals=4)]
    (advice,) = recommend.recommend(recs)
    assert "max_stalled_retrievals" not in [lim.dimension for lim in advice.limits]
    assert dict(advice.policy) == {"max_stalled_retrievals": 1, "max_fruitless_retrievals": 3,
                                   "on_exhausted": "finish", "on_exhausted_retrieval": "empty"}
    settings = config.parse(yaml.safe_load(recommend.format_advice([advice])))
    profile = settings.budgets.profiles[advice.profile]
    assert (profile.max_stalled_retrievals, profile.on_exhausted) == (1, "finish")
    (bare,) = recommend.recommend(recs, progress=False)
    assert bare.policy == () and "max_stalled_retrievals" not in recommend.format_advice([bare])


# ---- the wall clock -----------------------------------------------------------------------------


def test_latency_is_omitted_by_default_and_never_below_p99_times_the_margin() -> None:
    records = [_rec(f"t{i}", True, steps=1, duration_ms=ms) for i, ms in enumerate([100, 200, 300])]
    (advice,) = recommend.recommend(records)
    assert "max_latency_ms" not in [lim.dimension for lim in advice.limits]
    assert any(n.startswith("max_latency_ms: omitted, machine-dependent") for n in advice.left_out)
    (advice,) = recommend.recommend(records, latency=True)
    lim = {lim.dimension: lim for lim in advice.limits}["max_latency_ms"]
    assert lim.value == 900  # p99 of the durations 298 ms x 3 = 894, rounded up
    assert "MACHINE-DEPENDENT" in recommend.format_advice([advice])
    # a tighter percentile never takes the wall clock below that floor
    (tight,) = recommend.recommend(records, 10, latency=True)
    assert {lim.dimension: lim.value for lim in tight.limits}["max_latency_ms"] == 900
    # nor below a correct task that took longer than the floor
    slow = [*records, _rec("slow", True, steps=1, duration_ms=5000)]
    (advice,) = recommend.recommend(slow, latency=True)
    assert {lim.dimension: lim.value for lim in advice.limits}["max_latency_ms"] > 5000
    assert not advice.cuts


# ---- the output is config -----------------------------------------------------------------------


def test_output_passes_check_config(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recommend", str(FIXTURE), "--latency"]) == 0
    out = capsys.readouterr().out
    path = tmp_path / "ragtoll.yaml"
    path.write_text(out)
    assert main(["check-config", str(path)]) == 0
    profiles = yaml.safe_load(out)["budgets"]["profiles"]
    assert set(profiles) == {"bounded", "tight"}
    # the fixture's correct tight tasks used at most 3 retrieval calls; t5 (wrong) used 8
    assert profiles["tight"]["max_retrieval_calls"] == 3
    assert "t5 (wrong): max_context_tokens 9000 > 3000" in out
    # by class: a profile per class, each class mapped to it
    capsys.readouterr()
    assert main(["recommend", str(FIXTURE), "--by", "class"]) == 0
    path.write_text(out := capsys.readouterr().out)
    assert main(["check-config", str(path)]) == 0
    budgets = yaml.safe_load(out)["budgets"]
    assert budgets["classes"] == {c: c for c in budgets["profiles"]} and "simple_fact" in budgets["classes"]


def test_tiny_cost_limits_print_without_an_exponent() -> None:
    records = [_rec("a", True, steps=1, cost_usd=0.0000123456), _rec("b", False, steps=1, cost_usd=0.5)]
    (advice,) = recommend.recommend(records)
    text = recommend.format_advice([advice])
    assert yaml.safe_load(text)["budgets"]["profiles"]["p"]["max_cost_usd"] == pytest.approx(0.00001235)
    assert config.parse(yaml.safe_load(text)).budgets.profiles["p"].max_cost_usd == pytest.approx(0.00001235)


def test_bad_arguments_name_the_fix() -> None:
    with pytest.raises(report.ReportError, match="headroom"):
        recommend.recommend([], 100, 0.9)
    with pytest.raises(report.ReportError, match="percentile"):
        recommend.recommend([], 0)
    assert "profiles: {}" in recommend.format_advice(recommend.recommend([]))
