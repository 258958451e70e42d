"""Spans of proxied calls: the tree under the caller's traceparent, in memory and over OTLP/HTTP."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import httpx
import openai
import pytest
from conftest import ProxyFactory, Telemetry, Upstream, default_upstreams
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind
from ragtoll.instrumentation import setup
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.request.identify import derived_span_id, derived_trace_id
from support.otlp import OtlpReceiver
from support.servers import serve_in_thread

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"


def test_span_tree_under_callers_traceparent(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    with proxy() as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="k", max_retries=0,
                               default_headers={"traceparent": TRACEPARENT})
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    spans = telemetry.spans()
    call = telemetry.by_name("chat gpt-4o-mini")[0]
    # one span per call: the call span is the request's server span, a child of the caller's span
    # (which ragtoll never ends); the upstream exchange has no span of its own, the call span times it
    assert call.kind == SpanKind.SERVER
    assert f"{call.context.trace_id:032x}" == TRACE
    assert f"{call.parent.span_id:016x}" == PARENT
    # and the task's summary when it ends
    assert sorted(s.name for s in spans) == ["chat gpt-4o-mini", "ragtoll.task"]
    assert call.attributes["http.request.method"] == "POST"
    assert call.attributes["http.route"] == "/openai/*"
    assert call.attributes["url.path"] == "/openai/v1/chat/completions"
    assert call.attributes["http.response.status_code"] == 200
    assert call.attributes["gen_ai.operation.name"] == "chat"
    assert call.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert call.attributes["gen_ai.response.model"] == "gpt-4o-mini"
    assert call.attributes["gen_ai.usage.input_tokens"] == 12
    assert call.attributes["gen_ai.usage.output_tokens"] == 3
    assert call.attributes["ragtoll.task.id"] == TRACE
    assert call.attributes["ragtoll.task.source"] == "traceparent"
    assert call.attributes["ragtoll.upstream"] == "openai"
    assert len({s.context.trace_id for s in spans}) == 1


@pytest.mark.slow
def test_call_span_ends_when_the_body_ends_not_at_headers(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [], "stream_options": {"include_usage": True}}
    with proxy() as base, httpx.Client() as http, http.stream(
            "POST", f"{base}/openai/v1/chat/completions", json=body,
            headers={"x-test-delay": "0.1", "traceparent": TRACEPARENT}) as resp:
        chunks = resp.iter_raw()
        next(chunks)
        headers_at = time.time_ns()
        assert not telemetry.by_name("chat gpt-4o-mini")  # still streaming: not ended
        b"".join(chunks)
    call = telemetry.by_name("chat gpt-4o-mini")[0]
    assert call.end_time > headers_at
    assert call.attributes["gen_ai.usage.output_tokens"] == 5
    assert call.attributes["gen_ai.response.finish_reasons"] == ("stop",)


def test_header_task_gets_a_derived_trace_shared_by_all_its_calls(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    with proxy() as base:
        for _ in range(3):
            httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []},
                       headers={"x-ragtoll-task-id": "ticket-42"})
    calls = telemetry.by_name("chat m")
    assert len(calls) == 3
    assert {c.context.trace_id for c in calls} == {derived_trace_id("ticket-42")}
    assert {c.kind for c in calls} == {SpanKind.SERVER}
    assert {c.parent.span_id for c in calls} == {derived_span_id("ticket-42")}
    assert {c.attributes["ragtoll.task.source"] for c in calls} == {"header"}


def test_trace_context_goes_only_to_trusted_upstreams(proxy: ProxyFactory, upstream: Upstream,
                                                      telemetry: Telemetry) -> None:
    sent = {"traceparent": TRACEPARENT, "baggage": "ragtoll.task.id=t1,user=alice", "tracestate": "k=v"}
    with proxy() as base:
        untrusted = httpx.get(f"{base}/raw/echo", headers=sent).json()["headers"]
        trusted = httpx.get(f"{base}/trusted/echo", headers=sent).json()["headers"]
    for name in ("traceparent", "tracestate", "baggage"):
        assert name not in untrusted
    # the trusted upstream gets ragtoll's call span as parent, in the caller's trace, sampled
    call = next(s for s in telemetry.spans() if s.attributes.get("ragtoll.upstream") == "trusted")
    assert trusted["traceparent"] == f"00-{TRACE}-{call.context.span_id:016x}-01"
    assert trusted["tracestate"] == "k=v"  # the call span holds no trace state of its own: the caller's stays
    assert trusted["baggage"] == "ragtoll.task.id=t1,user=alice"


def test_spans_arrive_over_otlp_http_and_decode(upstream: Upstream) -> None:
    receiver = OtlpReceiver()
    with serve_in_thread(receiver) as otlp:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_SERVICE_NAME": "ragtoll-test"}
        tp = setup.tracer_provider(env)
        settings = config.parse({"upstreams": default_upstreams(upstream.url)})
        with serve_in_thread(build_app(settings, tracer_provider=tp)) as base:
            httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "gpt-4o", "messages": []},
                       headers={"traceparent": TRACEPARENT})
        tp.force_flush()
        tp.shutdown()
    spans = {s["name"]: s for s in receiver.spans}
    assert set(spans) == {"chat gpt-4o", "ragtoll.task"}  # one span per call, and the task's summary
    call = spans["chat gpt-4o"]
    assert call["trace_id"] == TRACE
    assert call["parent_span_id"] == PARENT
    assert call["kind"] == 2  # SPAN_KIND_SERVER
    assert call["attributes"]["gen_ai.usage.input_tokens"] == 12
    assert call["resource"]["service.name"] == "ragtoll-test"


def test_no_exporter_configured_exports_nothing_and_errors_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    assert setup.span_exporter(env) is None
    tp = setup.tracer_provider(env)
    assert isinstance(tp, TracerProvider)
    assert not any(isinstance(p, BatchSpanProcessor)
                   for p in tp._active_span_processor._span_processors)
    grpc = setup.span_exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert type(grpc).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")


def test_content_is_off_by_default(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    with proxy() as base:
        httpx.post(f"{base}/openai/v1/chat/completions",
                   json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "my secret prompt"}]})
    call = telemetry.by_name("chat gpt-4o-mini")[0]
    assert not any("secret" in str(v) for v in call.attributes.values())
    assert "gen_ai.input.messages" not in call.attributes and "gen_ai.output.messages" not in call.attributes


def test_content_capture_records_prompts_and_completions_within_limits(proxy: ProxyFactory,
                                                                        telemetry: Telemetry) -> None:
    long_prompt = "tell me " + "x" * 500
    with proxy(telemetry={"capture_content": True, "content_max_chars": 120}) as base:
        httpx.post(f"{base}/openai/v1/chat/completions",
                   json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": long_prompt}]})
        body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        httpx.post(f"{base}/openai/v1/chat/completions", json=body)
    plain, streamed = sorted(telemetry.by_name("chat gpt-4o-mini"), key=lambda s: s.start_time)
    prompt = plain.attributes["gen_ai.input.messages"]
    assert prompt.startswith('["tell me xxx') and prompt.endswith("...[truncated]") and len(prompt) == 120
    assert plain.attributes["gen_ai.output.messages"] == '["Hello there."]'
    assert streamed.attributes["gen_ai.output.messages"] == '["Hel","lo"," the","re","."]'


@pytest.mark.slow
def test_a_ratio_sampler_keeps_or_drops_whole_tasks_and_budgets_stay_exact(upstream: Upstream, tmp_path: Any) -> None:
    """OTEL_TRACES_SAMPLER=parentbased_traceidratio: a header-named task's calls and its summary span
    are kept or dropped together (the virtual root is sampled as a root of the task's trace), while
    every task's budget and record are the same whichever it was."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.5)))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    records = tmp_path / "records.jsonl"
    settings = config.parse({"upstreams": default_upstreams(upstream.url), "budgets": {
        "records_file": str(records), "default_profile": "three", "profiles": {"three": {"max_calls": 3}}}})
    tasks = [f"sampled-or-not-{n}" for n in range(16)]
    with serve_in_thread(build_app(settings, tracer_provider=tp)) as base:
        for task in tasks:
            statuses = [httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []},
                                   headers={"x-ragtoll-task-id": task}).status_code for _ in range(4)]
            assert statuses == [200, 200, 200, 402], task  # the limit holds, sampled or not
    # the proxy stopped: every task ended (memory store), with its record and, if kept, its summary span
    spans = exporter.get_finished_spans()
    kept = {s.attributes["ragtoll.task.id"] for s in spans if s.name == "chat m"}
    assert set() < kept < set(tasks)  # both kinds are there (the ids are fixed, so is the split)
    for task in kept:
        trace_id = derived_trace_id(task)
        names = sorted(s.name for s in spans if s.context.trace_id == trace_id)
        assert names == ["chat m"] * 4 + ["ragtoll.task"], task  # one span per call, the refused one too
    assert {s.context.trace_id for s in spans} == {derived_trace_id(t) for t in kept}
    written = [json.loads(line) for line in records.read_text().splitlines()]
    assert sorted(r["task_id"] for r in written) == sorted(tasks)
    assert {(r["calls"], r["rejections"].get("max_calls")) for r in written} == {(3, 1)}
    tp.shutdown()


