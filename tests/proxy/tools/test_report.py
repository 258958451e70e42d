"""`ragtoll report` and `ragtoll recommend` over fixture task records, from a file and a real Redis Stream."""

from __future__ import annotations

import csv
import io
import pathlib
import re
from typing import Any

import orjson
import pytest
import redis
from conftest import ProxyFactory
from ragtoll.proxy.cli import main
from ragtoll.proxy.tools import report, report_plot

FIXTURE = pathlib.Path(__file__).parents[3] / "tests" / "fixtures" / "task_records.jsonl"


@pytest.fixture
def records() -> list[dict[str, object]]:
    return report.read_jsonl(str(FIXTURE))


def _row(rows: list[report.Row], group: str) -> report.Row:
    return next(r for r in rows if r.group == group)


def test_table_by_profile_counts_outcomes_cost_and_exhaustion(records: list[dict[str, object]]) -> None:
    rows = report.summarize(records, "profile")
    assert [r.group for r in rows] == ["bounded", "tight", "all"]
    tight = _row(rows, "tight")
    assert (tight.tasks, tight.judged, tight.correct) == (6, 5, 3)  # t6 has no outcome posted
    assert tight.accuracy == pytest.approx(0.6)
    assert tight.retrieval_calls == pytest.approx(14 / 6)
    # cost per correct answer: cost of the judged tasks over their correct answers
    assert tight.cost_per_correct_usd == pytest.approx((0.001 + 0.0012 + 0.0008 + 0.004 + 0.01) / 3)
    assert tight.exhaustion_rate == pytest.approx(1 / 6)
    assert tight.cache_hit_rate == pytest.approx(2 / (2 + 14 + 8))
    assert tight.latency_p50_ms == pytest.approx(175)
    everything = _row(rows, "all")
    assert (everything.tasks, everything.correct, everything.judged) == (10, 5, 9)
    assert everything.exhaustion_rate == pytest.approx(0.2)


def test_table_by_class_and_route(records: list[dict[str, object]]) -> None:
    by_class = report.summarize(records, "class")
    assert [r.group for r in by_class] == ["multi_hop", "procedural", "simple_fact", "all"]
    assert _row(by_class, "procedural").accuracy == 1.0
    by_route = report.summarize(records, "route")
    assert [r.group for r in by_route] == ["openai", "all"]
    # a record's route is its first call's: the table says so rather than passing it off as the task's
    table = report.format_rows(by_route, "table", "route").splitlines()
    assert table[0].startswith("route (first call)  tasks") and table[2].startswith("openai ")


def test_money_keeps_three_significant_digits_at_any_size() -> None:
    cases = {
        0.0328: "$0.0328",
        0.353: "$0.353",
        0.0099: "$0.00990",
        0.0000012: "$0.00000120",
        0.09996: "$0.100",
        0.99996: "$1.00",
        12.345: "$12.3",
        1234.5: "$1,234",
        0: "$0",
        -0.0021: "-$0.00210",
    }
    assert {v: report.format_usd(v) for v in cases} == cases


def test_table_prints_small_costs_readably(records: list[dict[str, object]]) -> None:
    cheap = [dict(r, cost_usd=float(r["cost_usd"]) / 1000) for r in records]  # cached lookups cost cents/1000
    (tight,) = [
        line for line in report.format_rows(report.summarize(cheap)).splitlines() if line.startswith("tight")
    ]
    cells = tight.split()
    assert not [c for c in cells if re.fullmatch(r"\$0\.0*", c)]  # the old table printed $0.00000 here
    assert "$0.00000298" in cells  # cost per task: 0.0179 / 6 / 1000


def test_percentile_interpolates_like_numpy() -> None:
    assert report.percentile([1, 2, 3], 95) == pytest.approx(2.9)
    assert report.percentile([5], 50) == 5
    assert report.percentile([], 95) == 0


