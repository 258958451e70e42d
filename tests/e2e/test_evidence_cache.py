"""Evidence cache end to end: ragtoll on loopback in front of a retrieval server, real JWTs, memory and Redis.

The real app (evidence -> budget -> settle) in front of a loopback retrieval server whose ACLs and
index version the tests change.
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
import jwt
import orjson
import pytest
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.cache.audit import REFRESH_S
from support.asgi import read_body, serve_lifespan
from support.servers import serve_in_thread

SECRET = "e2e-secret-e2e-secret-e2e-secret-0123"
ADMIN = "admin-token-for-tests"
ENV = {"RAGTOLL_JWT_SECRET": SECRET, "RAGTOLL_ADMIN_TOKEN": ADMIN}
CURRENT: list[Any] = []  # the proxy being served, so helpers can wait until a miss is filed


class Retriever:
    """A tiny retrieval server: POST /search {query, top_k} -> {results: [...]} with per-doc ACLs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.embedded: list[str] = []
        self.version = "v1"
        self.scores: list[float] | None = None  # the results' scores in rank order (default: 1.0, 0.9, ...)
        self.sized = False  # send content-length (as most search servers do), not a chunked answer
        self.docs = [
            {"id": "refund-annual", "text": "Annual plans: refunds within 30 days.", "groups": ["finance"], "plan": "annual"},
            {"id": "refund-monthly", "text": "Monthly plans: refunds within 7 days.", "groups": ["finance"], "plan": "monthly"},
            {"id": "handbook", "text": "Employee handbook.", "groups": ["public"], "plan": "any"},
            {"id": "notes", "text": "Private notes.", "groups": None, "plan": "any"},
        ]

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        body = await read_body(receive)
        if body is None:
            return
        if scope["path"].endswith("/embeddings"):
            doc = orjson.loads(body)
            with self.lock:
                self.calls += 1
                self.embedded.append(str(doc.get("input")))
            out = {"object": "list", "model": "e", "data": [{"object": "embedding", "index": 0, "embedding": [1.0, 0.0]}],
                   "usage": {"prompt_tokens": 2, "total_tokens": 2}, "input": doc.get("input")}
            return await self._json(send, out, [])
        doc = orjson.loads(body)
        q = str(doc.get("query", "")).lower()
        with self.lock:
            self.calls += 1
            docs = sorted(self.docs, key=lambda d: (d["plan"] not in q, d["id"]))
            scores = self.scores or [1.0 - i / 10 for i in range(len(docs))]
            results = [{"id": d["id"], "text": d["text"], "score": scores[i],
                        "metadata": {"plan": d["plan"], **({"groups": d["groups"]} if d["groups"] else {})}}
                       for i, d in enumerate(docs[: int(doc.get("top_k", 3))])]
            version = self.version
        raw = orjson.dumps({"results": results})
        size = [(b"content-length", str(len(raw)).encode())] if self.sized else []
        await self._json(send, {"results": results}, [(b"x-index-version", version.encode()), *size])

    @staticmethod
    async def _json(send: Any, doc: Any, headers: list[tuple[bytes, bytes]]) -> None:
        raw = orjson.dumps(doc)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "http.response.body", "body": raw})


@pytest.fixture
def retriever() -> Iterator[tuple[str, Retriever]]:
    app = Retriever()
    with serve_in_thread(app) as url:
        yield url, app


@pytest.fixture
def cache_proxy(retriever: tuple[str, Retriever], telemetry: Any) -> Any:
    @contextlib.contextmanager
    def make(docs_cache: dict[str, Any] | None = None, **overrides: Any) -> Iterator[str]:
        url = retriever[0]
        raw: dict[str, Any] = {
            "upstreams": [
                {"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs",
                 "fields": {"acl": "metadata.groups", "version_header": "x-index-version"},
                 "cache": docs_cache or {}},
                {"name": "emb", "kind": "embeddings", "api": "openai", "url": url, "prefix": "/emb"},
            ],
            "identity": {"mode": "jwt", "jwt": {"audience": "ragtoll"}},
            "budgets": {"default_profile": "open", "profiles": {"open": {"max_calls": 100}}},
            "cache": {"embedder": "none"},
        }
        for key, value in overrides.items():
            raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
        proxy = build_app(config.parse(raw), tracer_provider=telemetry.tracer_provider,
                          meter_provider=telemetry.meter_provider, env=ENV)
        CURRENT[:] = [proxy]
        with serve_in_thread(proxy) as base:
            yield base

    return make


