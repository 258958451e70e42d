"""Metric instruments: data points from an in-memory reader, /metrics text, no unbounded labels."""

from __future__ import annotations

import re
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from ragtoll.instrumentation import semconv as sc
from ragtoll.instrumentation import setup
from ragtoll.instrumentation.metrics import (
    OTHER,
    BoundedValues,
    Metrics,
    prometheus_reader,
    render_prometheus,
)
from support.otlp import OtlpReceiver
from support.servers import serve_in_thread

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SESSION = "session-d437ce30b1d7f3d4-ed372109"


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    out: dict[str, list[Any]] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


@pytest.fixture
def recorded() -> tuple[Metrics, InMemoryMetricReader, MeterProvider]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    m = Metrics(provider, upstreams=["openai", "docs"], profiles=["tight", "bounded"])
    m.record_call(operation="chat", provider="openai", upstream="openai", kind="llm", outcome="ok",
                  duration_s=0.5, upstream_s=0.48, request_model="gpt-4o-mini", response_model="gpt-4o-mini",
                  input_tokens=12, output_tokens=3, cost_usd=0.0000036)
    m.record_call(operation="retrieval", provider="docs", upstream="docs", kind="retrieval", outcome="ok",
                  duration_s=0.002, cache_result="hit", cache_tier="exact", cost_usd=0.0)
    m.record_call(operation="chat", provider="openai", upstream="openai", kind="llm", outcome="rejected",
                  duration_s=0.001, request_model="gpt-4o-mini", rejected_dimension="max_steps",
                  budget_mode="enforce")
    m.record_task_end(cost_usd=0.0000036, calls=3, profile="tight", exceeded=True, reason="idle")
    return m, reader, provider


def test_calls_tokens_duration_and_task_end_are_recorded(
    recorded: tuple[Metrics, InMemoryMetricReader, MeterProvider],
) -> None:
    _, reader, provider = recorded
    got = points(reader)
    calls = {(p.attributes["ragtoll.upstream.kind"], p.attributes["ragtoll.outcome"]): p.value
             for p in got["ragtoll.calls"]}
    assert calls == {("llm", "ok"): 1, ("retrieval", "ok"): 1, ("llm", "rejected"): 1}
    tokens = {p.attributes["gen_ai.token.type"]: p.sum for p in got["gen_ai.client.token.usage"]}
    assert tokens == {"input": 12, "output": 3}
    token_point = got["gen_ai.client.token.usage"][0]
    assert token_point.attributes["gen_ai.operation.name"] == "chat"
    assert token_point.attributes["gen_ai.provider.name"] == "openai"
    assert token_point.attributes["gen_ai.request.model"] == "gpt-4o-mini"
    # the rejected call reached no model: no GenAI duration for it
    assert sum(p.count for p in got["gen_ai.client.operation.duration"]) == 2
    (rejection,) = got["ragtoll.rejections"]
    assert dict(rejection.attributes) == {"ragtoll.budget.exceeded.dimension": "max_steps",
                                          "ragtoll.budget.mode": "enforce"}
    (lookup,) = got["ragtoll.cache.lookups"]
    assert dict(lookup.attributes) == {"ragtoll.cache.result": "hit", "ragtoll.cache.tier": "exact"}
    (cost,) = got["ragtoll.cost"]  # zero-cost calls add nothing
    assert cost.value == pytest.approx(0.0000036)
    overhead = {p.attributes["ragtoll.upstream.kind"] + "/" + p.attributes["ragtoll.outcome"]: p.sum
                for p in got["ragtoll.proxy.overhead"]}
    assert overhead["llm/ok"] == pytest.approx(0.02)  # 0.5 s total minus 0.48 s upstream
    (task_cost,) = got["ragtoll.task.cost"]
    (task_calls,) = got["ragtoll.task.calls"]
    assert task_calls.sum == 3 and task_calls.count == 1
    assert dict(task_cost.attributes) == {"ragtoll.budget.profile": "tight", "ragtoll.budget.exceeded": True,
                                          "ragtoll.task.end_reason": "idle"}
    provider.shutdown()


