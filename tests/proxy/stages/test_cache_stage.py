"""The cache stage on exchanges without a server, with the real MemoryEvidenceStore and the
caller resolved as the pipeline does: a miss files its evidence only when the answer completed, a hit proposes the
cached answer, bypasses say why, and an ACL refusal is a miss."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import orjson
import pytest
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.errors import BadRequest
from ragtoll.proxy.request.exchange import CacheOutcome, Exchange
from ragtoll.proxy.request.upstream import UpstreamClient
from ragtoll.proxy.stages.cache import CACHE_HEADER, CacheStage, evidence_cache
from ragtoll.proxy.stores.evidence import Entry
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore
from support.exchanges import UNUSED, Exchanges, answer, results

UPSTREAMS = [
    {"name": "docs", "kind": "retrieval", "api": "json", "url": UNUSED, "prefix": "/docs",
     "fields": {"acl": "groups", "version_header": "x-index-version"}},
    {"name": "openai", "kind": "llm", "api": "openai", "url": UNUSED, "prefix": "/openai"},
]
ALICE = {"x-auth-subject": "alice", "x-auth-groups": "staff"}
BOB = {"x-auth-subject": "bob", "x-auth-groups": "sales"}
CAROL = {"x-auth-subject": "carol", "x-auth-groups": "staff,ops"}
QUERY = {"query": "refund window for annual plans", "top_k": 3}


class Cache:
    """A cache stage over header identity (the gateway's x-auth-* headers) and a memory store. The
    upstream client is built on the unused address: nothing here audits or embeds upstream."""

    def __init__(self, store: Any = None, upstreams: list[dict[str, Any]] = UPSTREAMS, **raw: Any) -> None:
        self.xs = Exchanges(upstreams=upstreams, identity={"mode": "header"}, **raw)
        self.store = store if store is not None else MemoryEvidenceStore()
        self.client = UpstreamClient(self.xs.settings.upstreams)
        self.stage = CacheStage(self.xs.settings, evidence_cache(self.xs.settings, self.store, self.client),
                                self.client, tracer_provider=self.xs.tracer_provider)

    async def call(self, who: dict[str, str], body: Any = QUERY, *, route: str = "docs", path: str | None = None,
                   headers: dict[str, str] | None = None, upstream: Any = None, status: int = 200,
                   complete: bool = True, version: str | None = None) -> Exchange:
        """One call through on_request; unless the stage proposed an answer, `upstream` answers it
        (streamed through on_chunk, with `version` in the version header); then on_end."""
        ex = self.xs(route, body, path=path, headers={**who, **(headers or {})})
        assert await self.stage.on_request(ex) is None  # the cache never answers by itself: it proposes
        if ex.proposal is None and upstream is not None:
            raw = answer(ex, upstream, status=status, complete=complete,
                         headers={"x-index-version": version} if version else None)
            self.stage.on_chunk(ex, raw[: len(raw) // 2])
            self.stage.on_chunk(ex, raw[len(raw) // 2:])
        elif ex.proposal is not None:
            ex.status, ex.complete = ex.proposal.status, True
        await self.stage.on_end(ex)
        return ex


@pytest.fixture
async def cache() -> AsyncIterator[Cache]:
    c = Cache()
    yield c
    await c.client.aclose()


def staff_results(ids: Sequence[str]) -> dict[str, Any]:
    return results(ids, groups=["staff"])


# --- a miss, filed in on_end ------------------------------------------------------------------------

async def test_a_miss_files_its_answer_and_the_repeat_is_proposed(cache: Cache) -> None:
    miss = await cache.call(ALICE, upstream=staff_results(["a", "b", "c"]))
    assert miss.cache == CacheOutcome("miss")
    assert cache.stage.pending_filings == 0
    span = cache.xs.finished(miss)
    assert (span.attributes[sc.CACHE_RESULT], span.attributes[sc.CACHE_HIT]) == ("miss", False)
    hit = await cache.call(ALICE)
    assert hit.proposal is not None and hit.proposal.status == 200
    assert orjson.loads(hit.proposal.body) == staff_results(["a", "b", "c"])
    assert (CACHE_HEADER, b"hit; tier=exact") in hit.proposal.headers
    assert hit.cache == CacheOutcome("hit", "exact", 1.0)
    attrs = cache.xs.finished(hit).attributes
    assert (attrs[sc.CACHE_RESULT], attrs[sc.CACHE_HIT], attrs[sc.CACHE_TIER]) == ("hit", True, "exact")


@pytest.mark.parametrize("how", ["cut_short", "status_500", "outcome_error", "no-store"])
async def test_a_miss_whose_answer_did_not_end_well_is_not_filed(cache: Cache, how: str) -> None:
    kwargs: dict[str, Any] = {"upstream": staff_results(["a", "b", "c"])}
    if how == "cut_short":
        kwargs["complete"] = False  # every byte came, but the exchange broke before the body's end
    elif how == "status_500":
        kwargs["status"] = 500
    elif how == "no-store":
        kwargs["headers"] = {"cache-control": "no-store"}
    if how == "outcome_error":
        ex = cache.xs("docs", QUERY, headers=ALICE)
        await cache.stage.on_request(ex)
        cache.stage.on_chunk(ex, answer(ex, staff_results(["a", "b", "c"])))
        ex.outcome = "upstream_error"
        await cache.stage.on_end(ex)
    else:
        await cache.call(ALICE, **kwargs)
    assert cache.stage.pending_filings == 0
    again = await cache.call(ALICE)
    assert again.proposal is None and again.cache == CacheOutcome("miss")


async def test_an_answer_past_max_body_bytes_is_not_filed() -> None:
    c = Cache(cache={"max_body_bytes": 100})
    try:
        await c.call(ALICE, upstream=staff_results(["a", "b", "c"]))  # about 250 bytes
        assert (await c.call(ALICE)).proposal is None
    finally:
        await c.client.aclose()


async def test_a_hit_for_fewer_results_is_trimmed_to_top_k(cache: Cache) -> None:
    await cache.call(ALICE, upstream=staff_results(["a", "b", "c"]))
    hit = await cache.call(ALICE, {**QUERY, "top_k": 2})
    assert hit.proposal is not None
    assert [r["id"] for r in orjson.loads(hit.proposal.body)["results"]] == ["a", "b"]
    wider = await cache.call(ALICE, {**QUERY, "top_k": 5})  # more than was fetched: a miss
    assert wider.proposal is None and cache.xs.finished(wider).attributes[sc.CACHE_REASON] == "top_k"


# --- ACLs --------------------------------------------------------------------------------------------

async def test_a_principal_outside_the_chunks_acl_gets_a_miss(cache: Cache) -> None:
    wide = {"x-auth-subject": "wendy", "x-auth-groups": "staff,sales"}
    await cache.call(wide, upstream=staff_results(["a", "b", "c"]))
    denied = await cache.call(BOB)  # bob's view is inside wendy's, but the chunks are staff's
    assert denied.proposal is None and denied.cache == CacheOutcome("miss")
    assert cache.xs.finished(denied).attributes[sc.CACHE_REASON] == "acl:denied"
    shared = await cache.call(ALICE)  # a member of the group, whose view is inside wendy's, is served
    assert shared.proposal is not None
    assert cache.xs.finished(shared).attributes[sc.CACHE_VIEW] == "inside"


async def test_a_broader_principal_is_never_served_a_narrower_ones_evidence(cache: Cache) -> None:
    """Issue 22: `public` asked, then `public,hr` asked the same: the upstream filters by groups, so the
    second's live results hold hr chunks the first never saw. It was an exact hit without them."""
    public = {"x-auth-subject": "pat", "x-auth-groups": "public"}
    public_hr = {"x-auth-subject": "hana", "x-auth-groups": "public,hr"}
    await cache.call(public, upstream=results(["p1", "p2"], groups=["public"]))
    broader = await cache.call(public_hr, upstream=results(["h1", "p1", "p2"], groups=["public", "hr"]))
    assert broader.proposal is None
    assert cache.xs.finished(broader).attributes[sc.CACHE_REASON] == "view:outside"
    assert (await cache.call(public_hr)).proposal is not None  # its own view's entry, from now on
    again = await cache.call(public)  # hr chunks in the newest entry: not public's to see, its own entry serves
    assert again.proposal is not None and [r["id"] for r in orjson.loads(again.proposal.body)["results"]] == \
        ["p1", "p2"]


async def test_upstreams_that_answer_everyone_alike_share_by_acl_alone() -> None:
    c = Cache(upstreams=[{**UPSTREAMS[0], "cache": {"filters_by_caller": False}}, UPSTREAMS[1]])
    try:
        await c.call(ALICE, upstream=staff_results(["a", "b", "c"]))
        hit = await c.call(CAROL)  # a wider view: fine, the upstream does not look at who asks
        assert hit.proposal is not None and c.xs.finished(hit).attributes[sc.CACHE_VIEW] == "shared"
    finally:
        await c.client.aclose()


# --- identity --------------------------------------------------------------------------------------

@pytest.mark.parametrize("repeated", ["x-auth-groups", "x-auth-subject", "x-auth-tenant"])
async def test_a_repeated_identity_header_is_refused_never_joined(cache: Cache, repeated: str) -> None:
    """Issue 22: two x-auth-groups headers were joined into one principal (the upstream read the first)."""
    ex = cache.xs("docs", QUERY, headers={**ALICE, "x-auth-tenant": "acme"}, repeated=[(repeated, "admins")])
    with pytest.raises(BadRequest, match="more than once") as refused:
        await cache.stage.on_request(ex)
    assert refused.value.status == 400 and refused.value.code == "ambiguous_identity"
    assert ex.proposal is None and ex.filing is None


async def test_a_subject_named_like_a_group_sees_nothing_of_that_group(cache: Cache) -> None:
    """Issue 22: a subject named `hr` with no groups was served hr-only chunks."""
    await cache.call({"x-auth-subject": "hilda", "x-auth-groups": "hr"}, upstream=results(["h1"], groups=["hr"]))
    named = await cache.call({"x-auth-subject": "hr", "x-auth-groups": ""}, upstream=results([], groups=[]))
    assert named.proposal is None
    assert cache.xs.finished(named).attributes[sc.CACHE_REASON] in ("acl:denied", "none")


async def test_groups_only_identity_is_a_principal(cache: Cache) -> None:
    """Header mode with only the groups header: a subject derived from the groups, not a silent bypass."""
    staff = {"x-auth-groups": "staff"}
    first = await cache.call(staff, upstream=staff_results(["a", "b", "c"]))
    assert first.cache == CacheOutcome("miss")
    assert (await cache.call({"x-auth-groups": "staff"})).proposal is not None
    assert (await cache.call({"x-auth-groups": "sales"})).proposal is None


async def test_chunks_without_an_acl_are_served_only_to_who_fetched_them(cache: Cache) -> None:
    await cache.call(ALICE, upstream=results(["a", "b", "c"]))  # no `groups` on the results
    assert (await cache.call(CAROL)).proposal is None
    assert (await cache.call(ALICE)).proposal is not None


# --- bypasses ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("who", "body", "reason"), [
    ({"x-auth-tenant": "acme"}, QUERY, "identity:missing"),
    (ALICE, b'{"query": "refund', "parse_error"),
    (ALICE, {"top_k": 3}, "no_query"),
    (ALICE, {"query": "   ", "top_k": 3}, "no_query"),
])
async def test_bypass_reasons(cache: Cache, who: dict[str, str], body: Any, reason: str) -> None:
    ex = await cache.call(who, body, upstream=staff_results(["a"]))
    assert ex.cache == CacheOutcome("bypass") and ex.proposal is None
    attrs = cache.xs.finished(ex).attributes
    assert (attrs[sc.CACHE_RESULT], attrs[sc.CACHE_HIT], attrs[sc.CACHE_REASON]) == ("bypass", False, reason)


