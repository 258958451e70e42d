"""The ragtoll.task summary span lands in the task's trace and completes the tree."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from conftest import ProxyFactory, Telemetry, Upstream, default_upstreams
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from ragtoll.instrumentation import semconv as sc
from ragtoll.instrumentation import setup, task_span
from ragtoll.instrumentation.task_span import emit_task_span
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.request.identify import derived_span_id, derived_trace_id
from support.otlp import OtlpReceiver
from support.servers import serve_in_thread

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def test_named_task_span_takes_the_virtual_root_id(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    start = time.time_ns()
    with proxy() as base:
        for _ in range(2):
            httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []},
                       headers={"x-ragtoll-task-id": "ticket-42"})
    # ragtoll stopped: the task it held ended with its summary span (emit_task_span, from the record)
    (task,) = telemetry.by_name("ragtoll.task")
    assert task.context.span_id == derived_span_id("ticket-42")
    assert task.context.trace_id == derived_trace_id("ticket-42")
    assert task.parent is None  # the root of the task's trace
    assert task.attributes["ragtoll.task.id"] == "ticket-42" and task.attributes["ragtoll.task.calls"] == 2
    assert start - 10**6 <= task.start_time <= time.time_ns()  # the record's start, in milliseconds
    servers = [s for s in telemetry.spans() if s.kind == SpanKind.SERVER]
    assert len(servers) == 2
    assert {s.parent.span_id for s in servers} == {task.context.span_id}
    assert {s.context.trace_id for s in telemetry.spans()} == {task.context.trace_id}
    # the task tracer still draws fresh ids for anything not pinned
    other = task_span._tracer(telemetry.tracer_provider)[0].start_span("x")
    assert other.get_span_context().span_id != derived_span_id("ticket-42")
    other.end()


def test_traceparent_task_span_is_a_child_of_the_callers_span(telemetry: Telemetry) -> None:
    now = time.time_ns()
    emit_task_span(telemetry.tracer_provider, TRACE, int(TRACE, 16), None, now - 10**9, now,
                   {sc.TASK_SOURCE: "traceparent"}, parent_span_id=int(PARENT, 16),
                   error="budget exceeded: max_steps")
    (task,) = telemetry.by_name("ragtoll.task")
    assert f"{task.context.trace_id:032x}" == TRACE
    assert f"{task.parent.span_id:016x}" == PARENT
    assert task.status.status_code == StatusCode.ERROR
    assert task.end_time - task.start_time == 10**9


def test_concurrent_emits_keep_their_own_ids(telemetry: Telemetry) -> None:
    ids = [f"task-{i}" for i in range(32)]
    now = time.time_ns()

    def emit(task_id: str) -> None:
        emit_task_span(telemetry.tracer_provider, task_id, derived_trace_id(task_id),
                       derived_span_id(task_id), now, now, {})

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(emit, ids))
    spans = {s.attributes["ragtoll.task.id"]: s for s in telemetry.by_name("ragtoll.task")}
    assert len(spans) == len(ids)
    for task_id, span in spans.items():
        assert span.context.span_id == derived_span_id(task_id)
        assert span.context.trace_id == derived_trace_id(task_id)


def test_a_provider_with_its_own_id_generator_keeps_it_for_other_spans() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    now = time.time_ns()
    emit_task_span(provider, "t", derived_trace_id("t"), derived_span_id("t"), now, now, {})
    emit_task_span(provider, "t2", derived_trace_id("t2"), derived_span_id("t2"), now, now, {})
    assert [s.context.span_id for s in exporter.get_finished_spans()] == [derived_span_id("t"),
                                                                         derived_span_id("t2")]
    provider.shutdown()
    # a no-op provider records nothing and does not fail
    assert not emit_task_span(trace.NoOpTracerProvider(), "t", 1, 2, now, now, {}).is_valid


def test_task_tree_is_complete_in_the_otlp_export(upstream: Upstream) -> None:
    receiver = OtlpReceiver()
    with serve_in_thread(receiver) as otlp:
        tp = setup.tracer_provider({"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_SERVICE_NAME": "ragtoll"})
        settings = config.parse({"upstreams": default_upstreams(upstream.url)})
        with serve_in_thread(build_app(settings, tracer_provider=tp)) as base:
            for path in ("/openai/v1/chat/completions", "/docs/search"):
                httpx.post(f"{base}{path}", json={"model": "gpt-4o", "messages": [], "query": "q"},
                           headers={"x-ragtoll-task-id": "ticket-7"})
        # ragtoll has stopped: the task it held ended, and its summary span went out with the rest
        tp.shutdown()
    spans = receiver.spans
    by_id = {s["span_id"]: s for s in spans}
    (task,) = [s for s in spans if s["name"] == "ragtoll.task"]
    assert task["span_id"] == f"{derived_span_id('ticket-7'):016x}" and task["parent_span_id"] == ""
    assert {s["trace_id"] for s in spans} == {task["trace_id"]}
    # every span but the task span has its parent in the export: one tree, one root
    orphans = [s["name"] for s in spans if s is not task and s["parent_span_id"] not in by_id]
    assert orphans == []
    # one span per call, the request's server span (kind 2), a child of the task's summary
    calls = [s for s in spans if s is not task]
    assert sorted(s["name"] for s in calls) == ["chat gpt-4o", "other docs"]
    assert {s["kind"] for s in calls} == {2} and {s["parent_span_id"] for s in calls} == {task["span_id"]}
