"""What the evidence cache may serve (issue 22), end to end: ragtoll on loopback in front of a retrieval
stack like the one the issue was found with - per-chunk ACLs filtered by the caller's groups, an index
version header and a version URL, a Qdrant-style collection API.

Evidence is scoped to where the query went and to the principal's view, fresh within a bound, and a
duplicate of a retrieval in flight waits for it. Each test here failed on the code before the issue.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from support.asgi import read_body, serve_lifespan
from support.servers import serve_in_thread

DOCS = {
    "leave-public": ("Leave policy: 25 days a year for everyone.", ["public"]),
    "leave-hr": ("HR only: how leave requests are approved and audited.", ["hr"]),
    "pay-public": ("Pay dates: the last working day of the month.", ["public"]),
}


class Stack:
    """The issue's retrieval stack. `POST <any path>/search {query, top_k, ...}` answers the chunks the
    caller's groups (`x-auth-groups`, the first header) admit, best first, each id naming the path,
    query string and namespace it was answered for; `x-index-version` on every answer; `GET /version`;
    Qdrant-style `/collections/{c}/points/search`, `GET /` and `PUT .../points`. `delay` holds searches."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.version = "v1"
        self.delay = 0.0
        self.acl = {k: list(v[1]) for k, v in DOCS.items()}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        body = await read_body(receive)
        if body is None:
            return
        method, path, qs = scope["method"], scope["path"], scope["query_string"].decode()
        headers = [(k.decode().lower(), v.decode()) for k, v in scope["headers"]]
        groups_header = next((v for k, v in headers if k == "x-auth-groups"), "")
        groups = {g.strip() for g in groups_header.split(",") if g.strip()}
        with self.lock:
            self.calls.append(f"{method} {path}{'?' + qs if qs else ''}")
            version, delay, acl = self.version, self.delay, {k: list(v) for k, v in self.acl.items()}
        if path == "/version":
            return await _json(send, {"version": version}, version)
        if path.startswith("/collections/"):
            return await self._qdrant(send, method, path, body, groups, acl, version)
        if delay:
            await asyncio.sleep(delay)
        doc = orjson.loads(body) if body else {}
        where = f"{path}?{qs}#{doc.get('namespace', '')}"
        results = [{"id": f"{k}@{where}", "text": DOCS[k][0], "score": round(0.9 - i / 10, 2),
                    "metadata": {"groups": acl[k]}}
                   for i, k in enumerate(k for k in DOCS if "public" in acl[k] or groups & set(acl[k]))]
        await _json(send, {"results": results[: int(doc.get("top_k", 3))]}, version)

    async def _qdrant(self, send: Any, method: str, path: str, body: bytes, groups: set[str],
                      acl: dict[str, list[str]], version: str) -> None:
        collection = path.split("/")[2]
        if method != "POST" or not path.endswith("/points/search"):
            return await _json(send, {"result": {"status": "green"}, "status": "ok"}, version)
        doc = orjson.loads(body)
        result = [{"id": f"{k}@{collection}", "score": 0.9, "payload": {"text": DOCS[k][0], "groups": acl[k]}}
                  for k in DOCS if "public" in acl[k] or groups & set(acl[k])]
        await _json(send, {"result": result[: int(doc.get("limit", 3))], "status": "ok"}, version)

    def searches(self) -> list[str]:
        return [c for c in self.calls if not c.startswith("GET /version")]


async def _json(send: Any, doc: Any, version: str) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"x-index-version", version.encode())]})
    await send({"type": "http.response.body", "body": orjson.dumps(doc)})


@pytest.fixture
def stack() -> Iterator[tuple[str, Stack]]:
    app = Stack()
    with serve_in_thread(app) as url:
        yield url, app


CURRENT: list[Any] = []