def token(sub: str, groups: list[str], **extra: Any) -> str:
    # valid for a day: the module-level tokens are made at collection, which may be long before a test runs
    claims = {"sub": sub, "groups": groups, "aud": "ragtoll", "exp": int(time.time()) + 86400, **extra}
    return jwt.encode(claims, SECRET, algorithm="HS256")


def search(base: str, query: str, tok: str | None, top_k: int = 3, task: str = "t1", **headers: str) -> httpx.Response:
    h = {"x-ragtoll-task-id": task, **headers}
    if tok:
        h["authorization"] = f"Bearer {tok}"
    r = httpx.post(f"{base}/docs/search", json={"query": query, "top_k": top_k}, headers=h, timeout=10)
    wait_filed()
    return r


def wait_filed() -> None:
    """The response can arrive before ragtoll has filed its evidence (on_end): wait for that."""
    deadline = time.monotonic() + 10
    while CURRENT and CURRENT[0].cache is not None and CURRENT[0].cache.pending_filings and time.monotonic() < deadline:
        time.sleep(0.005)


def cache_attrs(telemetry: Any) -> list[dict[str, Any]]:
    spans = [s for s in telemetry.spans() if s.name.startswith("retrieval")]
    return [dict(s.attributes) for s in sorted(spans, key=lambda s: s.start_time)]


ALICE = token("alice", ["finance"])
BOB = token("bob", ["eng"])


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_exact_hit_is_served_without_upstream_and_trimmed(cache_proxy: Any, retriever: Any, telemetry: Any,
                                                          store: str, request: pytest.FixtureRequest) -> None:
    store_url = request.getfixturevalue("redis_url") if store == "redis" else "memory"
    _, app = retriever
    with cache_proxy(store=store_url) as base:
        first = search(base, f"Refund window for annual plans {store}", ALICE)
        second = search(base, f"  Refund window for annual  plans {store}", ALICE, top_k=2)  # whitespace only
    assert first.status_code == second.status_code == 200
    assert app.calls == 1
    assert second.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert [r["id"] for r in second.json()["results"]] == [r["id"] for r in first.json()["results"]][:2]
    miss, hit = cache_attrs(telemetry)
    assert miss[sc.CACHE_RESULT] == "miss" and miss[sc.CACHE_HIT] is False
    assert hit[sc.CACHE_RESULT] == "hit" and hit[sc.CACHE_HIT] is True and hit[sc.CACHE_TIER] == "exact"
    assert hit.get(sc.budget_used("max_calls")) == 2  # a hit is charged as a call


def test_two_principals_with_different_groups(cache_proxy: Any, retriever: Any, telemetry: Any) -> None:
    _, app = retriever
    with cache_proxy() as base:
        search(base, "annual refunds", ALICE, top_k=2)  # finance-only chunks
        bob = search(base, "annual refunds", BOB, top_k=2)
        alice = search(base, "annual refunds", ALICE, top_k=2)
    assert "x-ragtoll-cache" not in bob.headers and alice.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert app.calls == 2
    reasons = [a.get(sc.CACHE_REASON) for a in cache_attrs(telemetry)]
    assert reasons[1] == "view:outside"  # bob's view (eng) is not inside alice's (finance)


def test_bad_tokens_and_forged_headers_never_get_cached_evidence(cache_proxy: Any, retriever: Any,
                                                                  telemetry: Any) -> None:
    _, app = retriever
    expired = token("alice", ["finance"], exp=int(time.time()) - 5)
    wrong_aud = token("alice", ["finance"], aud="other")
    none_alg = jwt.encode({"sub": "alice", "groups": ["finance"], "aud": "ragtoll", "exp": int(time.time()) + 60},
                          None, algorithm="none")
    with cache_proxy() as base:
        search(base, "annual refunds", ALICE)
        refused = [search(base, "annual refunds", bad, **{"x-auth-subject": "alice", "x-auth-groups": "finance"})
                   for bad in (expired, wrong_aud, none_alg)]
        missing = search(base, "annual refunds", None, **{"x-auth-subject": "alice", "x-auth-groups": "finance"})
    # a token that fails is refused (never a fall back); a caller with none is served, never from the cache
    assert [r.status_code for r in refused] == [401, 401, 401]
    assert [r.json()["error"]["reason"] for r in refused] == ["identity:expired", "identity:audience",
                                                              "identity:algorithm"]
    assert missing.status_code == 200 and "x-ragtoll-cache" not in missing.headers
    assert app.calls == 2
    reasons = [a.get(sc.CACHE_REASON) for a in cache_attrs(telemetry)[1:]]
    assert reasons == ["identity:missing"]


