"""The ACL and view decision of every serve: property tests over >100,000 principal/ACL/chunk
combinations, and over streams of calls against a simulated upstream that filters by caller, with
tenants and partitions: nothing is served outside its scope, and nothing a live retrieval would
have answered differently."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragtoll.proxy.cache import acl
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.model import Principal
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore

PUBLIC = "public"
NAMES = ["alice", "bob", "carol", "dave"]
GROUPS = ["finance", "eng", "hr", "sales", "admins", "public", "alice"]  # "alice" as a group name too: no confusion allowed

principals = st.builds(
    Principal,
    subject=st.sampled_from(NAMES),
    groups=st.frozensets(st.sampled_from(GROUPS), max_size=3),
    tenant=st.sampled_from(["", "t1"]),
)
acls = st.one_of(st.none(), st.lists(st.sampled_from(GROUPS + NAMES + ["nobody"]), max_size=3).map(tuple))


def visible(chunk_acl: tuple[str, ...] | None, who: Principal, fetcher: Principal) -> bool:
    """The rule, restated independently: known ACLs admit public or a group (never the subject's
    name); unknown ones only the fetcher."""
    if chunk_acl is None:
        return who.key == fetcher.key
    return PUBLIC in chunk_acl or any(g in chunk_acl for g in who.groups)


@pytest.mark.slow
def test_no_chunk_is_ever_served_to_a_principal_outside_its_acl() -> None:
    combos = [0]

    @settings(max_examples=520, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(chunk_acls=st.lists(acls, min_size=1, max_size=6), fetcher=principals, seed=st.integers(0, 2**32))
    def prop(chunk_acls: list[tuple[str, ...] | None], fetcher: Principal, seed: int) -> None:
        rnd = random.Random(seed)
        owner = acl.owner_of(chunk_acls, fetcher)
        # 200 askers per entry: some share the fetcher's subject or groups, most are random
        askers = [fetcher, Principal(fetcher.subject, fetcher.groups | {"hr"}, fetcher.tenant)] + [
            Principal(rnd.choice(NAMES), frozenset(rnd.sample(GROUPS, rnd.randint(0, 3))), rnd.choice(["", "t1"]))
            for _ in range(198)]
        for who in askers:
            served = acl.decide(chunk_acls, owner, who, PUBLIC) is None
            every = all(visible(a, who, fetcher) for a in chunk_acls)
            assert served == every, (chunk_acls, fetcher, who)
            combos[0] += len(chunk_acls)

    prop()
    assert combos[0] >= 100_000


def test_unknown_acl_makes_the_entry_private_to_the_exact_fetcher() -> None:
    alice = Principal("alice", frozenset({"eng"}))
    owner = acl.owner_of([("public",), None], alice)
    assert owner == alice.key
    assert acl.decide([("public",), None], owner, alice, PUBLIC) is None
    assert acl.decide([("public",), None], owner, Principal("alice", frozenset({"eng", "hr"})), PUBLIC) == "acl:private"
    assert acl.decide([("public",), None], owner, Principal("bob", frozenset({"eng"})), PUBLIC) == "acl:private"
    assert acl.decide([None], None, alice, PUBLIC) == "acl:private"  # never shared without an owner


def test_public_marker_is_configurable() -> None:
    bob = Principal("bob")
    assert acl.decide([("everyone",)], None, bob, "everyone") is None
    assert acl.decide([("everyone",)], None, bob, "public") == "acl:denied"


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(chunk_acls=st.lists(acls, min_size=1, max_size=4), fetcher=principals,
       askers=st.lists(principals, min_size=5, max_size=5))
def test_the_cache_serves_exactly_what_the_acl_allows(chunk_acls: list[tuple[str, ...] | None], fetcher: Principal,
                                                      askers: list[Principal]) -> None:
    async def run() -> None:
        cache = EvidenceCache(MemoryEvidenceStore(), public=PUBLIC)
        lk = await cache.lookup(Query("docs", "q", None, 3, fetcher))
        await cache.store_evidence(lk, chunk_ids=[f"c{i}" for i in range(len(chunk_acls))], acls=chunk_acls,
                                   body=b"{}")
        for who in askers:
            found = await cache.lookup(Query("docs", "q", None, 3, who))
            if who.tenant != fetcher.tenant:
                assert not found.hit  # another tenant is another partition
                continue
            assert found.hit == all(visible(a, who, fetcher) for a in chunk_acls)

    asyncio.run(run())


def test_a_subject_named_like_a_group_is_not_in_it() -> None:
    hr_named = Principal("hr", frozenset(), authenticated=True)
    assert acl.decide([("hr",)], None, hr_named, PUBLIC) == "acl:denied"
    assert acl.decide([("hr",)], None, Principal("x", frozenset({"hr"}), authenticated=True), PUBLIC) is None


def test_a_broader_view_is_not_served_what_a_narrower_one_fetched() -> None:
    public = Principal("p", frozenset({"public"}), authenticated=True)
    public_hr = Principal("q", frozenset({"public", "hr"}), authenticated=True)
    scope = acl.scope_of(public, True)
    assert acl.decide([("public",)], None, public_hr, PUBLIC, scope) == "view:outside"
    assert acl.decide([("public",)], None, public, PUBLIC, scope) is None
    # the other way round: a narrower view inside the fetcher's is served what it may see
    wide = acl.scope_of(public_hr, True)
    assert acl.decide([("public",)], None, public, PUBLIC, wide) is None
    assert acl.decide([("public",), ("hr",)], None, public, PUBLIC, wide) == "acl:denied"
    assert acl.scope_of(public, False) is None  # an upstream that answers everyone alike: ACLs only
    anonymous = Principal("anonymous:k1")  # told apart by its credential alone
    assert acl.decide([("public",)], None, Principal("anonymous:k2"), PUBLIC, acl.scope_of(anonymous, True)) == \
        "view:outside"


# --- streams of calls against an upstream that filters by caller ---------------------------------------

TENANTS = ["", "t1"]
SELECTORS = ["/a/search\x00", "/b/search\x00", "/a/search?ns=x\x00", "/a/search\x00f00d"]
VIEW_GROUPS = ["public", "hr", "eng", "sales", "hr-leads"]
SUBJECTS = ["alice", "bob", "hr", "eng", "public"]  # subjects named like groups: never a group


class Upstream:
    """Per tenant and selector (path, query string, unknown body fields) its own chunks, each with a
    true ACL; some responses leave the ACL out. `filters`: it returns only what the caller's groups
    (or the public marker) admit; else everything, and the cache's ACL check decides."""

    def __init__(self, rnd: random.Random, filters: bool) -> None:
        self.filters = filters
        self.chunks: dict[tuple[str, str], list[tuple[str, frozenset[str], bool]]] = {}
        for tenant in TENANTS:
            for sel in SELECTORS:
                self.chunks[(tenant, sel)] = [
                    (f"{tenant}{sel}#{i}", frozenset(rnd.sample(VIEW_GROUPS, rnd.randint(1, 2))), rnd.random() < 0.1)
                    for i in range(12)]
        self.score = {c[0]: {q: rnd.random() for q in QUERIES} for cs in self.chunks.values() for c in cs}

    def search(self, who: Principal, query: str, sel: str, k: int) -> list[tuple[str, frozenset[str], bool]]:
        pool = [c for c in self.chunks[(who.tenant, sel)]
                if not self.filters or PUBLIC in c[1] or not who.groups.isdisjoint(c[1])]
        return sorted(pool, key=lambda c: -self.score[c[0]][query])[:k]