@pytest.fixture
def ragtoll(stack: tuple[str, Stack], telemetry: Any) -> Any:
    @contextlib.contextmanager
    def make(docs_cache: dict[str, Any] | None = None, **overrides: Any) -> Iterator[str]:
        url = stack[0]
        raw: dict[str, Any] = {
            "upstreams": [
                {"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs",
                 "fields": {"acl": "metadata.groups", "version_header": "x-index-version"},
                 "cache": docs_cache or {}},
                {"name": "qdrant", "kind": "retrieval", "api": "qdrant", "url": url, "prefix": "/qdrant",
                 "fields": {"acl": "payload.groups"}},
            ],
            "identity": {"mode": "header"},  # the auth gateway's x-auth-* headers, forwarded to the stack
            "budgets": {"default_profile": "open", "profiles": {"open": {"max_calls": 100}}},
            "cache": {"embedder": "none"},
        }
        raw.update(overrides)
        proxy = build_app(config.parse(raw), tracer_provider=telemetry.tracer_provider,
                          meter_provider=telemetry.meter_provider, env={})
        CURRENT[:] = [proxy]
        with serve_in_thread(proxy) as base:
            yield base

    return make


def post(base: str, path: str, body: dict[str, Any], groups: str | None = "public", subject: str | None = "u1",
         task: str = "t1", headers: list[tuple[str, str]] | None = None) -> httpx.Response:
    h: list[tuple[str, str]] = [("x-ragtoll-task-id", task)]
    if subject is not None:
        h.append(("x-auth-subject", subject))
    if groups is not None:
        h.append(("x-auth-groups", groups))
    r = httpx.post(base + path, content=orjson.dumps(body), headers=h + (headers or []), timeout=10)
    filed()
    return r


def filed() -> None:
    deadline = time.monotonic() + 10
    while CURRENT and CURRENT[0].cache is not None and CURRENT[0].cache.pending_filings \
            and time.monotonic() < deadline:
        time.sleep(0.005)


def ids(r: httpx.Response) -> list[str]:
    return [x["id"] for x in r.json()["results"]]


def cache_spans(telemetry: Any) -> list[dict[str, Any]]:
    spans = [s for s in telemetry.spans() if s.name.startswith("retrieval")]
    return [dict(s.attributes) for s in sorted(spans, key=lambda s: s.start_time)]


Q = {"query": "how is leave approved", "top_k": 3}


# --- 1. the partition: everything that selects the evidence -------------------------------------------

@pytest.mark.parametrize(("first", "second"), [
    (("/docs/user-uploads/search", Q), ("/docs/search", Q)),
    (("/docs/search?index=other", Q), ("/docs/search", Q)),
    (("/docs/search", {**Q, "namespace": "other"}), ("/docs/search", Q)),
])
def test_one_user_cannot_plant_evidence_for_another(ragtoll: Any, stack: Any, first: tuple[str, Any],
                                                    second: tuple[str, Any]) -> None:
    _, app = stack
    with ragtoll() as base:
        post(base, first[0], first[1], subject="mallory")
        served = post(base, second[0], second[1], subject="alice")
    assert "x-ragtoll-cache" not in served.headers
    assert app.searches() == [f"POST {first[0].removeprefix('/docs')}", f"POST {second[0].removeprefix('/docs')}"]
    assert all(i.endswith(f"@{second[0].removeprefix('/docs').split('?')[0]}?#") for i in ids(served))


def test_two_qdrant_collections_never_share(ragtoll: Any, stack: Any) -> None:
    _, app = stack
    search = {"vector": [0.1, 0.2, 0.3], "limit": 2}
    with ragtoll() as base:
        post(base, "/qdrant/collections/public_kb/points/search", search)
        private = post(base, "/qdrant/collections/hr_private/points/search", search)
        again = post(base, "/qdrant/collections/public_kb/points/search", search)
    assert "x-ragtoll-cache" not in private.headers
    assert [p["id"] for p in private.json()["result"]] == ["leave-public@hr_private", "pay-public@hr_private"]
    assert again.headers["x-ragtoll-cache"] == "hit; tier=exact"  # a query by vector: the exact tier
    assert len(app.searches()) == 2