def test_forged_identity_headers_are_ignored_when_not_trusted(cache_proxy: Any, retriever: Any) -> None:
    _, app = retriever
    forged = {"x-auth-subject": "alice", "x-auth-groups": "finance"}
    with cache_proxy(identity={"mode": "none"}) as base:
        search(base, "annual refunds", "alice-key")
        r = search(base, "annual refunds", "mallory-key", **forged)
    assert "x-ragtoll-cache" not in r.headers and app.calls == 2
    with cache_proxy(identity={"mode": "header"}) as base:
        search(base, "annual refunds", None, **forged)
        trusted = search(base, "annual refunds", None, **forged)
    assert trusted.headers["x-ragtoll-cache"] == "hit; tier=exact"


def test_unknown_acl_is_private_to_the_fetcher(cache_proxy: Any, retriever: Any) -> None:
    _, app = retriever
    carol = token("carol", ["finance"])
    with cache_proxy() as base:
        search(base, "private notes", ALICE, top_k=4)  # includes "notes", which has no ACL
        assert "x-ragtoll-cache" not in search(base, "private notes", carol, top_k=4).headers
        assert search(base, "private notes", ALICE, top_k=4).headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert app.calls == 2


def test_acl_change_reaches_the_cache_through_a_version_bump(cache_proxy: Any, retriever: Any) -> None:
    _, app = retriever
    # this retriever answers every caller alike (it filters by no one): said so, its ACLs alone decide
    with cache_proxy(docs_cache={"filters_by_caller": False}) as base:
        search(base, "annual refunds", ALICE, top_k=2)
        assert search(base, "annual refunds", ALICE, top_k=2).headers.get("x-ragtoll-cache")
        with app.lock:  # the source revokes finance's access and re-indexes
            for d in app.docs:
                if d["id"].startswith("refund"):
                    d["groups"] = ["auditors"]
        denied = httpx.post(f"{base}/admin/sources/docs/version", json={"version": "v2"}, timeout=5)
        assert denied.status_code == 401
        ok = httpx.post(f"{base}/admin/sources/docs/version", json={"version": "v2"},
                        headers={"authorization": f"Bearer {ADMIN}"}, timeout=5)
        assert ok.status_code == 200 and ok.json() == {"source": "docs", "version": "v2"}
        after = search(base, "annual refunds", ALICE, top_k=2)
        assert "x-ragtoll-cache" not in after.headers  # the old entry is unreachable
        again = search(base, "annual refunds", ALICE, top_k=2)
        assert "x-ragtoll-cache" not in again.headers  # and the new evidence is not alice's to see
        auditor = search(base, "annual refunds", token("dan", ["auditors"]), top_k=2)
        assert auditor.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert app.calls == 3  # alice's three misses; dan is served


def test_version_header_moves_the_partition(cache_proxy: Any, retriever: Any) -> None:
    _, app = retriever
    with cache_proxy() as base:
        search(base, "handbook", ALICE)
        with app.lock:
            app.version = "v7"
        search(base, "handbook 2", ALICE)  # a response now says v7: v1 entries become unreachable
        assert "x-ragtoll-cache" not in search(base, "handbook", ALICE).headers
        assert search(base, "handbook", ALICE).headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert app.calls == 3


