"""No call goes through unbudgeted on a cold or stalled store (`on_store_error: open`, the default).

A replica says ready only once its store answers and its scripts are loaded; while the store's
answer is unknown (a reserve timed out, the breaker skips the store), admissions are decided on the
replica's local ledger with the task's limits, so a burst never forwards more than
`(replicas + 1) x limit` calls of a task (docs "Guarantees"), and each such admission is counted in
`ragtoll_budget_degraded_admissions_total{ragtoll_budget_degraded_bound="local"}`. Real redis-server
processes (paused with CLIENT PAUSE to stall every command), real `ragtoll serve` replicas."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.stores.redis import _script
from support.poll import wait_until
from support.process import RagtollProcess, replicas
from support.redis_server import RedisProcess, start_redis, stop_all
from support.servers import free_port
from test_budgets import CHAT, budgets, upstreams

LIMIT = 5
BURST = 256
REPLICAS = 3
PAUSE_MS = 6000
# /metrics on (the SDK's meter provider is a no-op under OTEL_SDK_DISABLED), nothing exported
METRICS_ONLY = {"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none",
                "OTEL_LOGS_EXPORTER": "none"}


@pytest.fixture
def own_redis() -> Iterator[RedisProcess]:
    """A redis-server of this test's own: it gets paused."""
    server = start_redis()
    try:
        yield server
    finally:
        stop_all([server])


