"""Budgets across tasks (`principals:`) end to end over loopback, on memory, Redis and a 3-master
Redis Cluster: rotating task ids or User-Agents gains nothing, concurrent tasks are bounded until
one ends, the rolling cost ceiling holds, overrides by principal id, and the 429 contract."""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import uuid
from typing import Any

import httpx
import pytest
import redis
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.stores.principals import principal_keys
from support.poll import wait_until
from support.process import RagtollProcess, replicas
from test_budgets import CHAT, PRICING, TOKEN, budgets, call_spans, chat, task, upstreams

KEY = "Bearer sk-team-a"
CLUSTER = pytest.param("cluster", marks=pytest.mark.slow)


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", TOKEN)


@pytest.fixture(params=["memory", "redis", CLUSTER])
def store(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory"
    return str(request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url"))


def settings(store: str, principals: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"store": store, "store_timeout_ms": 3000, "cache": {"enabled": False}, "pricing": PRICING,
            "budgets": budgets(max_steps=50), "principals": principals, **extra}


def rotate(base: str, n: int, headers: Any, bases: list[str] | None = None) -> list[httpx.Response]:
    """`n` chat calls, 32 at a time; `headers(i)` gives the headers of call i; call i goes to
    `bases[i % len(bases)]` when given (replicas), else to `base`."""
    async def main() -> list[httpx.Response]:
        gate = asyncio.Semaphore(32)
        async with httpx.AsyncClient(timeout=30) as http:
            async def one(i: int) -> httpx.Response:
                async with gate:
                    url = bases[i % len(bases)] if bases else base
                    return await http.post(f"{url}/openai{CHAT}", headers=headers(i), json={
                        "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
            return await asyncio.gather(*(one(i) for i in range(n)))
    return asyncio.run(main())


@pytest.mark.slow
def test_a_thousand_rotated_task_ids_are_stopped_by_new_tasks_per_minute(
        proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry, store: str) -> None:
    key = f"Bearer sk-{uuid.uuid4().hex}"  # a principal of its own on the shared Redis
    cfg = settings(store, {"default": {"max_new_tasks_per_minute": 10}})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base:
        answers = rotate(base, 1000, lambda i: {"authorization": key, "x-ragtoll-task-id": f"rot-{uuid.uuid4().hex}"})
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 10 and codes.count(402) == 990
    assert upstream.app.state.calls[CHAT] == 10
    refused = next(a for a in answers if a.status_code == 402)
    assert refused.headers["x-should-retry"] == "false" and "retry-after" not in refused.headers
    assert refused.headers["x-ragtoll-budget-remaining"] == "max_new_tasks_per_minute=0"
    err = refused.json()["error"]
    assert (err["code"], err["dimension"], err["scope"], err["limit"], err["used"]) == \
        ("budget_exceeded", "max_new_tasks_per_minute", "principal", 10, 10)
    assert err["principal"].startswith("key:") and key not in refused.text  # the credential is never echoed
    span = next(s for s in call_spans(telemetry, "chat") if s.attributes.get(sc.BUDGET_EXCEEDED))
    assert span.attributes[sc.BUDGET_SCOPE] == "principal"
    assert span.attributes[sc.BUDGET_EXCEEDED_DIMENSION] == "max_new_tasks_per_minute"
    assert rejections(telemetry) == {"max_new_tasks_per_minute": 990}


def rejections(telemetry: Telemetry) -> dict[str, int]:
    """The rejection counter by dimension."""
    data = telemetry.reader.get_metrics_data()
    return {p.attributes[sc.BUDGET_EXCEEDED_DIMENSION]: p.value for rm in (data.resource_metrics if data else [])
            for sm in rm.scope_metrics for m in sm.metrics if m.name == sc.METRIC_REJECTIONS
            for p in m.data.data_points}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_rotated_task_ids_over_three_replicas(kind: str, upstream: Upstream, redis_url: str,
                                              request: pytest.FixtureRequest, tmp_path: Any) -> None:
    store = redis_url if kind == "redis" else request.getfixturevalue("redis_cluster_url")
    cfg = {**settings(store, {"default": {"max_new_tasks_per_minute": 10}}), "on_store_error": "closed",
           "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"}]}
    procs = [RagtollProcess(tmp_path, cfg, ready="/readyz") for _ in range(3)]
    key = f"Bearer sk-{uuid.uuid4().hex}"
    with replicas(procs) as bases:
        answers = rotate("", 300, lambda i: {"authorization": key, "x-ragtoll-task-id": f"rot-{uuid.uuid4().hex}"},
                         bases=bases)
    assert sum(a.status_code == 200 for a in answers) == 10 and upstream.app.state.calls[CHAT] == 10
    assert {a.json()["error"]["dimension"] for a in answers if a.status_code != 200} == {"max_new_tasks_per_minute"}


@pytest.mark.slow
def test_rotated_user_agents_under_the_session_policy_are_stopped(proxy: ProxyFactory, upstream: Upstream) -> None:
    # no task id: each User-Agent is a session (a task) of its own; the principal is the address
    cfg = settings("memory", {"default": {"max_new_tasks_per_minute": 5}}, tasks={"untracked": "session"})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base:
        answers = rotate(base, 200, lambda i: {"user-agent": f"agent/{i}"})
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 5 and codes.count(402) == 195
    assert upstream.app.state.calls[CHAT] == 5
    assert len({a.headers["x-ragtoll-task-id"] for a in answers}) == 200  # 200 tasks, 5 admitted
    assert next(a for a in answers if a.status_code == 402).json()["error"]["principal"] == "addr:127.0.0.1"


def test_concurrent_tasks_are_bounded_until_one_ends(proxy: ProxyFactory, upstream: Upstream, store: str) -> None:
    key = f"Bearer sk-{uuid.uuid4().hex}"
    a, b, c = task(), task(), task()
    cfg = settings(store, {"default": {"max_concurrent_tasks": 2}})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=10) as http:
        auth = {"authorization": key}
        first = [chat(http, base, t, auth).status_code for t in (a, b, c)]
        again = chat(http, base, a, auth)  # a live task goes on
        refused = chat(http, base, c, auth).json()["error"]
        ended = http.post(f"{base}/admin/tasks/{a}/end", headers={"authorization": f"Bearer {TOKEN}"})
        # the end frees a's place (the release follows the end call): c starts at its first admitted try
        assert wait_until(lambda: chat(http, base, c, auth).status_code == 200)
        d = chat(http, base, task(), auth)
    assert first == [200, 200, 402] and again.status_code == 200 and ended.status_code == 200
    assert (refused["dimension"], refused["scope"], refused["limit"], refused["used"]) == \
        ("max_concurrent_tasks", "principal", 2, 2)
    assert d.status_code == 402  # b and c are live
    assert upstream.app.state.calls[CHAT] == 4  # a, b, a again, c


@pytest.mark.slow
def test_idle_sweep_frees_the_principals_tasks(proxy: ProxyFactory, upstream: Upstream) -> None:
    cfg = settings("memory", {"default": {"max_concurrent_tasks": 1}}, tasks={"idle_timeout_s": 0.3})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=10) as http:
        assert chat(http, base, task()).status_code == 200
        second = task()
        assert chat(http, base, second).status_code == 402
        assert wait_until(lambda: chat(http, base, second).status_code == 200)  # the first ended idle
    assert upstream.app.state.calls[CHAT] == 2