def test_semantic_hit_verified_with_the_local_embedder_and_audited(cache_proxy: Any, retriever: Any,
                                                                   telemetry: Any) -> None:
    _, app = retriever
    with cache_proxy(cache={"embedder": "local", "audit_fraction": 1.0}) as base:
        search(base, "refund window for annual pro plans", ALICE)
        hit = search(base, "refund window for yearly pro plans", ALICE)
        near = search(base, "refund window for monthly pro plans", ALICE)
        deadline = time.monotonic() + 5
        while not [s for s in telemetry.spans() if s.name == "cache.audit docs"] and time.monotonic() < deadline:
            time.sleep(0.02)
    assert hit.headers["x-ragtoll-cache"] == "hit; tier=semantic"
    assert "x-ragtoll-cache" not in near.headers
    attrs = cache_attrs(telemetry)
    assert attrs[1][sc.CACHE_TIER] == "semantic" and attrs[1][sc.CACHE_SIMILARITY] >= 0.85
    assert attrs[2][sc.CACHE_REASON] == "verify:date"
    audit = [s for s in telemetry.spans() if s.name == "cache.audit docs"]
    assert audit and audit[0].events[0].name == sc.EVENT_CACHE_AUDIT
    assert audit[0].events[0].attributes[sc.CACHE_AUDIT_AGREES] in (True, False)
    assert app.calls == 2 + 1  # three asks, one of them served; plus one audit re-run


def test_a_wrong_audit_retires_the_paraphrase_it_served(cache_proxy: Any, retriever: Any, telemetry: Any) -> None:
    # issue 33, per entry: live retrieval for "yearly" disagrees with the "annual" evidence, so the audit of
    # that hit raises the entry's own floor above it; the entry still serves its exact text
    with cache_proxy(cache={"embedder": "local", "audit_fraction": 1.0}) as base:
        search(base, "refund window for annual pro plans", ALICE)
        first = search(base, "refund window for yearly pro plans", ALICE)
        deadline = time.monotonic() + 5
        while not [s for s in telemetry.spans() if s.name == "cache.audit docs"] and time.monotonic() < deadline:
            time.sleep(0.02)
        again = search(base, "refund window for yearly pro plans", ALICE)
        exact = search(base, "refund window for annual pro plans", ALICE)
    audit = [s for s in telemetry.spans() if s.name == "cache.audit docs"]
    assert audit and audit[0].events[0].attributes[sc.CACHE_AUDIT_AGREES] is False
    assert first.headers["x-ragtoll-cache"] == "hit; tier=semantic"
    assert "x-ragtoll-cache" not in again.headers
    assert exact.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert cache_attrs(telemetry)[2][sc.CACHE_REASON] == "audit:entry"


def test_nearly_tied_evidence_serves_exact_hits_only(cache_proxy: Any, retriever: Any,
                                                     telemetry: Any) -> None:
    _, app = retriever
    app.scores = [0.81, 0.805, 0.5]  # the first two results nearly tied
    with cache_proxy(cache={"embedder": "local"}) as base:
        search(base, "refund window for annual pro plans", ALICE)
        semantic = search(base, "refund window for yearly pro plans", ALICE)
        exact = search(base, "refund window for  annual pro plans ", ALICE)
    assert "x-ragtoll-cache" not in semantic.headers
    assert exact.headers["x-ragtoll-cache"] == "hit; tier=exact"
    attrs = cache_attrs(telemetry)
    assert attrs[1][sc.CACHE_REASON] == "verify:ranking" and attrs[1][sc.CACHE_SIMILARITY] >= 0.85
    assert attrs[2][sc.CACHE_TIER] == "exact"
    assert app.calls == 2


def test_embeddings_exact_cache(cache_proxy: Any, retriever: Any) -> None:
    _, app = retriever
    with cache_proxy() as base:
        h = {"authorization": f"Bearer {ALICE}", "x-ragtoll-task-id": "e1"}
        body = {"model": "e", "input": "hello"}
        a = httpx.post(f"{base}/emb/v1/embeddings", json=body, headers=h, timeout=5)
        wait_filed()
        b = httpx.post(f"{base}/emb/v1/embeddings", json={"input": "hello", "model": "e"}, headers=h, timeout=5)
        c = httpx.post(f"{base}/emb/v1/embeddings", json=body, headers={**h, "authorization": f"Bearer {BOB}"},
                       timeout=5)
    assert a.json() == b.json() and b.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert "x-ragtoll-cache" not in c.headers  # another caller: its own entry
    assert app.calls == 2


