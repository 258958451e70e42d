"""Budgets on Redis end to end: records to a stream, and a store that stops mid-test (open / closed)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import orjson
import pytest
import redis
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.stores.breaker import STORE_RETRY_MS
from ragtoll.proxy.stores.redis import task_keys
from support.poll import wait_until
from support.redis_server import start_redis, stop_all
from test_budgets import TOKEN, budgets, call_spans, chat, remaining, task, upstreams


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", TOKEN)


def test_redis_store_enforces_and_records_to_a_stream(proxy: ProxyFactory, upstream: Upstream, redis_url: str) -> None:
    stream = f"ragtoll:records:{uuid.uuid4().hex}"
    t = task()
    cfg = {**budgets(max_steps=2), "records_stream": stream}
    with proxy(upstreams=upstreams(upstream.url), store=redis_url, budgets=cfg) as base, httpx.Client() as http:
        codes = [chat(http, base, t).status_code for _ in range(3)]
        ready = http.get(f"{base}/readyz")
        end = http.post(f"{base}/admin/tasks/{t}/end", headers={"authorization": f"Bearer {TOKEN}"},
                        json={"correct": False})
    assert codes == [200, 200, 402]
    assert ready.json() == {"status": "ready", "store": "redis"}
    client = redis.Redis.from_url(redis_url)
    try:
        entries = client.xrange(stream)
        client.delete(stream)
    finally:
        client.close()
    assert len(entries) == 1
    record = orjson.loads(entries[0][1][b"record"])
    assert record == end.json()
    assert (record["task_id"], record["steps"], record["rejections"], record["outcome"]) == \
        (t, 2, {"max_steps": 1}, {"correct": False})


def test_per_call_tasks_end_with_their_call_on_redis(proxy: ProxyFactory, upstream: Upstream, redis_url: str) -> None:
    """On the shared store too, a per-call task ends as its call is settled: its record reaches the
    stream while the proxy serves, and its ledger is gone from Redis (nothing left for a sweep)."""
    stream = f"ragtoll:records:{uuid.uuid4().hex}"
    cfg = {**budgets(max_steps=1), "records_stream": stream}
    client = redis.Redis.from_url(redis_url)
    try:
        with proxy(upstreams=upstreams(upstream.url), store=redis_url, budgets=cfg,
                   tasks={"untracked": "per-call", "idle_timeout_s": 3600}) as base, httpx.Client() as http:
            ids = []
            for _ in range(3):
                r = http.post(f"{base}/openai/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": []})
                assert r.status_code == 200, r.text
                ids.append(r.headers["x-ragtoll-task-id"])
            wait_until(lambda: client.xlen(stream) >= 3)
            entries = client.xrange(stream)
            # the task's keys share one hash tag: match its prefix, not the id (which keys never hold)
            left = [key for t in ids for key in client.scan_iter(match=task_keys(t)[0][:-1] + "*")]
            assert all(client.exists(task_keys(t)[0]) == 0 for t in ids)
    finally:
        client.delete(stream)
        client.close()
    records = [orjson.loads(e[1][b"record"]) for e in entries]
    assert sorted(r["task_id"] for r in records) == sorted(ids)
    assert {(r["end_reason"], r["calls"], r["task_source"]) for r in records} == {("call", 1, "per-call")}
    assert left == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["open", "closed"])
def test_store_stopped_mid_test(proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry, mode: str) -> None:
    server = start_redis()
    t = task()
    overrides: dict[str, Any] = {"upstreams": upstreams(upstream.url), "store": server.url,
                                 "on_store_error": mode, "store_timeout_ms": 200, "budgets": budgets(max_steps=5)}
    try:
        with proxy(**overrides) as base, httpx.Client(timeout=10) as http:
            before = chat(http, base, t)
            server.stop()
            during = chat(http, base, t)
            ready = http.get(f"{base}/readyz")
            server.start()  # same port, empty: the proxy reconnects once the retry window passes
            time.sleep(STORE_RETRY_MS / 1000 + 0.2)
            after = chat(http, base, t)
    finally:
        stop_all([server])
    assert before.status_code == 200 and remaining(before)["max_steps"] == 4
    assert ready.status_code == 503 and ready.json()["status"] == "store_unavailable"
    assert after.status_code == 200 and remaining(after)["max_steps"] == 4  # budgets are back (the data is not)
    span = call_spans(telemetry, "chat")[1]  # the call made while the store was down
    assert span.attributes[sc.DEGRADED] is True
    assert any(e.name == sc.EVENT_DEGRADED for e in span.events)
    if mode == "open":  # decided on the replica's local ledger: budgeted, with its own count of the task
        assert during.status_code == 200 and remaining(during)["max_steps"] == 4
        assert upstream.app.state.calls["/v1/chat/completions"] == 3
    else:
        assert during.status_code == 503
        err = during.json()["error"]
        assert err["code"] == "store_unavailable" and err["store"] == server.url
        assert upstream.app.state.calls["/v1/chat/completions"] == 2