def test_units_and_buckets_follow_the_genai_conventions(
    recorded: tuple[Metrics, InMemoryMetricReader, MeterProvider],
) -> None:
    _, reader, provider = recorded
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert metrics["gen_ai.client.token.usage"].unit == "{token}"
    assert metrics["gen_ai.client.operation.duration"].unit == "s"
    assert metrics["ragtoll.proxy.overhead"].unit == "s"
    assert metrics["ragtoll.cost"].unit == "USD"
    bounds = metrics["gen_ai.client.token.usage"].data.data_points[0].explicit_bounds
    assert tuple(bounds)[:3] == (1, 4, 16)
    provider.shutdown()


def test_unbounded_values_never_become_labels() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    m = Metrics(provider, upstreams=["openai"], max_models=3)
    for i in range(20):  # a client varying the model name at will
        m.record_call(operation="chat", provider="openai", upstream="openai", kind="llm", outcome="ok",
                      duration_s=0.1, request_model=f"model-{i}", input_tokens=1)
    for hostile in (TRACE_ID, SESSION, "9b2e7c1a-5d4f-4e3b-8a6c-1f2d3e4c5b6a", "a b c", "x" * 200):
        m.record_call(operation=hostile, provider=hostile, upstream=hostile, kind=hostile, outcome=hostile,
                      duration_s=0.1, request_model=hostile, error_type=hostile, rejected_dimension=hostile,
                      cache_result=hostile, cache_tier=hostile)
        m.record_task_end(cost_usd=0.1, calls=1, profile=hostile, reason=hostile)
    values: dict[str, set[str]] = {}
    for name, pts in points(reader).items():
        for p in pts:
            for key, value in p.attributes.items():
                values.setdefault(f"{name}:{key}", set()).add(str(value))
    models = values["gen_ai.client.token.usage:gen_ai.request.model"]
    assert models == {"model-0", "model-1", "model-2", OTHER}
    for label in set().union(*values.values()):
        assert not _looks_like_an_id(label), label
    provider.shutdown()


def _looks_like_an_id(value: str) -> bool:
    return bool(re.search(r"[0-9a-f]{16}|[0-9a-f]{8}-[0-9a-f]{4}|session-", value)) or len(value) > 80


def test_bounded_values_keep_configured_names_and_reject_id_shapes() -> None:
    bounded = BoundedValues(2, known=["openai"])
    assert bounded("openai") == "openai"
    assert bounded("gpt-4o-2024-08-06") == "gpt-4o-2024-08-06"  # dates are not ids
    assert bounded("other-model") == OTHER  # the set is full
    assert bounded(f"ft:gpt-4o:{TRACE_ID}") == OTHER
    assert bounded(None) is None


def test_attribute_keys_outside_the_allow_list_are_refused() -> None:
    with pytest.raises(ValueError, match="ragtoll.task.id"):
        Metrics._attributes({"ragtoll.task.id": "t1"})