def test_concurrent_identical_misses_all_answered(cache_proxy: Any, retriever: Any) -> None:
    with cache_proxy() as base:
        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=10) as client:
                rs = await asyncio.gather(*[
                    client.post(f"{base}/docs/search", json={"query": "handbook", "top_k": 3},
                                headers={"authorization": f"Bearer {ALICE}", "x-ragtoll-task-id": f"c{i}"})
                    for i in range(8)])
            return [r.status_code for r in rs]

        assert asyncio.run(burst()) == [200] * 8


def test_upstream_embedder_is_called_through_ragtoll_and_cached(cache_proxy: Any, retriever: Any,
                                                                telemetry: Any) -> None:
    _, app = retriever
    # the fake endpoint gives every text the same vector: similarity is 1.0, only verification decides
    with cache_proxy(cache={"embedder": "upstream:emb"}) as base:
        search(base, "refund window for annual pro plans", ALICE)
        hit = search(base, "refund window for yearly pro plans", ALICE)
        again = search(base, "refund window for yearly pro plans", ALICE)
        near = search(base, "refund window for monthly pro plans", ALICE)
    assert hit.headers["x-ragtoll-cache"] == again.headers["x-ragtoll-cache"] == "hit; tier=semantic"
    assert "x-ragtoll-cache" not in near.headers
    assert cache_attrs(telemetry)[3][sc.CACHE_REASON] == "verify:date"
    assert app.embedded.count("refund window for yearly pro plans") == 1  # exact embedding cache
    assert "refund window for annual pro plans" in app.embedded


class Authz:
    def __init__(self) -> None:
        self.denied: set[str] = set()
        self.asked = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        body = await read_body(receive)
        if body is None:
            return
        doc = orjson.loads(body)
        self.asked += 1
        allowed = [c for c in doc["chunk_ids"] if c not in self.denied]
        raw = orjson.dumps({"allowed": allowed})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": raw})


@pytest.mark.slow
def test_external_authz_reconfirms_every_serve_and_fails_closed(cache_proxy: Any, retriever: Any,
                                                                telemetry: Any) -> None:
    authz = Authz()
    with serve_in_thread(authz) as authz_url, \
            cache_proxy(cache={"authz_url": authz_url + "/check", "authz_ttl_s": 0.0}) as base:
        search(base, "handbook", ALICE, top_k=2)
        assert search(base, "handbook", ALICE, top_k=2).headers["x-ragtoll-cache"] == "hit; tier=exact"
        authz.denied.add("handbook")
        assert "x-ragtoll-cache" not in search(base, "handbook", ALICE, top_k=2).headers
    # the authz server is gone: never serve
    with cache_proxy(cache={"authz_url": authz_url + "/check", "authz_timeout_s": 0.2}) as base:
        search(base, "handbook", ALICE, top_k=2)
        assert "x-ragtoll-cache" not in search(base, "handbook", ALICE, top_k=2).headers
    reasons = [a.get(sc.CACHE_REASON) for a in cache_attrs(telemetry)]
    assert reasons[2] == "authz:denied" and reasons[-1] == "authz:unavailable"
    assert authz.asked >= 2


def test_cache_control_from_the_caller(cache_proxy: Any, retriever: Any, telemetry: Any) -> None:
    _, app = retriever
    with cache_proxy() as base:
        search(base, "handbook", ALICE, **{"cache-control": "no-store"})  # answered, not filed
        fresh = search(base, "handbook", ALICE, **{"cache-control": "no-cache"})  # not served, but filed
        cached = search(base, "handbook", ALICE)
    assert "x-ragtoll-cache" not in fresh.headers and cached.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert app.calls == 2
    assert [a.get(sc.CACHE_REASON) for a in cache_attrs(telemetry)][1] == "no-cache"