async def test_no_cache_bypasses_the_lookup_but_files_the_answer(cache: Cache) -> None:
    await cache.call(ALICE, upstream=staff_results(["a", "b", "c"]))
    fresh = await cache.call(ALICE, headers={"cache-control": "no-cache"}, upstream=staff_results(["x", "y", "z"]))
    assert fresh.proposal is None and cache.xs.finished(fresh).attributes[sc.CACHE_REASON] == "no-cache"
    hit = await cache.call(ALICE)
    assert hit.proposal is not None
    assert [r["id"] for r in orjson.loads(hit.proposal.body)["results"]] == ["x", "y", "z"]  # the fresher answer


async def test_calls_the_cache_does_not_serve_get_no_outcome(cache: Cache) -> None:
    chat = await cache.call(ALICE, {"model": "gpt-4o-mini", "messages": []}, route="openai")
    get = cache.xs("docs", QUERY, headers=ALICE, method="GET")
    await cache.stage.on_request(get)
    assert chat.cache is None and get.cache is None


class BrokenStore(MemoryEvidenceStore):
    """An evidence store whose reads fail (a Redis that went away)."""

    async def get(self, pkey: str, qkey: str) -> Entry | None:
        raise ConnectionError("evidence store down")

    async def get_many(self, pkey: str, qkeys: Sequence[str]) -> list[Entry | None]:
        raise ConnectionError("evidence store down")

    async def nearest(self, pkey: str, vector: np.ndarray, min_similarity: float, limit: int,
                      *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("evidence store down")


async def test_a_failing_store_is_a_bypass_never_an_error() -> None:
    c = Cache(store=BrokenStore())
    try:
        ex = await c.call(ALICE, upstream=staff_results(["a"]))
    finally:
        await c.client.aclose()
    assert ex.cache == CacheOutcome("bypass") and ex.proposal is None
    span = c.xs.finished(ex)
    assert span.attributes[sc.CACHE_REASON] == "store_error"
    assert [e.attributes["exception.type"] for e in span.events if e.name == "exception"] == ["ConnectionError"]


# --- exact caches (embeddings) -----------------------------------------------------------------------

EMBED = {"model": "text-embedding-3-small", "input": ["refund window"]}
VECTORS = {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
           "model": "text-embedding-3-small", "usage": {"prompt_tokens": 2, "total_tokens": 2}}


async def test_embeddings_are_cached_exactly_and_per_caller(cache: Cache) -> None:
    path = "/v1/embeddings"
    await cache.call(ALICE, EMBED, route="openai", path=path, upstream=VECTORS)
    same = await cache.call(ALICE, {"input": ["refund window"], "model": "text-embedding-3-small"},
                            route="openai", path=path)  # the same JSON, keys in another order
    assert same.proposal is not None and orjson.loads(same.proposal.body) == VECTORS
    other = await cache.call(BOB, EMBED, route="openai", path=path)
    assert other.proposal is None and other.cache == CacheOutcome("miss")


# --- what selects the evidence: the partition ---------------------------------------------------------

@pytest.mark.parametrize(("first", "second"), [
    (("/user-uploads/search", QUERY), ("/search", QUERY)),  # two paths after the prefix
    (("/search?index=other", QUERY), ("/search", QUERY)),  # a query string
    (("/search", {**QUERY, "namespace": "other"}), ("/search", QUERY)),  # a body field not understood
    (("/search", {**QUERY, "namespace": "a"}), ("/search", {**QUERY, "namespace": "b"})),
])
async def test_where_the_query_went_partitions_the_evidence(cache: Cache, first: tuple[str, Any],
                                                            second: tuple[str, Any]) -> None:
    """Issue 22: one user planted evidence for another through a path, a query string or an unknown field."""
    mallory = {"x-auth-subject": "mallory", "x-auth-groups": "staff"}
    await cache.call(mallory, first[1], path=first[0], upstream=staff_results(["planted"]))
    other = await cache.call(ALICE, second[1], path=second[0], upstream=staff_results(["real"]))
    assert other.proposal is None and other.cache == CacheOutcome("miss")
    same = await cache.call(ALICE, first[1], path=first[0])
    assert same.proposal is not None  # and each is still its own: the same path and body hit


async def test_irrelevant_fields_do_not_partition() -> None:
    c = Cache(upstreams=[{**UPSTREAMS[0], "fields": {**UPSTREAMS[0]["fields"], "irrelevant": "request_id"}},
                         UPSTREAMS[1]])
    try:
        await c.call(ALICE, {**QUERY, "request_id": "r1"}, upstream=staff_results(["a"]))
        assert (await c.call(ALICE, {**QUERY, "request_id": "r2"})).proposal is not None
    finally:
        await c.client.aclose()


async def test_a_query_by_vector_is_cached_exactly(cache: Cache) -> None:
    vec = {"vector": [0.1, 0.2, 0.3], "top_k": 3}
    miss = await cache.call(ALICE, vec, upstream=staff_results(["a", "b", "c"]))
    assert miss.cache == CacheOutcome("miss")
    hit = await cache.call(ALICE, {"vector": [0.1, 0.2, 0.3], "top_k": 2})
    assert hit.proposal is not None and hit.cache == CacheOutcome("hit", "exact", 1.0)
    assert (await cache.call(ALICE, {"vector": [0.1, 0.2, 0.30001], "top_k": 2})).proposal is None


# --- versions -----------------------------------------------------------------------------------------

async def test_hits_carry_the_version_their_evidence_came_with(cache: Cache) -> None:
    await cache.call(ALICE, upstream=staff_results(["a", "b", "c"]), version="v1")
    hit = await cache.call(ALICE)
    assert hit.proposal is not None and (b"x-index-version", b"v1") in hit.proposal.headers
    assert dict(hit.proposal.headers)[b"age"] == b"0"
    attrs = cache.xs.finished(hit).attributes
    assert attrs[sc.CACHE_VERSION] == "0+v1" and attrs[sc.CACHE_FRESHNESS] == "young"


async def test_a_lagging_replica_never_rolls_the_version_back(cache: Cache) -> None:
    """Issue 22: one response with the older version header made the old entries servable again."""
    await cache.call(ALICE, upstream=results(["old"], groups=["staff"]), version="v1")
    await cache.call(ALICE, {"query": "another question", "top_k": 3}, upstream=staff_results(["x"]), version="v2")
    assert (await cache.call(ALICE)).proposal is None  # v2: v1's entries are unreachable
    await cache.call(ALICE, {"query": "third question", "top_k": 3}, upstream=staff_results(["y"]), version="v1")
    again = await cache.call(ALICE, upstream=staff_results(["new"]), version="v2")
    assert again.proposal is None  # the lagging v1 answer moved nothing back
    hit = await cache.call(ALICE)
    assert hit.proposal is not None and orjson.loads(hit.proposal.body)["results"][0]["id"] == "new"
    assert (b"x-index-version", b"v2") in hit.proposal.headers
    assert (await cache.call(ALICE, {"query": "third question", "top_k": 3})).proposal is None  # v1's: not filed


# --- single flight ---------------------------------------------------------------------------------------

async def test_a_duplicate_waits_for_the_retrieval_in_flight(cache: Cache) -> None:
    """Issue 22: a repeat right after a miss went upstream too, since the entry is filed after the response."""
    import asyncio

    first = cache.xs("docs", QUERY, headers=ALICE)
    await cache.stage.on_request(first)
    assert first.proposal is None and first.filing is not None
    second = cache.xs("docs", QUERY, headers=CAROL | {"x-auth-groups": "staff"})
    waiting = asyncio.get_running_loop().create_task(cache.stage.on_request(second))
    await asyncio.sleep(0.01)
    assert not waiting.done()  # it waits for the first, it does not go upstream
    raw = answer(first, staff_results(["a", "b", "c"]))
    cache.stage.on_chunk(first, raw)
    await cache.stage.on_response(first)  # read whole, before the first's client has the body
    await asyncio.wait_for(waiting, 1)
    assert second.proposal is not None and orjson.loads(second.proposal.body) == staff_results(["a", "b", "c"])
    attrs = cache.xs.finished(second).attributes
    assert attrs[sc.CACHE_FRESHNESS] == "inflight" and attrs[sc.CACHE_WAITED_MS] > 0
    await cache.stage.on_end(first)
    assert (await cache.call(ALICE)).proposal is not None  # and it was filed


async def test_a_duplicate_of_a_failed_retrieval_leads_the_retry(cache: Cache) -> None:
    """Issue 30: the waiters of a failed leader all went upstream at once; one leads the retry now,
    the others wait for it, and a second upstream failure in a row is theirs too (502)."""
    import asyncio

    from ragtoll.proxy.errors import UpstreamUnavailable

    first = cache.xs("docs", QUERY, headers=ALICE)
    await cache.stage.on_request(first)
    waiters = [cache.xs("docs", QUERY, headers=ALICE) for _ in range(3)]
    waiting = [asyncio.get_running_loop().create_task(cache.stage.on_request(w)) for w in waiters]
    await asyncio.sleep(0.01)
    answer(first, {"error": "boom"}, status=500)
    await cache.stage.on_end(first)
    await asyncio.wait_for(waiting[0], 1)
    second = waiters[0]  # the first waiter to wake leads the retry: it goes upstream, the others wait for it
    assert second.proposal is None and cache.xs.finished(second).attributes[sc.CACHE_REASON] == "inflight:relay"
    assert second.filing is not None and second.filing.lookup is not None and second.filing.lookup.flight is not None
    await asyncio.sleep(0.01)
    assert not any(w.done() for w in waiting[1:])
    answer(second, {"error": "boom"}, status=503)
    await cache.stage.on_end(second)
    for w in waiting[1:]:
        with pytest.raises(UpstreamUnavailable):
            await asyncio.wait_for(w, 1)


async def test_an_answer_read_whole_is_filed_even_if_its_client_left(cache: Cache) -> None:
    ex = cache.xs("docs", QUERY, headers=ALICE)
    await cache.stage.on_request(ex)
    cache.stage.on_chunk(ex, answer(ex, staff_results(["a", "b", "c"]), complete=False))
    await cache.stage.on_response(ex)  # the upstream's answer, whole
    ex.outcome = "client_disconnect"  # ...and then the client went away before reading it
    await cache.stage.on_end(ex)
    assert (await cache.call(ALICE)).proposal is not None


async def test_a_leader_refused_for_its_own_credentials_does_not_count_as_an_upstream_failure(cache: Cache) -> None:
    """A 401 is the leader's, not the upstream's: the next waiter asks with its own credentials, and
    the waiters only get a failure after two upstream failures (5xx) in a row."""
    import asyncio

    from ragtoll.proxy.errors import UpstreamUnavailable

    leader = cache.xs("docs", QUERY, headers=ALICE)
    await cache.stage.on_request(leader)
    waiters = [cache.xs("docs", QUERY, headers=ALICE) for _ in range(4)]
    waiting = [asyncio.get_running_loop().create_task(cache.stage.on_request(w)) for w in waiters]
    await asyncio.sleep(0.01)
    for status in (401, 500, 502):  # each failed leader hands the key to the next waiter
        answer(leader, {"error": "no"}, status=status)
        await cache.stage.on_end(leader)
        await asyncio.sleep(0.01)
        led = [w for w, t in zip(waiters, waiting, strict=True) if t.done() and w.filing is not None
               and w.filing.lookup is not None and w.filing.lookup.flight is not None and w.status is None]
        if status == 502:
            break
        assert len(led) == 1
        leader = led[0]
    for t in waiting:
        if not t.done() or t.exception() is not None:
            with pytest.raises(UpstreamUnavailable):
                await asyncio.wait_for(t, 1)
    assert sum(t.exception() is None for t in waiting) == 2  # two retries went upstream; the others failed
