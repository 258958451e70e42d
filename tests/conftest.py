"""Shared fixtures: a loopback fake upstream (and a faulty one), ragtoll served on loopback, OTel in-memory,
real Redis, the admin token."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore
from ragtoll.proxy.stores.evidence_redis import RedisEvidenceStore
from support.admin import ADMIN_TOKEN
from support.budget_cluster import start_budget_cluster
from support.faulty import FaultyUpstream
from support.redis_server import env_redis_url, start_redis, stop_all
from support.servers import serve_in_thread
from support.upstream import UpstreamApp


@dataclass
class Upstream:
    url: str
    app: UpstreamApp


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    app = UpstreamApp()
    with serve_in_thread(app) as url:
        yield Upstream(url, app)


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyUpstream]:
    """An upstream that misbehaves as each request's `x-fault` header asks (support/faulty.py)."""
    with FaultyUpstream() as up:
        yield up


@pytest.fixture
def admin_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """The admin API's token, set where the proxy under test reads it (RAGTOLL_ADMIN_TOKEN)."""
    monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", ADMIN_TOKEN)
    return ADMIN_TOKEN


@pytest.fixture(autouse=True)
def _reset_upstream_counts(request: pytest.FixtureRequest) -> None:
    if "upstream" in request.fixturenames:
        request.getfixturevalue("upstream").app.state.reset()


@dataclass
class Telemetry:
    tracer_provider: TracerProvider
    exporter: InMemorySpanExporter
    meter_provider: MeterProvider
    reader: InMemoryMetricReader

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())

    def by_name(self, name: str) -> list[Any]:
        return [s for s in self.spans() if s.name == name]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    yield Telemetry(tp, exporter, mp, reader)
    tp.shutdown()
    mp.shutdown()


def default_upstreams(base: str) -> list[dict[str, Any]]:
    return [
        {"name": "openai", "kind": "llm", "api": "openai", "url": base, "prefix": "/openai"},
        {"name": "docs", "kind": "retrieval", "api": "passthrough", "url": base, "prefix": "/docs"},
        {"name": "raw", "kind": "other", "api": "passthrough", "url": base, "prefix": "/raw"},
        {"name": "trusted", "kind": "other", "api": "passthrough", "url": base, "prefix": "/trusted", "trusted": True},
    ]


ProxyFactory = Callable[..., contextlib.AbstractContextManager[str]]


@pytest.fixture
def proxy(upstream: Upstream, telemetry: Telemetry, tmp_path: Any) -> ProxyFactory:
    """`with proxy(**overrides) as base_url:` serves ragtoll on loopback against the fake upstream.

    Task records go to a file in the test's tmp dir unless the overrides say otherwise."""

    @contextlib.contextmanager
    def make(**overrides: Any) -> Iterator[str]:
        raw: dict[str, Any] = {"upstreams": default_upstreams(upstream.url)}
        raw.update(overrides)
        raw["budgets"] = {"records_file": str(tmp_path / "records.jsonl"), **raw.get("budgets", {})}
        settings = config.parse(raw)
        app = build_app(settings, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider)
        with serve_in_thread(app) as url:
            yield url

    return make


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """REDIS_URL when set, else a redis-server spawned on a free loopback port for this session."""
    url = env_redis_url()
    if url:
        yield url
        return
    proc = start_redis()
    try:
        yield proc.url
    finally:
        stop_all([proc])


@pytest.fixture(params=["memory", "redis"])
async def evidence_store(request: pytest.FixtureRequest) -> AsyncIterator[MemoryEvidenceStore | RedisEvidenceStore]:
    """An evidence store, in memory and then on the session's Redis."""
    if request.param == "memory":
        yield MemoryEvidenceStore()
        return
    s = RedisEvidenceStore.from_url(request.getfixturevalue("redis_url"))
    yield s
    await s.aclose()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A 3-master Redis Cluster spawned for this session (about 2 s to start: tests using it are slow)."""
    nodes = start_budget_cluster(3)
    try:
        yield f"redis+cluster://127.0.0.1:{nodes[0].port}"
    finally:
        stop_all(nodes)