QUERIES = ["refund window", "sick leave"]


def _p(subject: str, *groups: str, tenant: str = "", authenticated: bool = True) -> Principal:
    return Principal(subject, frozenset(groups), tenant, authenticated)


# views that are equal, inside, around, beside one another and in another tenant; subjects named
# like groups; callers told apart only by a credential
KNOWN = [_p("alice", "public"), _p("bob", "public"), _p("carol", "public", "hr"), _p("hr"), _p("dave", "eng"),
         _p("erin", "public", "hr", tenant="t1"), _p("frank", "hr"), _p("gina", "public", "hr", "eng"),
         _p("public"), _p("anonymous:k1", authenticated=False), _p("anonymous:k2", authenticated=False)]
callers = st.one_of(st.sampled_from(KNOWN), st.builds(
    Principal, subject=st.sampled_from(SUBJECTS), groups=st.frozensets(st.sampled_from(VIEW_GROUPS), max_size=3),
    tenant=st.sampled_from(TENANTS), authenticated=st.just(True)))
calls = st.tuples(callers, st.sampled_from(QUERIES), st.sampled_from(SELECTORS[:3]), st.integers(1, 5))


@pytest.mark.slow
def test_nothing_is_served_outside_its_scope_or_unlike_live_retrieval() -> None:
    served = [0, 0]  # hits, chunk serves checked
    rules: Counter[str] = Counter()  # every rule took part: misses by reason, hits by view rule

    @settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(stream=st.lists(calls, min_size=20, max_size=80), filters=st.booleans(), seed=st.integers(0, 2**32))
    def prop(stream: list[tuple[Principal, str, str, int]], filters: bool, seed: int) -> None:
        upstream = Upstream(random.Random(seed), filters)

        async def run() -> None:
            cache = EvidenceCache(MemoryEvidenceStore(), public=PUBLIC)
            for who, query, sel, k in stream:
                q = Query("docs", query, None, k, who, selector=sel, scoped=filters)
                found = await cache.lookup(q)
                live = upstream.search(who, query, sel, k)
                if found.entry is None:
                    rules[found.reason] += 1
                    await cache.store_evidence(found, chunk_ids=[c[0] for c in live],
                                               acls=[None if hidden else tuple(sorted(a)) for _, a, hidden in live],
                                               body=b"{}")
                    continue
                got = list(found.entry.chunk_ids[:k])
                inside = found.entry.scope is not None and who.view < set(found.entry.scope)
                rules[f"hit:{found.view}{':narrower' if inside else ''}"] += 1
                served[0] += 1
                served[1] += len(got)
                truth = {c[0]: c for cs in upstream.chunks.values() for c in cs}
                # inside its scope: the asker's tenant and selector; chunks its groups admit, and those
                # whose ACL the response left out only to the very principal that fetched them
                assert all(c.startswith(f"{who.tenant}{sel}#") for c in got), (who, sel, got)
                for c in got:
                    _, groups, hidden = truth[c]
                    assert (found.entry.owner == who.key) if hidden else \
                        (PUBLIC in groups or not who.groups.isdisjoint(groups)), (who, c, truth[c])
                # and exactly what live retrieval answers this principal
                assert got == [c[0] for c in live], (who, query, sel, k, got, live)

        asyncio.run(run())

    prop()
    assert served[0] >= 1_000 and served[1] >= 2_000
    for rule in ("view:outside", "acl:denied", "top_k", "hit:shared", "hit:inside",
                 "hit:inside:narrower", "hit:owner"):
        assert rules[rule] > 0, rules


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_external_authz_allows_denies_caches_and_fails_closed() -> None:
    calls: list[bytes] = []
    answer: dict[str, object] = {"status": 200, "allowed": ["a", "b"]}

    async def post(url: str, body: bytes, timeout: float) -> tuple[int, bytes]:
        calls.append(body)
        if answer["status"] == "boom":
            raise OSError("connection refused")
        import orjson

        return int(answer["status"]), orjson.dumps({"allowed": answer["allowed"]})  # type: ignore[call-overload]

    clock = FakeClock()
    check = acl.ExternalAuthz("http://authz", post, ttl_s=10, clock=clock)
    alice = Principal("alice", frozenset({"eng"}))
    assert await check.allows(alice, ["a", "b"]) is None
    assert await check.allows(alice, ["a", "b"]) is None
    assert len(calls) == 1  # cached
    assert await check.allows(alice, ["a", "c"]) == "authz:denied"
    clock.now = 11
    answer["status"] = 500
    assert await check.allows(alice, ["a"]) == "authz:unavailable"
    answer["status"] = "boom"
    assert await check.allows(alice, ["a"]) == "authz:unavailable"