def test_metrics_text_for_prometheus_from_a_private_registry() -> None:
    first, second = prometheus_reader(), prometheus_reader()  # two apps in one process: no clash
    provider = MeterProvider(metric_readers=[first])
    other = MeterProvider(metric_readers=[second])
    m = Metrics(provider, upstreams=["openai"], profiles=["tight"])
    m.record_call(operation="chat", provider="openai", upstream="openai", kind="llm", outcome="ok",
                  duration_s=0.25, upstream_s=0.2, request_model="gpt-4o-mini", input_tokens=12,
                  output_tokens=3, cost_usd=0.002)
    m.record_task_end(cost_usd=0.002, calls=1, profile="tight", reason="explicit")
    body, content_type = render_prometheus(first)
    text = body.decode()
    assert content_type.startswith("text/plain")
    assert 'ragtoll_calls_total{' in text and 'ragtoll_upstream_kind="llm"' in text
    assert "gen_ai_client_token_usage_bucket{" in text
    assert "gen_ai_client_operation_duration_seconds_bucket{" in text
    assert "ragtoll_proxy_overhead_seconds_sum{" in text
    assert "ragtoll_task_calls_count{" in text
    assert re.search(r'ragtoll_cost_\w*total\{[^}]*\} 0\.002', text)
    # every series of ragtoll's own (target_info carries the process's resource, once per process)
    series = [line for line in text.splitlines() if line.startswith(("ragtoll_", "gen_ai_"))]
    labels = [v for line in series for v in re.findall(r'="([^"]*)"', line)]
    assert len(series) > 20 and labels and not any(_looks_like_an_id(v) for v in labels)
    assert "ragtoll_calls" not in render_prometheus(second)[0].decode()
    om_body, om_type = render_prometheus(first, "application/openmetrics-text; version=1.0.0")
    assert om_type.startswith("application/openmetrics-text") and om_body.rstrip().endswith(b"# EOF")
    provider.shutdown()
    other.shutdown()


def test_every_instrument_arrives_over_otlp_http() -> None:
    receiver = OtlpReceiver()
    with serve_in_thread(receiver) as otlp:
        provider = setup.meter_provider({"OTEL_EXPORTER_OTLP_ENDPOINT": otlp})
        m = Metrics(provider, upstreams=["openai"], profiles=["tight"])
        m.record_call(operation="chat", provider="openai", upstream="openai", kind="llm", outcome="rejected",
                      duration_s=0.1, input_tokens=1, output_tokens=1, cost_usd=0.001,
                      rejected_dimension="max_steps", cache_result="miss", cache_tier="exact")
        m.record_call(operation="chat", provider="openai", upstream="openai", kind="llm", outcome="ok",
                      duration_s=0.1)
        m.record_task_end(cost_usd=0.001, calls=2, profile="tight")
        provider.force_flush()
        provider.shutdown()
    assert receiver.metric_names == {
        sc.METRIC_TOKEN_USAGE, sc.METRIC_OPERATION_DURATION, sc.METRIC_CALLS, sc.METRIC_REJECTIONS,
        sc.METRIC_CACHE_LOOKUPS, sc.METRIC_COST, sc.METRIC_OVERHEAD, sc.METRIC_TASK_COST,
        sc.METRIC_TASK_CALLS,
    }


def test_task_end_records_groundedness_cached_input_and_resent_evidence() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    m = Metrics(provider, profiles=["tight"])
    m.record_task_end(cost_usd=0.01, calls=4, profile="tight", reason="explicit", groundedness=0.75,
                      input_tokens=4000, cached_input_tokens=3000, evidence_tokens=900, evidence_resent_tokens=600)
    m.record_task_end(cost_usd=0.01, calls=2, profile="tight", reason="explicit", groundedness=None)  # not graded
    # no cache read: 0 is added (a ratio reads 0, not "no data"); a task without the numbers adds nothing
    m.record_task_end(cost_usd=0.01, calls=1, profile="tight", reason="idle", input_tokens=10, cached_input_tokens=0)
    got = points(reader)
    (grounded,) = got[sc.METRIC_TASK_GROUNDEDNESS]
    assert (grounded.count, grounded.sum) == (1, 0.75)
    assert dict(grounded.attributes)[sc.PROFILE] == "tight"
    totals = {name: sum(p.value for p in got[name]) for name in (
        sc.METRIC_TASK_INPUT_TOKENS, sc.METRIC_TASK_CACHED_INPUT_TOKENS, sc.METRIC_TASK_EVIDENCE_TOKENS,
        sc.METRIC_TASK_EVIDENCE_RESENT_TOKENS)}
    assert list(totals.values()) == [4010, 3000, 900, 600]
    assert len(got[sc.METRIC_TASK_CACHED_INPUT_TOKENS]) == 2  # explicit and idle: a 0 point for the idle one
    provider.shutdown()
