"""The app's own telemetry wiring: /metrics, per-call metrics, and the task summary span at task end."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
from conftest import Telemetry, Upstream, default_upstreams
from opentelemetry.sdk.metrics import MeterProvider
from ragtoll.instrumentation.metrics import prometheus_reader
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.request.identify import derived_span_id, derived_trace_id
from support.poll import wait_until
from support.servers import serve_in_thread

ADMIN = "observability-admin-token"
ENV = {"RAGTOLL_ADMIN_TOKEN": ADMIN}
RAW = {"upstreams": default_upstreams(""), "tasks": {"untracked": "per-call"},
       "budgets": {"default_profile": "tiny", "profiles": {"tiny": {"max_steps": 1}}}}


def settings(upstream: Upstream) -> config.Settings:
    return config.parse({**RAW, "upstreams": default_upstreams(upstream.url)})


def chat(base: str, task: str) -> httpx.Response:
    return httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []},
                      headers={"x-ragtoll-task-id": task})


def points(telemetry: Telemetry) -> dict[str, list[Any]]:
    data = telemetry.reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def test_metrics_endpoint_serves_prometheus_text_without_ids(upstream: Upstream) -> None:
    reader = prometheus_reader()
    mp = MeterProvider(metric_readers=[reader])
    app = build_app(settings(upstream), meter_provider=mp, prometheus=reader, env=ENV)
    with serve_in_thread(app) as base:
        assert chat(base, "task-metrics-1").status_code == 200
        assert chat(base, "task-metrics-1").status_code == 402  # max_steps 1
        text = httpx.get(f"{base}/metrics").text
    mp.shutdown()
    assert re.search(r'ragtoll_calls_total\{.*ragtoll_outcome="ok".*\} 1', text)
    assert re.search(r'ragtoll_calls_total\{.*ragtoll_outcome="rejected".*\} 1', text)
    assert re.search(r'ragtoll_rejections_total\{.*ragtoll_budget_exceeded_dimension="max_steps".*\} 1', text)
    assert "gen_ai_client_token_usage" in text and "ragtoll_proxy_overhead_seconds" in text
    assert "task-metrics-1" not in text


def test_metrics_endpoint_without_reader_is_a_404_json(upstream: Upstream, telemetry: Telemetry) -> None:
    with serve_in_thread(build_app(settings(upstream), meter_provider=telemetry.meter_provider, env=ENV)) as base:
        r = httpx.get(f"{base}/metrics")
    assert r.status_code == 404 and r.json()["error"]["code"] == "route_not_found"


def test_call_metrics_recorded_from_the_pipeline(upstream: Upstream, telemetry: Telemetry) -> None:
    app = build_app(settings(upstream), tracer_provider=telemetry.tracer_provider,
                    meter_provider=telemetry.meter_provider, env=ENV)
    with serve_in_thread(app) as base:
        chat(base, "t-a")
        chat(base, "t-a")
    got = points(telemetry)
    calls = {(p.attributes["ragtoll.outcome"], p.value) for p in got["ragtoll.calls"]}
    assert calls == {("ok", 1), ("rejected", 1)}
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in got["gen_ai.client.token.usage"]}
    assert tokens == {"input": 12, "output": 3}
    assert sum(p.value for p in got["ragtoll.cost"]) > 0


def test_ending_a_task_records_its_summary_span_as_the_trace_root(upstream: Upstream, telemetry: Telemetry) -> None:
    app = build_app(settings(upstream), tracer_provider=telemetry.tracer_provider,
                    meter_provider=telemetry.meter_provider, env=ENV)
    task = "ticket-summary-1"
    with serve_in_thread(app) as base:
        chat(base, task)
        chat(base, task)  # rejected: the summary must say the budget was exhausted
        r = httpx.post(f"{base}/admin/tasks/{task}/end", json={"correct": True},
                       headers={"authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 200, r.text
    (summary,) = telemetry.by_name("ragtoll.task")
    assert summary.context.trace_id == derived_trace_id(task)
    assert summary.context.span_id == derived_span_id(task)
    assert summary.parent is None
    assert summary.attributes["ragtoll.task.id"] == task
    assert summary.attributes["ragtoll.task.calls"] == 1  # a refused call is charged nothing
    assert summary.attributes["ragtoll.budget.exceeded"] is True
    # the record's totals, so Jaeger shows a task's spend without adding up its calls
    record = r.json()
    for key in ("steps", "retrieval_calls", "rerank_calls", "context_tokens", "completion_tokens", "cache_hits",
                "duration_ms"):
        assert summary.attributes[f"ragtoll.task.{key}"] == record[key], key
    assert summary.attributes["ragtoll.task.steps"] == 1 and summary.attributes["ragtoll.task.context_tokens"] > 0
    assert summary.attributes["ragtoll.task.correct"] is True
    calls = [s for s in telemetry.spans() if s is not summary and s.name != "ragtoll.task"]  # one span per call
    assert len(calls) == 2 and {s.parent.span_id for s in calls} == {summary.context.span_id}
    task_cost = points(telemetry)["ragtoll.task.cost"]
    assert sum(p.count for p in task_cost) == 1


def test_a_per_call_task_ends_with_its_call(upstream: Upstream, telemetry: Telemetry, tmp_path: Any) -> None:
    """`tasks.untracked: per-call`: each call is a task no later call can join, so it ends as its call
    finishes (end reason `call`), not an idle timeout later. Its trace is one span: the call's, the
    root, carrying the task summary a `ragtoll.task` span carries for other tasks; the record names
    that trace, and the task metrics count the task, all while the proxy still serves."""
    records = tmp_path / "tasks.jsonl"
    raw = {**RAW, "upstreams": default_upstreams(upstream.url),
           "budgets": {**RAW["budgets"], "records_file": str(records)},
           "tasks": {"untracked": "per-call", "idle_timeout_s": 3600}}  # the sweep never ends them here
    app = build_app(config.parse(raw), tracer_provider=telemetry.tracer_provider,
                    meter_provider=telemetry.meter_provider, env=ENV)
    with serve_in_thread(app) as base:
        for _ in range(5):
            r = httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []})
            assert r.status_code == 200, r.text  # max_steps 1 per task: five tasks, none refused
        def lines() -> list[str]:
            return records.read_text().splitlines() if records.exists() else []

        wait_until(lambda: len(lines()) >= 5)  # the ender writes a batch a few tens of ms apart
        spans = telemetry.spans()
    written = [orjson.loads(line) for line in lines()]
    assert [(w["end_reason"], w["calls"], w["task_source"]) for w in written] == [("call", 1, "per-call")] * 5
    by_task = {s.attributes["ragtoll.task.id"]: s for s in spans}
    assert len(spans) == 5 and sorted(by_task) == sorted(w["task_id"] for w in written)  # no ragtoll.task span
    for w in written:
        call = by_task[w["task_id"]]
        assert call.parent is None and f"{call.context.trace_id:032x}" == w["trace_id"]
        assert call.name == "chat gpt-4o-mini" and call.attributes["ragtoll.task.end_reason"] == "call"
        # the task's totals: the call's budget counts where its span has them, else the summary's own
        assert call.attributes["ragtoll.budget.max_steps.used"] == w["steps"] == 1
        assert "ragtoll.task.steps" not in call.attributes and "ragtoll.task.calls" not in call.attributes
        for key in ("context_tokens", "completion_tokens", "cache_hits", "duration_ms"):
            assert call.attributes[f"ragtoll.task.{key}"] == w[key], key  # no limit on these here
        assert call.attributes["ragtoll.cost.usd"] == w["cost_usd"] > 0  # the task's is the call's
    ended = points(telemetry)["ragtoll.task.calls"]
    assert sum(p.count for p in ended) == 5 and {p.attributes["ragtoll.task.end_reason"] for p in ended} == {"call"}


def test_a_per_call_task_ended_later_gets_its_own_summary_span(upstream: Upstream, telemetry: Telemetry,
                                                               tmp_path: Any) -> None:
    """A per-call task whose end at its call failed (its store did not answer) stays live until the
    idle sweep ends it; its summary then cannot go on the call's span, which has ended, so it gets a
    `ragtoll.task` span in the call's trace, as any other task does. Ended with its call: no second span."""
    records = tmp_path / "tasks.jsonl"
    raw = {**RAW, "upstreams": default_upstreams(upstream.url),
           "budgets": {**RAW["budgets"], "records_file": str(records)},
           "tasks": {"untracked": "per-call", "idle_timeout_s": 3600}}
    app = build_app(config.parse(raw), tracer_provider=telemetry.tracer_provider,
                    meter_provider=telemetry.meter_provider, env=ENV)
    with serve_in_thread(app) as base:
        r = httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []})
        assert r.status_code == 200, r.text
        wait_until(lambda: records.exists() and records.read_text().strip() != "")
        record = orjson.loads(records.read_text().splitlines()[0])
        assert record["end_reason"] == "call" and len(telemetry.spans()) == 1
        listeners = list(app.ender.listeners)  # what the ender runs for every task it ends
        for listener in listeners:
            listener(record)  # ended with its call (again): its summary is on the call span
        assert [s.name for s in telemetry.spans()] == ["chat gpt-4o-mini"]
        swept = {**record, "end_reason": "idle"}  # the same task, as the sweep would have ended it
        for listener in listeners:
            listener(swept)
    summary = [s for s in telemetry.spans() if s.name == "ragtoll.task"]
    assert len(summary) == 1 and f"{summary[0].context.trace_id:032x}" == record["trace_id"]
    assert summary[0].attributes["ragtoll.task.end_reason"] == "idle"
    assert summary[0].attributes["ragtoll.task.id"] == record["task_id"]
