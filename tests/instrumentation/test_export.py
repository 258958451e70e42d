"""Span export from a child process (instrumentation/export.py): what reaches a real OTLP/HTTP receiver
is exactly what the in-process OTLP exporter would send, and the child comes and goes with its parent."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)
from ragtoll.instrumentation import setup
from ragtoll.instrumentation.export import ProcessSpanExporter
from support.otlp import OtlpReceiver
from support.servers import serve_in_thread

REMOTE = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                     trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1")]))


@pytest.fixture
def receiver() -> Iterator[tuple[OtlpReceiver, dict[str, str]]]:
    otlp = OtlpReceiver()
    with serve_in_thread(otlp) as url:
        yield otlp, {"OTEL_EXPORTER_OTLP_ENDPOINT": url}


def by_span_id(requests: list[ExportTraceServiceRequest]) -> dict[bytes, tuple[Any, Any, str, Any]]:
    """Every span of `requests` with the resource, scope and scope schema it was sent under."""
    out = {}
    for req in requests:
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    out[span.span_id] = (rs.resource, ss.scope, ss.schema_url, span)
    return out


def new_children(before: set[Any]) -> list[Any]:
    """The multiprocessing children started since `before` (other tests' may still be running)."""
    return [p for p in multiprocessing.active_children() if p not in before]


def wait_for(check: Any, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        time.sleep(0.05)


def make_spans(provider: TracerProvider) -> None:
    """Spans with everything OTLP carries: remote and local parents, trace state, every attribute
    type, events, links, error status, two scopes (one with attributes) and dropped counts."""
    ours = provider.get_tracer("ragtoll.proxy", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.26.0")
    other = provider.get_tracer("other", attributes={"scope.kind": "test"})
    server = ours.start_span("POST /openai", context=set_span_in_context(NonRecordingSpan(REMOTE)),
                             kind=SpanKind.SERVER, attributes={"http.request.method": "POST"})
    call = ours.start_span("chat gpt-4o", context=set_span_in_context(server), kind=SpanKind.CLIENT,
                           links=[Link(REMOTE, {"link.why": "caller"})])
    call.set_attributes({"s": "text", "b": True, "i": 42, "f": 0.25, "ss": ("a", "b"), "ii": [1, 2]})
    call.add_event("ragtoll.budget.charge", {"dimension": "max_steps", "used": 1}, timestamp=1_700_000_000_000_000_000)
    call.set_status(Status(StatusCode.ERROR, "upstream timed out"))
    call.end()
    crowded = other.start_span("crowded", links=[Link(REMOTE), Link(call.get_span_context())])
    crowded.set_attributes({f"k{i}": i for i in range(12)})  # past the limit of 8: 4 dropped
    for n in range(4):  # past the limit of 3: 1 dropped
        crowded.add_event(f"e{n}")
    crowded.end()
    server.end()


def limited_provider() -> TracerProvider:
    return TracerProvider(resource=Resource({"service.name": "ragtoll-test", "deployment.environment": "ci"},
                                            "https://opentelemetry.io/schemas/1.26.0"),
                          span_limits=SpanLimits(max_span_attributes=8, max_events=3, max_links=1))


def test_what_arrives_is_what_the_in_process_exporter_would_send(receiver: tuple[OtlpReceiver, dict[str, str]]) -> None:
    otlp, env = receiver
    before = set(multiprocessing.active_children())
    provider = limited_provider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(BatchSpanProcessor(ProcessSpanExporter(env, provider.resource)))
    make_spans(provider)
    provider.shutdown()  # flushes the batch processor, then the child, then stops it
    finished = memory.get_finished_spans()
    assert [s.dropped_attributes for s in finished if s.name == "crowded"] == [4]  # the case is really there
    expected = by_span_id([encode_spans(finished)])
    assert len(expected) == 3
    assert by_span_id(otlp.trace_requests) == expected  # protobuf equality, field by field
    assert not new_children(before)  # shutdown stopped the child


def test_thread_mode_exports_in_process(receiver: tuple[OtlpReceiver, dict[str, str]]) -> None:
    otlp, env = receiver
    before = set(multiprocessing.active_children())
    provider = setup.tracer_provider(env, export="thread")
    provider.get_tracer("t").start_span("in-process").end()
    provider.shutdown()
    assert [s["name"] for s in otlp.spans] == ["in-process"]
    assert not new_children(before)
    with pytest.raises(ValueError, match="export must be one of"):
        setup.tracer_provider(env, export="carrier-pigeon")


@pytest.mark.slow
def test_a_killed_export_process_is_replaced(receiver: tuple[OtlpReceiver, dict[str, str]]) -> None:
    otlp, env = receiver
    before = set(multiprocessing.active_children())
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ProcessSpanExporter(env, provider.resource)))
    tracer = provider.get_tracer("t")
    tracer.start_span("before").end()
    wait_for(lambda: any(s["name"] == "before" for s in otlp.spans), "the first span arrives")
    (child,) = new_children(before)
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(10)
    sent = 0

    def after_arrived() -> bool:
        nonlocal sent
        tracer.start_span(f"after-{sent}").end()  # those sent while the death goes unnoticed are lost
        sent += 1
        return any(s["name"].startswith("after-") for s in otlp.spans)

    wait_for(after_arrived, "a span sent after the kill arrives through a new child")
    (replacement,) = new_children(before)
    assert replacement.pid != child.pid
    provider.shutdown()
    assert not new_children(before)


PARENT = """
import sys, time, multiprocessing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from ragtoll.instrumentation.export import ProcessSpanExporter

if __name__ == "__main__":
    provider = TracerProvider()
    exporter = ProcessSpanExporter({"OTEL_EXPORTER_OTLP_ENDPOINT": sys.argv[1]}, provider.resource)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("from-the-parent").end()
    exporter.force_flush()
    print(multiprocessing.active_children()[0].pid, flush=True)
    time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_the_export_process_ends_when_its_parent_is_killed(receiver: tuple[OtlpReceiver, dict[str, str]],
                                                           tmp_path: Any) -> None:
    otlp, env = receiver
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT))
    parent = subprocess.Popen([sys.executable, str(script), env["OTEL_EXPORTER_OTLP_ENDPOINT"]],
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert [s["name"] for s in otlp.spans] == ["from-the-parent"]
        assert alive(child)
        parent.kill()  # no shutdown, no atexit: only the child's own watch can end it
        parent.wait(10)
        wait_for(lambda: not alive(child), "the orphaned export process exits")
    finally:
        parent.kill()
        parent.wait(10)
        parent.stdout.close()  # type: ignore[union-attr]


def export_from_a_daemon(endpoint: str) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(
        ProcessSpanExporter({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}, provider.resource)))
    provider.get_tracer("t").start_span("from-a-daemon").end()
    provider.shutdown()


@pytest.mark.slow
def test_a_daemonic_process_exports_in_process(receiver: tuple[OtlpReceiver, dict[str, str]]) -> None:
    """A daemonic multiprocessing worker (hypercorn's) may not start children: its spans still arrive."""
    otlp, env = receiver
    worker = multiprocessing.get_context("spawn").Process(
        target=export_from_a_daemon, args=(env["OTEL_EXPORTER_OTLP_ENDPOINT"],), daemon=True)
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0
    assert [s["name"] for s in otlp.spans] == ["from-a-daemon"]