def test_formats_json_csv_table_agree(records: list[dict[str, object]]) -> None:
    rows = report.summarize(records, "profile")
    as_json = orjson.loads(report.format_rows(rows, "json", "profile"))
    assert as_json[1]["group"] == "tight" and as_json[1]["correct"] == 3 and as_json[1]["by"] == "profile"
    as_csv = list(csv.DictReader(io.StringIO(report.format_rows(rows, "csv", "profile"))))
    assert float(as_csv[1]["cost_usd"]) == pytest.approx(as_json[1]["cost_usd"])
    table = report.format_rows(rows, "table", "profile").splitlines()
    assert table[0].split()[:4] == ["profile", "tasks", "correct", "accuracy"]
    assert table[3].split()[:4] == ["tight", "6", "3", "60.0%"]
    with pytest.raises(report.ReportError, match="xml"):
        report.format_rows(rows, "xml")


def test_bad_records_name_the_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "a", "cost_usd": 0.1}\n\n{"task_id": "b", "steps": "many"}\n')
    with pytest.raises(report.ReportError, match=r"bad.jsonl:3: field 'steps'"):
        report.read_jsonl(str(path))
    path.write_text("{not json\n")
    with pytest.raises(report.ReportError, match="bad.jsonl:1: not JSON"):
        report.read_jsonl(str(path))
    with pytest.raises(report.ReportError, match="cannot read"):
        report.read_jsonl(str(tmp_path / "missing.jsonl"))