def burst(bases: list[str], task_id: str, n: int = BURST) -> list[httpx.Response]:
    """`n` chat calls of one task, 64 at a time, spread over `bases` in turn."""
    async def main() -> list[httpx.Response]:
        gate = asyncio.Semaphore(64)
        async with httpx.AsyncClient(timeout=60) as http:
            async def one(i: int) -> httpx.Response:
                async with gate:
                    return await http.post(f"{bases[i % len(bases)]}/openai{CHAT}", headers={
                        "x-ragtoll-task-id": task_id, "authorization": "Bearer sk-cold"}, json={
                        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
            return await asyncio.gather(*(one(i) for i in range(n)))
    return asyncio.run(main())


def degraded_admissions(base: str) -> dict[str, float]:
    """`ragtoll_budget_degraded_admissions_total` of one replica, by bound."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    found = re.findall(r'^ragtoll_budget_degraded_admissions_total\{[^}]*ragtoll_budget_degraded_bound="(\w+)"[^}]*\}'
                       r" ([0-9.e+]+)$", text, re.MULTILINE)
    return {bound: float(value) for bound, value in found}


def replica_config(store: str, upstream: Upstream) -> dict[str, Any]:
    return {"store": store, "store_timeout_ms": 250, "cache": {"enabled": False},
            "budgets": budgets(max_steps=LIMIT),
            "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"}]}


@pytest.mark.slow
@pytest.mark.parametrize("stall", ["cold", "paused"])
def test_a_burst_over_three_fresh_replicas_stays_within_the_bound(
        upstream: Upstream, own_redis: RedisProcess, tmp_path: Any, stall: str) -> None:
    """Three replicas just ready on one Redis; a burst of 256 calls of one task against `max_steps: 5`,
    as they come up (cold) or with Redis stalling every command (paused)."""
    procs = [RagtollProcess(tmp_path, replica_config(own_redis.url, upstream), env=METRICS_ONLY, ready="/readyz")
             for _ in range(REPLICAS)]
    task_id = f"cold-{uuid.uuid4().hex}"
    with replicas(procs) as bases:
        if stall == "paused":
            own_redis.pause(PAUSE_MS)
        answers = burst(bases, task_id)
        counted = [degraded_admissions(b) for b in bases]
    forwarded = upstream.app.state.calls.get(CHAT, 0)
    codes = [a.status_code for a in answers]
    assert codes.count(200) == forwarded and codes.count(402) == BURST - forwarded, sorted(set(codes))
    assert LIMIT <= forwarded <= (REPLICAS + 1) * LIMIT, forwarded  # the documented bound
    assert all("none" not in c for c in counted), counted  # no call went through with no bound
    local = sum(c.get("local", 0) for c in counted)
    assert local <= REPLICAS * LIMIT
    if stall == "paused":  # the store never answered in time: every admission was the local ledger's
        assert local == forwarded and forwarded == REPLICAS * LIMIT
        assert all(a.headers.get("x-ragtoll-budget-remaining") for a in answers)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, own_redis: RedisProcess) -> str:
    return "memory" if request.param == "memory" else own_redis.url


@pytest.mark.slow
def test_a_stalled_store_admits_no_more_than_the_limit_per_replica(
        proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry, own_redis: RedisProcess, store: str) -> None:
    cfg = {"upstreams": upstreams(upstream.url), "store": store, "store_timeout_ms": 250,
           "budgets": budgets(max_steps=LIMIT), "cache": {"enabled": False}}
    with proxy(**cfg) as base:
        assert wait_until(lambda: httpx.get(f"{base}/readyz").status_code == 200, 30)
        own_redis.pause(PAUSE_MS)  # only the redis parameter uses it
        answers = burst([base], f"stall-{uuid.uuid4().hex}")
    assert [a.status_code for a in answers].count(200) == LIMIT
    assert upstream.app.state.calls[CHAT] == LIMIT
    points = [p for rm in telemetry.reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics if m.name == sc.METRIC_BUDGET_DEGRADED_ADMISSIONS for p in m.data.data_points]
    by_bound = {p.attributes[sc.BUDGET_DEGRADED_BOUND]: p.value for p in points}
    assert by_bound == ({} if store == "memory" else {"local": LIMIT})


@pytest.mark.slow
def test_ready_only_once_the_store_answers_with_its_scripts_loaded(upstream: Upstream, tmp_path: Any) -> None:
    port = free_port()
    proc = RagtollProcess(tmp_path, replica_config(f"redis://127.0.0.1:{port}/0", upstream)).start()
    server = None
    try:
        first = httpx.get(f"{proc.base}/readyz", timeout=5)
        server = start_redis(port=port)
        assert wait_until(lambda: httpx.get(f"{proc.base}/readyz", timeout=5).status_code == 200, 30)
        client = redis.Redis(port=port)
        try:
            loaded = client.script_exists(_script("reserve")[1], _script("settle")[1], _script("principal_admit")[1])
            connections = len(client.client_list())
        finally:
            client.close()
    finally:
        proc.stop()
        if server is not None:
            stop_all([server])
    assert first.status_code == 503 and first.json()["status"] == "warming"
    assert loaded == [True, True, True]
    assert connections > 8  # the pool was opened before the replica said ready


STREAMS = 48
WORDS = 4000  # each stream would give this many output tokens ("hi": one token each): 192,000 in all
TOKEN_LIMIT = 5000


@pytest.mark.slow
def test_streams_whose_store_stalls_mid_way_stay_within_the_bound(
        upstream: Upstream, own_redis: RedisProcess, tmp_path: Any) -> None:
    """48 streams of one task over three replicas against `max_completion_tokens`; Redis stalls
    while they run, so their extensions time out: they extend on each replica's local ledger instead
    of going on unbudgeted, and together deliver no more than `(replicas + 1) x limit`."""
    # small holds, so every stream is admitted and lives on its extensions (64 tokens each)
    cfg = {**replica_config(own_redis.url, upstream), "tasks": {"idle_timeout_s": 600},
           "budgets": {**budgets(max_completion_tokens=TOKEN_LIMIT), "default_max_output_tokens": 32,
                       "stream_extension_tokens": 64}}
    procs = [RagtollProcess(tmp_path, cfg, env=METRICS_ONLY, ready="/readyz") for _ in range(REPLICAS)]
    task_id = f"streams-{uuid.uuid4().hex}"
    words = ",".join(["hi"] * WORDS)

    async def main(bases: list[str]) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=STREAMS)) as http:
            calls = asyncio.gather(*[
                http.post(f"{bases[i % len(bases)]}/openai{CHAT}", json={
                    "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": True},
                    headers={"x-ragtoll-task-id": task_id, "x-test-words": words, "x-test-delay": "0.002"})
                for i in range(STREAMS)])
            await asyncio.sleep(0.3)  # the streams are under way (admitted by the store, most of them)
            await asyncio.to_thread(own_redis.pause, PAUSE_MS)
            return await calls

    with replicas(procs) as bases:
        answers = asyncio.run(main(bases))
    delivered = sum(r.content.count(b'"content":"hi"') for r in answers if r.status_code == 200)
    assert {r.status_code for r in answers} <= {200, 429}
    assert delivered <= (REPLICAS + 1) * TOKEN_LIMIT, delivered
    assert any(r.status_code == 200 and b'"finish_reason":"length"' in r.content for r in answers)  # cut cleanly