@pytest.mark.slow
def test_audits_on_one_replica_raise_the_threshold_the_other_applies(cache_proxy: Any, retriever: Any,
                                                                     telemetry: Any, redis_url: str) -> None:
    """Two ragtoll instances on one Redis: the self-audit of one raises the partition's threshold for both."""
    tag = uuid.uuid4().hex[:12]
    alice = token("alice", ["finance"], tenant=tag)  # a tenant of its own: a fresh audit scope on the server
    cfg: dict[str, Any] = {"store": redis_url, "cache": {"embedder": "local", "audit_fraction": 1.0,
                                                         "audit_target": 0.9, "audit_step": 0.14}}

    def settled(app: Any) -> None:
        deadline = time.monotonic() + 10
        while app.cache is not None and app.cache.pending_filings and time.monotonic() < deadline:
            time.sleep(0.005)

    def audits() -> list[Any]:
        return [e for s in telemetry.spans() if s.name == "cache.audit docs" for e in s.events]

    plans = ["pro", "starter", "team", "business", "enterprise"]  # a wrong audit retires its entry's paraphrase
    with cache_proxy(**cfg) as a:
        app_a = CURRENT[0]
        with cache_proxy(**cfg) as b:
            for plan in [*plans, "premium"]:
                search(a, f"refund window for annual {plan} plans", alice, task=tag)
            settled(app_a)  # a filed the evidence in Redis
            before = search(b, "refund window for yearly premium plans", alice, task=tag)
            assert before.headers["x-ragtoll-cache"] == "hit; tier=semantic"  # b has read the base threshold
            for plan in plans:  # live retrieval disagrees with each of these hits: a's audits raise the threshold
                assert search(a, f"refund window for yearly {plan} plans", alice, task=tag).headers[
                    "x-ragtoll-cache"] == "hit; tier=semantic"
            deadline = time.monotonic() + 10
            while len(audits()) < 6 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert max(e.attributes[sc.CACHE_THRESHOLD] for e in audits()) == pytest.approx(0.99)
            time.sleep(REFRESH_S)  # b re-reads a scope's shared threshold at most this often
            after = search(b, "refund window for yearly premium plans", alice, task=tag)
    assert "x-ragtoll-cache" not in after.headers
    last = cache_attrs(telemetry)[-1]
    assert last[sc.CACHE_REASON] == "below_threshold" and last[sc.CACHE_THRESHOLD] == pytest.approx(0.99)


def test_a_cache_hit_is_cut_where_the_live_answer_was(cache_proxy: Any, retriever: Any) -> None:
    """Adaptive depth cuts a hit as it cut the same answer from upstream (the cache files the whole
    answer): an agent that reranks what it got sends the same documents the second time, so its
    rerank is a repeat too. Before, a hit came whole and the rerank after it went upstream again."""
    _, app = retriever
    app.scores = [1.0, 0.95, 0.4, 0.35]  # a drop of 0.55 of the top after the second result
    app.sized = True  # a chunked answer is passed on as it streams, never cut
    with cache_proxy() as base:
        first = search(base, "Refund window for annual plans", ALICE, top_k=4)
        second = search(base, "Refund window for annual plans", ALICE, top_k=4, task="t2")
    assert app.calls == 1 and second.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert first.headers["x-ragtoll-depth"] == second.headers["x-ragtoll-depth"] == "kept=2, returned=4, reason=gap"
    assert [r["id"] for r in second.json()["results"]] == [r["id"] for r in first.json()["results"]]
    assert len(second.json()["results"]) == 2 and int(second.headers["content-length"]) == len(second.content)


def test_a_cache_hit_of_a_guessed_task_goes_whole(cache_proxy: Any, retriever: Any) -> None:
    """Without a task the client names, a search's task is a guess (its conversation), and a crowd's
    guesses can file one user's search under another's task: there a cut hit holds only what that
    task has seen and reads as fruitless, so a guessed task's hit is passed on whole, as before."""
    _, app = retriever
    app.scores = [1.0, 0.95, 0.4, 0.35]
    app.sized = True
    with cache_proxy() as base:
        answers = []
        for _ in range(2):
            answers.append(httpx.post(f"{base}/docs/search", json={"query": "Refund window for annual plans", "top_k": 4},
                                      headers={"authorization": f"Bearer {ALICE}"}, timeout=10))
            wait_filed()
    live, hit = answers
    assert app.calls == 1 and hit.headers["x-ragtoll-cache"] == "hit; tier=exact"
    assert live.headers["x-ragtoll-depth"] == "kept=2, returned=4, reason=gap"
    assert "x-ragtoll-depth" not in hit.headers and len(hit.json()["results"]) == 4
