"""Requests refused before their task is known are traced, but a flood of them cannot crowd the span
queue that every accepted call's span goes through: at most `per_second` such spans a second."""

from __future__ import annotations

import time

import httpx
from conftest import ProxyFactory, Telemetry
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ragtoll.proxy.errors import Unauthorized
from ragtoll.proxy.request.pipeline import REFUSAL_SPANS_PER_SECOND, RefusalSpans

SCOPE = {"method": "POST", "path": "/openai/v1/chat/completions"}


def test_at_most_per_second_refusal_spans_a_second() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    now = [100.0]
    spans = RefusalSpans(provider.get_tracer("t"), per_second=5, clock=lambda: now[0])
    for _ in range(12):
        spans.record(SCOPE, "/openai/*", Unauthorized("no key"))
    assert len(exporter.get_finished_spans()) == 5 and spans.skipped == 7
    now[0] = 100.9  # the same second
    spans.record(SCOPE, "/openai/*", Unauthorized("no key"))
    assert len(exporter.get_finished_spans()) == 5 and spans.skipped == 8
    now[0] = 101.0  # a new second: a new allowance
    for _ in range(6):
        spans.record(SCOPE, "/openai/*", Unauthorized("no key"))
    assert len(exporter.get_finished_spans()) == 10 and spans.skipped == 9
    assert {s.attributes["http.response.status_code"] for s in exporter.get_finished_spans()} == {401}


def test_a_flood_of_refused_requests_is_answered_and_traced_within_the_bound(proxy: ProxyFactory,
                                                                              telemetry: Telemetry) -> None:
    n = 3 * REFUSAL_SPANS_PER_SECOND
    with proxy(principals={"anonymous": "refuse"}) as base, httpx.Client() as http:
        started = time.monotonic()
        answers = [http.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []})
                   for _ in range(n)]
        seconds = time.monotonic() - started
    assert {r.status_code for r in answers} == {401}
    traced = [s for s in telemetry.spans() if s.attributes.get("http.response.status_code") == 401]
    # every refusal answered; spans at most the bound for each second the flood touched
    assert 0 < len(traced) <= REFUSAL_SPANS_PER_SECOND * (int(seconds) + 2)
    if seconds < 1:  # all within (at most) two clock seconds
        assert len(traced) <= 2 * REFUSAL_SPANS_PER_SECOND < n