def test_a_request_refused_early_still_leaves_one_span(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    """One span per request, whatever ends it: a caller refused before its task is known (401), a
    path no upstream serves (404), a body ragtoll cannot read (400) or will not hold (413)."""
    chat = "/openai/v1/chat/completions"
    with proxy(principals={"anonymous": "refuse"}, server={"max_body_bytes": 4096}) as base, httpx.Client() as http:
        anonymous = http.post(f"{base}{chat}", json={"model": "m", "messages": []},
                              headers={"traceparent": TRACEPARENT})
        unknown = http.get(f"{base}/nowhere/at/all")
        keyed = {"authorization": "Bearer sk-k"}
        bad_json = http.post(f"{base}{chat}", content=b'{"model": "m", "model": "n"}', headers=keyed)
        too_large = http.post(f"{base}{chat}", content=b"x" * 5000, headers=keyed)
    assert [r.status_code for r in (anonymous, unknown, bad_json, too_large)] == [401, 404, 400, 413]
    spans = {s.attributes["http.response.status_code"]: s for s in telemetry.spans()}
    assert sorted(spans) == [400, 401, 404, 413]
    assert {s.kind for s in spans.values()} == {SpanKind.SERVER}
    refused = spans[401]
    # a root: a caller not accepted does not place spans in the trace its traceparent names
    assert refused.parent is None and f"{refused.context.trace_id:032x}" != TRACE
    assert refused.attributes["error.type"] == "unauthorized" and "ragtoll.task.id" not in refused.attributes
    assert refused.name == "POST /openai"
    assert spans[404].parent is None and spans[404].name == "GET"
    assert spans[404].attributes["url.path"] == "/nowhere/at/all" and "http.route" not in spans[404].attributes
    # the duplicate key is refused by the call: its span is the call span, named and with the refusal
    assert spans[400].name.startswith("chat ") and spans[400].attributes["ragtoll.outcome"] == "rejected"
    assert spans[400].attributes["error.type"] == "duplicate_json_key"
    assert spans[413].name == "POST /openai" and spans[413].attributes["http.route"] == "/openai/*"
