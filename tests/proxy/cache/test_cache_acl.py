"""The ACL decision of every serve, including a property test over >100,000 principal/ACL/chunk combinations."""

from __future__ import annotations

import asyncio
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragtoll.proxy.cache import acl
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.cache.principal import Principal
from ragtoll.proxy.cache.store_memory import MemoryEvidenceStore

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
    """The rule, restated independently: known ACLs admit public/subject/group; unknown ones only the fetcher."""
    if chunk_acl is None:
        return who.key == fetcher.key
    return PUBLIC in chunk_acl or who.subject in chunk_acl or any(g in chunk_acl for g in who.groups)


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
