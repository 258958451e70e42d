"""`ragtoll demo` end to end on the shortened workload: real sockets, the real openai SDK, ragtoll's
task records as the only source of the numbers, traces exported over OTLP."""

from __future__ import annotations

import io
import pathlib
import threading

import pytest
from ragtoll.proxy.cli import main
from ragtoll.proxy.tools import report
from ragtoll.proxy.tools.demo import corpus, runner, scoring
from support.otlp import OtlpReceiver
from support.servers import serve_in_thread


@pytest.fixture(scope="module")
def demo(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[runner.DemoResult, str, pathlib.Path, OtlpReceiver]:
    records = tmp_path_factory.mktemp("demo") / "records"
    receiver = OtlpReceiver()
    stop = threading.Event()
    stop.set()  # --keep-running returns at once
    out = io.StringIO()
    with serve_in_thread(receiver) as otlp:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_METRICS_EXPORTER": "none"}
        result = runner.run_demo(
            quick=True, keep_running=True, records=str(records), env=env, out=out, stop=stop
        )
    return result, out.getvalue(), records, receiver


@pytest.mark.slow
def test_printed_table_is_computed_from_ragtolls_task_records(demo: tuple) -> None:
    result, out, records, _ = demo
    shadow = report.read_jsonl(str(records / "shadow.jsonl"))
    enforced = report.read_jsonl(str(records / "enforced.jsonl"))
    kept = shadow + enforced
    assert len(shadow) == len(enforced) == len(corpus.load_workload(quick=True))
    assert all("-shadow-" in r["task_id"] for r in shadow)
    table, _, _ = scoring.compare(shadow, enforced)
    assert table in out  # the printed numbers are exactly the records' numbers
    assert all(r["end_reason"] == "explicit" and r["outcome"] is not None for r in kept)
    # the outcome each record carries is the demo's judgement of that task against gold
    judged = {r.task_id: r.correct for r in result.shadow.runs + result.enforced.runs}
    assert {r["task_id"]: r["outcome"]["correct"] for r in kept} == judged


def test_budgets_and_cache_meet_the_targets(demo: tuple) -> None:
    result, _, _, _ = demo
    _, shadow, enforced = scoring.compare(result.shadow.records, result.enforced.records)
    assert enforced.retrieval_calls <= 0.6 * shadow.retrieval_calls
    assert enforced.cost_usd <= 0.6 * shadow.cost_usd
    assert shadow.accuracy is not None and enforced.accuracy is not None
    assert enforced.accuracy >= shadow.accuracy - 0.02
    if result.cache.startswith("evidence cache on"):  # build_app wires the evidence stage
        # the corroborating keyword searches are verified paraphrases of the question: served from cache
        assert (enforced.cache_hit_rate or 0) >= 0.2, (
            f"cache hit rate {enforced.cache_hit_rate}: retrieval evidence is not being cached (a retrieval "
            "answer with content-length is read whole by Pipeline._send_buffered, which skips the stages' "
            "on_chunk hooks, so EvidenceStage files an empty body)"
        )
        assert shadow.cache_hit_rate == 0
    assert shadow.exhaustion_rate == 0  # shadow mode rejects nothing ...
    assert any(r.get("would_reject") for r in result.shadow.records)  # ... but records what it would have


def test_the_lean_agent_runs_too_and_keeps_its_answers(demo: tuple) -> None:
    """Both sides: the lean agent (answers as soon as its evidence suffices) on the same tasks, each
    run on its own ragtoll; its table comes from its own records, its accuracy is unchanged, and the
    tasks whose cost moved are named."""
    result, out, records, _ = demo
    shadow = report.read_jsonl(str(records / "shadow-lean.jsonl"))
    enforced = report.read_jsonl(str(records / "enforced-lean.jsonl"))
    assert len(shadow) == len(enforced) == len(corpus.load_workload(quick=True))
    table, before, after = scoring.compare(shadow, enforced)
    assert table in out and "the lean agent" in out
    assert after.accuracy is not None and before.accuracy is not None and after.accuracy >= before.accuracy
    assert before.steps < scoring.compare(result.shadow.records, result.enforced.records)[1].steps  # leaner
    assert "cost unchanged on " in out


def test_the_context_landfill_ragtoll_measured_is_printed(demo: tuple) -> None:
    result, out, _, _ = demo
    assert set(result.landfill) == {"shadow", "enforced", "shadow-lean", "enforced-lean"}
    for label, (evidence, resent) in result.landfill.items():
        assert 0 <= resent <= evidence
        assert f"{label:<14} {evidence:>8} evidence tokens, {resent:>8} resent" in out
    assert result.landfill["shadow"][1] > 0  # the corroborating agent resends its evidence every step


def test_runaway_task_is_stopped_by_its_budget_with_a_clear_error(demo: tuple) -> None:
    result, out, _, _ = demo
    (run,) = [r for r in result.enforced.runs if r.task.kind == "runaway"]
    (rec,) = [r for r in result.enforced.records if r["task_id"] == run.task_id]
    (shadow_rec,) = [r for r in result.shadow.records if r["task_id"].endswith(run.task.id)]
    assert rec["exhausted"] is not None
    assert any(rec["exhausted"] in e and "HTTP 429" in e and run.task_id in e for e in run.tool_errors)
    assert rec["steps"] < shadow_rec["steps"] and rec["cost_usd"] < shadow_rec["cost_usd"] / 2
    assert f"runaway task {run.task.id}" in out and f"exhausted {rec['exhausted']}" in out


def test_no_chunk_reaches_a_principal_without_access(demo: tuple) -> None:
    result, out, _, receiver = demo
    assert result.acl_checked > 0 and result.acl_violations == []
    assert f"ACL audit: {result.acl_checked} chunks" in out
    # bob asked for the staff-only escalation contact alice got: he gets an abstention, not the name
    for res in (result.shadow, result.enforced):
        bob = [r for r in res.runs if r.task.kind == "access" and r.task.principal == "bob"]
        assert bob and all(r.correct and "Tomas Berg" not in (r.answer or "") for r in bob)
    if result.cache.startswith("evidence cache on"):  # alice's cached evidence was refused to bob
        (bob_run,) = [
            r for r in result.enforced.runs if r.task.kind == "access" and r.task.principal == "bob"
        ]
        reasons = [
            s["attributes"].get("ragtoll.cache.reason")
            for s in receiver.spans
            if s["attributes"].get("ragtoll.task.id") == bob_run.task_id
        ]
        assert "acl:denied" in reasons, (
            f"bob's lookups: {reasons} (expected alice's entry refused: acl:denied)"
        )


def test_audit_flags_a_chunk_outside_the_principals_groups() -> None:
    chunks = corpus.load_corpus()
    staff = next(c for c in chunks if c.groups == ("staff",))
    checked, bad = scoring.audit_acl(
        [("t1", "bob", [staff.id, "no-such-chunk"]), ("t2", "alice", [staff.id])], chunks
    )
    assert checked == 3 and [(b.task, b.chunk) for b in bad] == [("t1", staff.id), ("t1", "no-such-chunk")]


def test_judge_uses_gold_answers() -> None:
    assert scoring.judge("The refund window for annual plans is 30 days. [billing-policy#1]", "30 days")
    assert not scoring.judge("The refund window for monthly plans is 7 days.", "30 days")
    assert scoring.judge("I could not find a supported answer in the documents available to me.", None)
    assert not scoring.judge("The escalation contact for Vault is Tomas Berg.", None)
    assert not scoring.judge(None, None)


def test_traces_reach_the_otlp_endpoint_one_trace_per_task(demo: tuple) -> None:
    result, _, _, receiver = demo
    task_id = result.enforced.runs[0].task_id
    agent = [
        s
        for s in receiver.spans
        if s["attributes"].get("ragtoll.task.id") == task_id
        and s["resource"].get("service.name") == "ragtoll-demo-agent"
    ]
    assert len(agent) == 1
    proxied = [
        s
        for s in receiver.spans
        if s["trace_id"] == agent[0]["trace_id"] and s["resource"].get("service.name") == "ragtoll"
    ]
    assert len(proxied) >= 3  # the LLM, retrieval and rerank calls of that task, under the agent's trace


def test_keep_running_prints_where_to_poke(demo: tuple) -> None:
    _, out, _, _ = demo
    assert "stays up at http://127.0.0.1:" in out and "OPENAI_BASE_URL=" in out


def test_cli_demo_help_lists_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "--keep-running" in capsys.readouterr().out


@pytest.mark.slow
def test_demo_figure_is_drawn_from_the_records_it_kept(demo: tuple, tmp_path: pathlib.Path) -> None:
    from PIL import Image
    from ragtoll.proxy.tools import report_compare

    result, _, records, _ = demo
    path = tmp_path / "demo.png"
    runner.write_plot(result, str(path))
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width > 1200 and image.height > 900
    drawn = [
        report_compare.Run("shadow", result.shadow.records),
        report_compare.Run("enforced", result.enforced.records),
    ]
    kept = [
        report_compare.Run(n, report.read_jsonl(str(records / f"{n}.jsonl"))) for n in ("shadow", "enforced")
    ]
    # `ragtoll report DIR/shadow.jsonl DIR/enforced.jsonl --by class` draws the same panels
    assert report_compare.means(drawn, "class", "cost_usd") == report_compare.means(kept, "class", "cost_usd")
    # the demo's profiles give every class its limits, drawn over the bars
    limits = report_compare.group_limits(drawn, "class", runner.PROFILES)
    assert (
        limits["simple_fact"]["max_retrieval_calls"] == 1 and limits["investigative"]["max_cost_usd"] == 0.15
    )
    # the costliest task is the runaway, matched across the runs, stopped where its record says
    (runaway,) = [r for r in result.enforced.records if r["task_id"].endswith("-q08")]
    top = report_compare.runaways(drawn, "class", top=1)[0]
    assert (top.key, top.group) == ("q08", "investigative")
    assert top.stopped["enforced"] == runaway["exhausted"] and top.stopped["shadow"].startswith("would: ")
    assert top.cost_usd["enforced"] == runaway["cost_usd"] < top.cost_usd["shadow"]


@pytest.mark.slow
def test_cli_demo_plot_writes_the_figure(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--quick", "--plot", str(tmp_path / "demo.html")]) == 2  # refused before running
    assert "name a .png, .svg or .pdf file" in capsys.readouterr().err
    path = tmp_path / "demo.svg"
    assert main(["demo", "--quick", "--plot", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().err
    assert path.read_text().lstrip().startswith("<?xml") and "<svg" in path.read_text()