# --- 2. the principal's view -----------------------------------------------------------------------------

def test_a_broader_principal_gets_its_own_live_results(ragtoll: Any, stack: Any, telemetry: Any) -> None:
    _, app = stack
    with ragtoll() as base:
        post(base, "/docs/search", Q, groups="public", subject="pat")
        broader = post(base, "/docs/search", Q, groups="public,hr", subject="hana")
        narrower = post(base, "/docs/search", Q, groups="public", subject="paul")
    assert "x-ragtoll-cache" not in broader.headers
    assert "leave-hr@/search?#" in ids(broader)  # what the stack answers public,hr
    assert narrower.headers["x-ragtoll-cache"] == "hit; tier=exact" and "leave-hr@/search?#" not in ids(narrower)
    assert len(app.searches()) == 2
    spans = cache_spans(telemetry)
    assert spans[1][sc.CACHE_REASON] == "view:outside"
    assert spans[2][sc.CACHE_VIEW] == "inside"


# --- 3. freshness -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_version_change_at_the_source_is_served_within_the_bound(ragtoll: Any, stack: Any,
                                                                   telemetry: Any) -> None:
    """The source restricts a chunk and bumps its version; no other call misses meanwhile. Within the
    bound the old answer may still be served (with its version); past it, the probe finds the new one."""
    _, app = stack
    with ragtoll(docs_cache={"max_staleness_s": 1.0, "probe": {"path": "/version"}}) as base:
        first = post(base, "/docs/search", Q)
        with app.lock:
            app.acl["pay-public"], app.version = ["eng"], "v2"
        within = post(base, "/docs/search", Q)
        time.sleep(1.1)
        past = post(base, "/docs/search", Q)
        after = post(base, "/docs/search", Q)
    assert "pay-public@/search?#" in ids(first) and first.headers["x-index-version"] == "v1"
    assert within.headers["x-ragtoll-cache"] == "hit; tier=exact" and within.headers["x-index-version"] == "v1"
    assert "x-ragtoll-cache" not in past.headers and "pay-public@/search?#" not in ids(past)
    assert after.headers["x-ragtoll-cache"] == "hit; tier=exact" and after.headers["x-index-version"] == "v2"
    assert app.calls == ["POST /search", "GET /version", "POST /search"]
    assert cache_spans(telemetry)[2][sc.CACHE_REASON] == "stale:version"


@pytest.mark.slow
def test_past_the_bound_without_a_probe_or_push_nothing_old_is_served(ragtoll: Any, stack: Any) -> None:
    _, app = stack
    with ragtoll(docs_cache={"max_staleness_s": 0.5}) as base:
        post(base, "/docs/search", Q)
        time.sleep(0.6)
        assert "x-ragtoll-cache" not in post(base, "/docs/search", Q).headers
    assert len(app.searches()) == 2


def test_a_lagging_replica_never_rolls_the_version_back(ragtoll: Any, stack: Any) -> None:
    _, app = stack
    with ragtoll() as base:
        post(base, "/docs/search", Q)  # filed at v1
        with app.lock:
            app.acl["pay-public"], app.version = ["eng"], "v2"
        post(base, "/docs/search", {**Q, "query": "pay dates"})  # the source answers v2 now
        with app.lock:
            app.version = "v1"  # ...but one replica lags behind
        post(base, "/docs/search", {**Q, "query": "holidays"})
        with app.lock:
            app.version = "v2"
        current = post(base, "/docs/search", Q)
    assert "x-ragtoll-cache" not in current.headers and "pay-public@/search?#" not in ids(current)
    assert len(app.searches()) == 4


# --- 4. identity ----------------------------------------------------------------------------------------

