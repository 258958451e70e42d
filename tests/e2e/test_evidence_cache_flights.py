"""Single flight without herds (issue 30 item 7), end to end on the memory store and on Redis: ragtoll on
loopback in front of a retrieval upstream that holds its first search, then fails or answers.

When the leader's upstream call failed, all 49 waiters went upstream at once; a waiter whose task was
already past `max_latency_ms` waited for the leader before its refusal. Each test failed on the code
before the issue.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from support.asgi import read_body, serve_lifespan
from support.servers import serve_in_thread

WAITERS = 49


def query() -> dict[str, Any]:
    """A query no other test asked (the Redis server, and so its cache, is shared by the session)."""
    return {"query": f"how is leave approved ({uuid.uuid4().hex[:8]})", "top_k": 3}


async def until(condition: Any) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, "the upstream never saw the call"
        await asyncio.sleep(0.01)


class Search:
    """`POST /search`: holds each search until `release` is set (or 20 s), then answers `statuses`
    in turn (the last one for every search after), 200 with a public chunk."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.calls = 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        if await read_body(receive) is None:
            return
        with self.lock:
            n = self.calls
            self.calls += 1
        deadline = time.monotonic() + 20
        while not self.release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        status = self.statuses[min(n, len(self.statuses) - 1)]
        body = {"results": [{"id": f"leave@{n}", "text": "Leave is approved by HR.", "score": 0.9,
                             "metadata": {"groups": ["public"]}}]} if status == 200 else {"error": "boom"}
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": orjson.dumps(body)})


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    return "memory" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


@contextlib.contextmanager
def ragtoll(app: Search, store: str, telemetry: Any, budgets: dict[str, Any] | None = None,
            read_s: float = 30.0) -> Iterator[str]:
    with serve_in_thread(app) as url:
        raw: dict[str, Any] = {
            "upstreams": [{"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs",
                           "fields": {"acl": "metadata.groups"}, "timeouts": {"read": read_s}}],
            "identity": {"mode": "header"},
            "store": store,
            "budgets": budgets or {"default_profile": "open", "profiles": {"open": {"max_calls": 1000}}},
            "cache": {"embedder": "none"},
        }
        proxy = build_app(config.parse(raw), tracer_provider=telemetry.tracer_provider,
                          meter_provider=telemetry.meter_provider, env={})
        with serve_in_thread(proxy) as base:
            yield base


def headers(task: str) -> dict[str, str]:
    return {"x-ragtoll-task-id": task, "x-auth-subject": "u1", "x-auth-groups": "public"}


async def burst(base: str, app: Search, query: dict[str, Any], tag: str, *, release: bool = True,
                leaves: bool = False) -> tuple[httpx.Response | None, list[httpx.Response]]:
    """The leader goes upstream and is held there; 49 duplicates arrive and wait; then the upstream
    answers (`release`), or the leader's client goes away (`leaves`: None for its answer)."""
    limits = httpx.Limits(max_connections=WAITERS + 5)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client, httpx.AsyncClient(timeout=30) as own:
        def post(task: str, via: httpx.AsyncClient = client) -> Any:
            return via.post(f"{base}/docs/search", json=query, headers=headers(task))

        leader = asyncio.ensure_future(post(f"{tag}-leader", own))
        await until(lambda: app.calls > 0)
        waiters = [asyncio.ensure_future(post(f"{tag}-{i}")) for i in range(WAITERS)]
        await asyncio.sleep(1.0)  # setup: every duplicate has reached ragtoll and waits for the leader
        if leaves:
            leader.cancel()
            await own.aclose()  # the leader's connection closes: ragtoll cancels its call
            await until(lambda: app.calls > 1)  # one waiter took the key over
            await asyncio.sleep(0.5)  # setup: had the others gone upstream too, they would be there now
        if release:
            app.release.set()
        answers = list(await asyncio.gather(*waiters))
        return (None if leaves else await leader), answers