@pytest.mark.slow
def test_cli_report_writes_table_and_plot(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    plot = tmp_path / "report.png"
    assert main(["report", str(FIXTURE), "--by", "class", "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith("class") and f"wrote {plot}" in err
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.width >= 1200 and image.height >= 900
    svg = tmp_path / "report.svg"
    assert main(["report", str(FIXTURE), "--format", "csv", "--plot", str(svg)]) == 0
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg.read_text())  # well-formed: browsers and image viewers open it
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and svg.stat().st_size > 20_000


def test_cli_errors_are_one_line_exit_2(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot read task records" in capsys.readouterr().err
    assert main(["recommend", str(FIXTURE), "--headroom", "0.5"]) == 2
    assert "headroom" in capsys.readouterr().err
    with pytest.raises(report.ReportError, match="no task records"):
        report_plot.render([], "profile", str(tmp_path / "empty.png"))
    assert main(["report", str(FIXTURE), "--plot", str(tmp_path / "report.html")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ragtoll report: cannot plot to '{tmp_path / 'report.html'}': name a .png, .svg or .pdf file"
    )
    assert not (tmp_path / "report.html").exists()


def test_report_and_recommend_from_redis_stream(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    client = redis.Redis.from_url(redis_url)
    key = "ragtoll:test-report:tasks"
    client.delete(key)
    lines = FIXTURE.read_text().splitlines()
    for line in lines[:5]:  # one JSON field per entry
        client.xadd(key, {"record": line})
    for line in lines[5:]:  # flat fields, each JSON-encoded
        client.xadd(key, {k: orjson.dumps(v) for k, v in orjson.loads(line).items()})
    client.close()
    assert report.read_stream(redis_url, key, batch=3) == report.read_jsonl(str(FIXTURE))
    assert main(["report", "--redis-url", redis_url, "--stream", key, "--format", "json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)
    assert rows[-1]["tasks"] == 10
    assert main(["recommend", "--redis-url", redis_url, "--stream", key, "--percentile", "90"]) == 0
    assert "max_retrieval_calls" in capsys.readouterr().out


def test_shadow_records_say_how_many_tasks_a_limit_would_have_stopped(
    records: list[dict[str, object]],
) -> None:
    assert report.overall(records).would_exhaust_rate is None  # the fixture predates would_reject
    shadow = [
        dict(r, exhausted=None, would_reject={"max_steps": 1} if r["task_id"] in ("t5", "b4") else {})
        for r in records
    ]
    row = report.overall(shadow)
    assert row.exhaustion_rate == 0 and row.would_exhaust_rate == pytest.approx(0.2)
    assert "would exhaust" in report.format_rows([row]).splitlines()[0]


def test_report_reads_the_stream_ragtoll_writes(
    proxy: ProxyFactory, redis_url: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx
    import openai

    token = tmp_path / "token"
    token.write_text("admin-secret")
    stream = f"ragtoll:test-report:{tmp_path.name}"
    with proxy(
        store=redis_url,
        admin={"token_file": str(token)},
        budgets={"records_stream": stream, "default_profile": "p", "profiles": {"p": {"max_steps": 5}}},
    ) as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0)
        for task, correct in (("task-a", True), ("task-b", False)):
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-ragtoll-task-id": task},
            )
            resp = httpx.post(
                f"{base}/admin/tasks/{task}/end",
                json={"correct": correct},
                headers={"authorization": "Bearer admin-secret"},
            )
            assert resp.status_code == 200
    records = report.read_stream(redis_url, stream)
    assert sorted((r["task_id"], r["outcome"]["correct"], r["steps"]) for r in records) == [
        ("task-a", True, 1),
        ("task-b", False, 1),
    ]
    assert main(["report", "--redis-url", redis_url, "--stream", stream, "--format", "json"]) == 0
    (row, _all) = orjson.loads(capsys.readouterr().out)
    assert (row["group"], row["tasks"], row["correct"], row["accuracy"]) == ("p", 2, 1, 0.5)
    assert row["cost_per_correct_usd"] == pytest.approx(sum(r["cost_usd"] for r in records))


def test_outcomes_posted_later_override_the_records(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "records.jsonl"
    lines = FIXTURE.read_text().splitlines()
    verdicts = [
        {"kind": "outcome", "task_id": "t6", "outcome": {"correct": True}},  # t6 ended with no outcome
        {"kind": "outcome", "task_id": "t3", "outcome": {"correct": True}},  # a re-judged answer
        {
            "kind": "outcome",
            "task_id": "t3",
            "outcome": {"correct": False},
        },  # ... and judged again: last wins
        {"kind": "outcome", "task_id": "never-recorded", "outcome": {"correct": True}},
    ]
    path.write_text(
        "\n".join(
            [orjson.dumps(verdicts[0]).decode(), *lines, *(orjson.dumps(v).decode() for v in verdicts[1:])]
        )
    )
    recs = {r["task_id"]: r for r in report.read_jsonl(str(path))}
    assert (
        len(recs) == 10
        and recs["t6"]["outcome"] == {"correct": True}
        and recs["t3"]["outcome"] == {"correct": False}
    )
    tight = report.summarize(recs.values())[1]
    assert (tight.judged, tight.correct) == (6, 4)
    path.write_text('{"kind": "outcome", "task_id": "t1", "outcome": {"correct": "yes"}}\n')
    with pytest.raises(report.ReportError, match=":1: an outcome entry needs"):
        report.read_jsonl(str(path))


def test_outcomes_posted_through_the_admin_api_reach_the_report(
    proxy: ProxyFactory, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx
    import openai

    token = tmp_path / "token"
    token.write_text("admin-secret")
    records = tmp_path / "records.jsonl"
    auth = {"authorization": "Bearer admin-secret"}
    with proxy(admin={"token_file": str(token)}, budgets={"records_file": str(records)}) as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0)
        for task in ("judged-late", "judged-early"):
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"x-ragtoll-task-id": task},
            )
        early = httpx.post(f"{base}/admin/tasks/judged-early/outcome", json={"correct": False}, headers=auth)
        assert early.status_code == 200 and early.json()["outcome"] == {"correct": False}
        for task in ("judged-late", "judged-early"):
            assert httpx.post(f"{base}/admin/tasks/{task}/end", headers=auth).status_code == 200
        late = httpx.post(f"{base}/admin/tasks/judged-late/outcome", json={"correct": True}, headers=auth)
        assert late.status_code == 200
        bad = httpx.post(f"{base}/admin/tasks/judged-late/outcome", json={"correct": "yes"}, headers=auth)
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_body"
        assert (
            httpx.post(f"{base}/admin/tasks/judged-late/outcome", json={"correct": True}).status_code == 401
        )
        unknown = httpx.post(f"{base}/admin/tasks/never-seen/outcome", json={"correct": True}, headers=auth)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "task_not_found"
    recs = {r["task_id"]: r for r in report.read_jsonl(str(records))}
    assert (
        recs["judged-late"]["outcome"] == {"correct": True}
        and recs["judged-late"]["end_reason"] == "explicit"
    )
    assert recs["judged-early"]["outcome"] == {"correct": False}
    assert main(["report", str(records), "--format", "json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)
    assert (rows[-1]["tasks"], rows[-1]["judged"], rows[-1]["correct"]) == (2, 2, 1)


def test_context_numbers_cached_input_share_and_evidence_not_resent() -> None:
    """Tasks whose records carry `context` (stages/context.py): the share of the LLM input the
    provider's cache served over all of them, and the evidence characters not sent again per task."""
    base = {"steps": 1, "retrieval_calls": 0, "rerank_calls": 0, "context_tokens": 0, "cost_usd": 0.0,
            "cache_hits": 0, "duration_ms": 10, "outcome": None}
    recs = [{**base, "context": {"input_tokens": 1000, "cached_input_tokens": 900, "evidence_chars_saved": 300}},
            {**base, "context": {"input_tokens": 1000, "cached_input_tokens": 100, "evidence_chars_saved": 0}},
            {**base}]
    row = report.overall(recs)
    assert row.cached_input_share == pytest.approx(0.5)
    assert row.evidence_chars_saved == pytest.approx(100)
    assert report.overall([base]).cached_input_share is None
    assert "cached input" in report.format_rows([row]).splitlines()[0]


def test_groundedness_over_graded_tasks_and_evidence_tokens_resent_per_task() -> None:
    """Records of the evidence stage (stages/evidence.py): the mean groundedness of the tasks whose
    last answer was graded (a task with none is left out, not counted as 0), and the evidence
    prompt tokens resent per task; cost per correct answer stays beside them."""
    base = {"steps": 1, "retrieval_calls": 1, "rerank_calls": 0, "context_tokens": 0, "cost_usd": 0.02,
            "cache_hits": 0, "duration_ms": 10}
    recs = [{**base, "outcome": {"correct": True}, "groundedness": 1.0, "evidence": {"resent_tokens": 900}},
            {**base, "outcome": {"correct": False}, "groundedness": 0.5, "evidence": {"resent_tokens": 300}},
            {**base, "outcome": {"correct": True}, "groundedness": None, "evidence": {"resent_tokens": 0}},
            {**base, "outcome": None}]
    row = report.overall([report.parse_record(r | {"task_id": f"t{i}"}, "test") for i, r in enumerate(recs)])
    assert (row.groundedness, row.graded) == (pytest.approx(0.75), 2)
    assert row.evidence_tokens_resent == pytest.approx(300)  # 1,200 over 4 tasks
    assert row.cost_per_correct_usd == pytest.approx(0.03)  # 3 judged tasks' $0.06 / 2 correct
    header, _, line = report.format_rows([row]).splitlines()
    assert header.endswith("evidence tokens resent/task  grounded")
    assert line.split()[-2:] == ["300", "75.0%"]
    plain = report.overall([{**base, "task_id": "p", "outcome": None}])
    assert (plain.groundedness, plain.evidence_tokens_resent, plain.graded) == (None, None, 0)


@pytest.mark.parametrize("value", [1.5, -0.1, "high", True])
def test_a_groundedness_that_is_not_a_share_is_refused(value: Any) -> None:
    with pytest.raises(report.ReportError, match=r"rec\.jsonl:3: field 'groundedness' has value"):
        report.parse_record({"task_id": "t", "groundedness": value}, "rec.jsonl:3")


def test_cached_input_share_prefers_the_ledgers_numbers_every_replica_counted() -> None:
    """A record with the ledger's `cached_input_tokens` (of its `context_tokens`) is read by them; an
    older record, with only its replica's `context` object, by that."""
    base = {"steps": 1, "retrieval_calls": 0, "rerank_calls": 0, "cost_usd": 0.0, "cache_hits": 0,
            "duration_ms": 10, "outcome": None}
    whole = {**base, "context_tokens": 3000, "cached_input_tokens": 2400,
             "context": {"input_tokens": 1000, "cached_input_tokens": 100}}
    older = {**base, "context_tokens": 1000, "context": {"input_tokens": 1000, "cached_input_tokens": 600}}
    assert report.overall([whole]).cached_input_share == pytest.approx(0.8)
    assert report.overall([whole, older]).cached_input_share == pytest.approx(3000 / 4000)