def test_a_repeated_identity_header_is_a_400_never_a_union(ragtoll: Any, stack: Any) -> None:
    _, app = stack
    with ragtoll() as base:
        r = post(base, "/docs/search", Q, groups="public", headers=[("x-auth-groups", "hr")])
    assert r.status_code == 400 and r.headers["x-should-retry"] == "false"
    assert r.json()["error"]["code"] == "ambiguous_identity"
    assert app.calls == []


def test_a_subject_named_like_a_group_is_not_in_it(ragtoll: Any, stack: Any, telemetry: Any) -> None:
    _, app = stack
    with ragtoll() as base:
        post(base, "/docs/search", Q, groups="hr", subject="hilda")
        named = post(base, "/docs/search", Q, groups=None, subject="hr")
    assert "x-ragtoll-cache" not in named.headers and "leave-hr@/search?#" not in ids(named)
    assert cache_spans(telemetry)[1][sc.CACHE_REASON] == "acl:denied"
    assert len(app.searches()) == 2


def test_groups_only_header_identity_uses_the_cache(ragtoll: Any, stack: Any) -> None:
    _, app = stack
    with ragtoll() as base:
        post(base, "/docs/search", Q, groups="public", subject=None)
        again = post(base, "/docs/search", Q, groups="public", subject=None)
    assert again.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert len(app.searches()) == 1


# --- 6. single flight --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_duplicate_during_an_in_flight_miss_waits_for_it(ragtoll: Any, stack: Any, telemetry: Any) -> None:
    _, app = stack
    app.delay = 0.4
    with ragtoll() as base:
        async def both() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=10) as client:
                h = {"x-auth-subject": "u1", "x-auth-groups": "public"}
                first = asyncio.ensure_future(client.post(f"{base}/docs/search", json=Q,
                                                          headers={**h, "x-ragtoll-task-id": "a"}))
                await asyncio.sleep(0.1)  # the first is upstream now
                second = await client.post(f"{base}/docs/search", json=Q, headers={**h, "x-ragtoll-task-id": "b"})
                return [await first, second]

        first, second = asyncio.run(both())
        filed()
    assert app.searches() == ["POST /search"]
    assert first.json() == second.json() and second.headers["x-ragtoll-cache"] == "hit; tier=exact"
    waited = [a for a in cache_spans(telemetry) if a.get(sc.CACHE_FRESHNESS) == "inflight"]
    assert len(waited) == 1 and waited[0][sc.CACHE_WAITED_MS] > 100
    assert waited[0].get(sc.budget_used("max_retrieval_calls"), 0) == 0  # charged as a hit


# --- 7. operations on retrieval routes ----------------------------------------------------------------------

def test_qdrant_calls_that_are_not_searches_are_not_retrieval_calls(ragtoll: Any, stack: Any) -> None:
    _, app = stack
    budgets = {"default_profile": "one", "profiles": {"one": {"max_retrieval_calls": 1, "max_calls": 10}}}
    with ragtoll(budgets=budgets) as base:
        h = {"x-ragtoll-task-id": "ops", "x-auth-subject": "u1", "x-auth-groups": "public"}
        health = [httpx.get(f"{base}/qdrant/", headers=h, timeout=5) for _ in range(2)]
        upsert = httpx.put(f"{base}/qdrant/collections/public_kb/points", json={"points": []}, headers=h, timeout=5)
        search = post(base, "/qdrant/collections/public_kb/points/search", {"vector": [0.1], "limit": 1}, task="ops")
        over = post(base, "/qdrant/collections/public_kb/points/search", {"vector": [0.2], "limit": 1}, task="ops")
    assert [r.status_code for r in health] == [200, 200] and upsert.status_code == 200
    assert search.status_code == 200 and over.status_code != 200  # refused: the one retrieval call is used
    assert over.json()["error"]["dimension"] == "max_retrieval_calls"
    assert app.calls == ["GET /", "GET /", "PUT /collections/public_kb/points",
                         "POST /collections/public_kb/points/search"]