@pytest.mark.slow
def test_a_failed_leader_hands_its_key_to_one_waiter(store: str, telemetry: Any) -> None:
    """The leader's call fails (500): one waiter retries, the 48 others are served its answer."""
    app = Search([500, 200])
    with ragtoll(app, store, telemetry) as base:
        leader, waiters = asyncio.run(burst(base, app, query(), "recover"))
    assert leader is not None and leader.status_code == 500
    assert app.calls == 2  # the leader's call and one retry, not 50
    assert [w.status_code for w in waiters] == [200] * WAITERS
    assert {w.json()["results"][0]["id"] for w in waiters} == {"leave@1"}
    assert sum(w.headers.get("x-ragtoll-cache", "").startswith("hit") for w in waiters) == WAITERS - 1


@pytest.mark.slow
def test_an_upstream_failing_twice_in_a_row_fails_the_waiters_without_more_calls(store: str,
                                                                                 telemetry: Any) -> None:
    app = Search([500])
    with ragtoll(app, store, telemetry) as base:
        leader, waiters = asyncio.run(burst(base, app, query(), "down"))
    assert leader is not None and leader.status_code == 500
    assert app.calls == 2  # MAX_FAILURES upstream calls, then the waiters get the failure
    statuses = sorted(w.status_code for w in waiters)
    assert statuses == [500] + [502] * (WAITERS - 1)  # the retry's own answer, then ragtoll's 502 JSON
    refused = next(w for w in waiters if w.status_code == 502)
    assert refused.json()["error"]["code"] == "upstream_unavailable"
    assert "failed 2 times in a row" in refused.json()["error"]["message"]


@pytest.mark.slow
def test_a_leader_whose_client_vanished_hands_its_key_to_one_waiter(store: str, telemetry: Any) -> None:
    app = Search([200])
    with ragtoll(app, store, telemetry) as base:
        _, waiters = asyncio.run(burst(base, app, query(), "vanish", leaves=True))
    assert app.calls == 2  # the vanished leader's call and one waiter's
    assert [w.status_code for w in waiters] == [200] * WAITERS
    assert sum(w.headers.get("x-ragtoll-cache", "").startswith("hit") for w in waiters) == WAITERS - 1


@pytest.mark.slow
def test_a_hanging_upstream_gets_two_calls_not_fifty(store: str, telemetry: Any) -> None:
    """The upstream never answers: the leader's read timeout fails it, one waiter retries, and its
    timeout fails the rest."""
    app = Search([200])
    with ragtoll(app, store, telemetry, read_s=1.5) as base:
        leader, waiters = asyncio.run(burst(base, app, query(), "hang", release=False))
        app.release.set()
    assert app.calls == 2
    assert leader is not None and leader.status_code == 504
    # each waiter's own read timeout (504) or the two failures in a row (502): none went upstream
    assert {w.status_code for w in waiters} <= {502, 504} and all(w.json()["error"]["code"] for w in waiters)


@pytest.mark.slow
def test_a_waiter_past_its_deadline_is_refused_without_waiting(store: str, telemetry: Any) -> None:
    """A duplicate whose task has passed `max_latency_ms` gets its refusal while the leader is still
    upstream (it used to wait for the leader first)."""
    app = Search([200])
    budgets = {"default_profile": "quick", "profiles": {"quick": {"max_calls": 100, "max_latency_ms": 300}}}
    with ragtoll(app, store, telemetry, budgets) as base:
        async def run() -> tuple[httpx.Response, bool]:
            async with httpx.AsyncClient(timeout=30) as client:
                other, same = query(), query()
                app.release.set()
                first = await client.post(f"{base}/docs/search", json=other, headers=headers("late"))
                assert first.status_code == 200  # the late task's clock starts
                app.release.clear()
                await asyncio.sleep(0.5)  # setup: the late task is past its 300 ms
                leader = asyncio.ensure_future(client.post(f"{base}/docs/search", json=same,
                                                           headers=headers("leader")))
                await until(lambda: app.calls >= 2)
                late = await client.post(f"{base}/docs/search", json=same, headers=headers("late"))
                held = not app.release.is_set() and not leader.done()
                app.release.set()
                await leader
                return late, held
        late, held = asyncio.run(run())
    assert held  # answered while the leader was still held upstream: it did not wait
    assert late.status_code == 429 and late.json()["error"]["dimension"] == "max_latency_ms"
    assert app.calls == 2