def _principal_cost(store: str, principal: str) -> int:
    """nano-USD charged to `principal` this hour, read from Redis (0 for memory)."""
    url = store.replace("redis+cluster://", "redis://")
    client = redis.RedisCluster.from_url(url) if store.startswith("redis+cluster://") else redis.Redis.from_url(url)
    try:
        return sum(int(v) for v in client.hgetall(principal_keys(principal)[3]).values())
    finally:
        client.close()


def _charged_at_least(store: str, principal: str, nusd: int) -> bool:
    return _principal_cost(store, principal) >= nusd


def test_cost_per_hour_ceiling_across_tasks(proxy: ProxyFactory, upstream: Upstream, store: str) -> None:
    # each call: 12 prompt + 3 completion tokens of gpt-4o-mini = $0.0000036; the ceiling $0.00001
    # admits calls while less than it was settled: 3 calls ($0.0000108), then every task is refused
    cfg = settings(store, {"default": {"max_cost_usd_per_hour": 0.00001}})
    key = f"Bearer sk-{uuid.uuid4().hex}"
    pid = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "principal-id", "--authorization", key],
                         capture_output=True, text=True, check=True).stdout.strip()
    codes = []
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=10) as http:
        for _ in range(5):
            resp = chat(http, base, task(), {"authorization": key})
            codes.append(resp.status_code)
            charged = 3600 * codes.count(200)
            if store != "memory" and resp.status_code == 200:  # the charge follows the response
                assert wait_until(functools.partial(_charged_at_least, store, pid, charged))
    assert codes == [200, 200, 200, 402, 402]
    err = resp.json()["error"]
    assert (err["dimension"], err["scope"], err["principal"], err["limit"]) == \
        ("max_cost_usd_per_hour", "principal", pid, 0.00001)
    assert err["used"] == pytest.approx(0.0000108)
    assert upstream.app.state.calls[CHAT] == 3


def test_overrides_by_verified_identity(proxy: ProxyFactory, upstream: Upstream) -> None:
    cfg = settings("memory", {"default": {"max_new_tasks_per_minute": 1},
                              "overrides": {"sub:acme/alice": {"max_new_tasks_per_minute": 3}}},
                   identity={"mode": "header"})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=10) as http:
        alice = {"x-auth-subject": "alice", "x-auth-tenant": "acme", "authorization": KEY}
        bob = {"x-auth-subject": "bob", "x-auth-tenant": "acme", "authorization": KEY}  # same key, other person
        a = [chat(http, base, task(), alice).status_code for _ in range(4)]
        b = [chat(http, base, task(), bob) for _ in range(2)]
    assert a == [200, 200, 200, 402]
    assert [r.status_code for r in b] == [200, 402]
    assert b[1].json()["error"]["principal"] == "sub:acme/bob"


def test_shadow_mode_counts_and_refuses_nothing(proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry) -> None:
    cfg = settings("memory", {"default": {"max_new_tasks_per_minute": 1}})
    cfg["budgets"] = {**cfg["budgets"], "mode": "shadow"}
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=10) as http:
        codes = [chat(http, base, task()).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    spans = call_spans(telemetry, "chat")
    assert [s.attributes.get(sc.BUDGET_WOULD_REJECT) for s in spans] == \
        [None, "max_new_tasks_per_minute", "max_new_tasks_per_minute"]
    assert spans[1].attributes[sc.BUDGET_SCOPE] == "principal"
    assert spans[0].attributes[sc.PRINCIPAL_ID] == "addr:127.0.0.1"


def test_principal_keys_share_one_cluster_slot() -> None:
    from redis.crc import key_slot

    assert len({key_slot(k.encode()) for k in principal_keys("key:abc")}) == 1
