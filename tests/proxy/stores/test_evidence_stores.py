"""The evidence store contract, run against memory and a real Redis; plus each store's own bounds."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import numpy as np
import pytest
import redis.asyncio as aioredis
from ragtoll.proxy.stores.evidence import Entry
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore
from ragtoll.proxy.stores.evidence_redis import RedisEvidenceStore
from support.clock import Clock


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def entry(q: str, k: int = 5, body: bytes = b'{"results": []}') -> Entry:
    return Entry(q, k, ("c1", "c2"), (("public",), None), body, owner="o1", vocab=("pro",), created=1.0,
                 margin=0.5)


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[object]:
    if request.param == "memory":
        yield MemoryEvidenceStore()
        return
    s = RedisEvidenceStore.from_url(request.getfixturevalue("redis_url"), max_partition_entries=50)
    yield s
    await s.aclose()


def pk() -> str:
    return uuid.uuid4().hex  # a fresh partition per test: the Redis server is shared


async def test_put_get_roundtrip(store: MemoryEvidenceStore) -> None:
    p = pk()
    assert await store.get(p, "q1") is None
    e = entry("refund window", body='{"results": ["é"]}'.encode())
    await store.put(p, "q1", e, unit(1, 0, 0), 60)
    assert await store.get(p, "q1") == e


async def test_get_many_answers_each_key_in_order(store: MemoryEvidenceStore) -> None:
    p = pk()
    a, b = entry("a"), entry("b")
    await store.put(p, "a", a, None, 60)
    await store.put(p, "b", b, None, 60)
    await store.put(pk(), "c", entry("c"), None, 60)  # another partition's key is never seen
    assert await store.get_many(p, ["b", "missing", "a", "c"]) == [b, None, a, None]


def test_entries_filed_before_margins_were_kept_still_load() -> None:
    old = Entry.loads(b'{"q": "q", "k": 5, "ids": ["c1"], "acl": [null], "b": "{}", "ct": "application/json",'
                      b' "o": "o1", "v": [], "t": 1.0}')
    assert old.margin is None and old.chunk_ids == ("c1",)
    assert Entry.loads(entry("q").dumps()).margin == 0.5


async def test_nearest_stays_inside_the_partition_and_orders_by_similarity(store: MemoryEvidenceStore) -> None:
    p, other = pk(), pk()
    await store.put(p, "a", entry("a"), unit(1, 0, 0), 60)
    await store.put(p, "b", entry("b"), unit(1, 1, 0), 60)
    await store.put(p, "c", entry("c"), unit(0, 0, 1), 60)
    await store.put(other, "x", entry("x"), unit(1, 0, 0), 60)
    found = await store.nearest(p, unit(1, 0.1, 0), 0.5, 3)
    assert [e.query for _, e in found] == ["a", "b"]
    assert found[0][0] > found[1][0] >= 0.5
    assert await store.nearest(pk(), unit(1, 0, 0), 0.0, 3) == []
    assert len(await store.nearest(p, unit(1, 0.1, 0), 0.0, 1)) == 1
    # restricted to given keys (the lexically verified entries); unknown keys are ignored
    only = await store.nearest(p, unit(1, 0.1, 0), 0.0, 3, keys=["b", "c", "zz"])
    assert [e.query for _, e in only] == ["b", "c"]
    assert await store.nearest(p, unit(1, 0.1, 0), 0.0, 3, keys=[]) == []


async def test_source_versions_only_move_forward(store: MemoryEvidenceStore) -> None:
    name = f"docs-{uuid.uuid4().hex[:6]}"
    assert await store.get_source(name) is None
    fields, current = await store.advance_source(name, "observed", "v1", 10.0)
    assert current and fields["observed"] == "v1" and float(fields["observed_at"]) == 10.0
    fields, current = await store.advance_source(name, "observed", "v2", 20.0)  # never seen: the new current one
    assert current and fields["observed"] == "v2"
    fields, current = await store.advance_source(name, "observed", "v1", 30.0)  # a lagging replica: no rollback
    assert not current and fields["observed"] == "v2" and float(fields["observed_at"]) == 20.0
    fields, current = await store.advance_source(name, "observed", "v2", 40.0)  # the current one: confirmed
    assert current and float(fields["observed_at"]) == 40.0
    fields, current = await store.advance_source(name, "pushed", "v1", 50.0)  # each channel has its own order
    assert current and fields["pushed"] == "v1" and fields["observed"] == "v2"
    assert await store.get_source(name) == fields


async def test_one_probe_claim_per_interval(store: MemoryEvidenceStore) -> None:
    name = f"docs-{uuid.uuid4().hex[:6]}"
    assert (await store.claim_probe(name, 100.0, 60.0))[0]
    claimed, fields = await store.claim_probe(name, 130.0, 60.0)
    assert not claimed and float(fields["probed_at"]) == 100.0
    assert (await store.claim_probe(name, 160.0, 60.0))[0]


async def test_aliases_are_filed_in_the_same_step(store: MemoryEvidenceStore) -> None:
    p = pk()
    e = entry("q")
    await store.put(p, "q~view", e, unit(1, 0, 0), 60, ("q",))
    assert await store.get_many(p, ["q~view", "q"]) == [e, e]
    assert [x.query for _, x in await store.nearest(p, unit(1, 0, 0), 0.5, 5)] == ["q"]  # one vector


async def test_raised_thresholds_only_go_up(store: MemoryEvidenceStore) -> None:
    scope = pk()
    assert await store.get_threshold(scope) is None
    assert await store.raise_threshold(scope, 0.87) == pytest.approx(0.87)
    assert await store.raise_threshold(scope, 0.86) == pytest.approx(0.87)  # a stale replica's raise loses
    assert await store.raise_threshold(scope, 0.93) == pytest.approx(0.93)
    assert await store.get_threshold(scope) == pytest.approx(0.93) and await store.get_threshold(pk()) is None


async def test_the_memory_store_keeps_a_bounded_number_of_raised_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    # each disagreeing audit may add an entry's own floor (issue 33): the least recently raised goes first
    from ragtoll.proxy.stores import evidence_memory

    monkeypatch.setattr(evidence_memory, "MAX_THRESHOLDS", 3)
    store = MemoryEvidenceStore()
    for scope in ("route", "e1", "e2"):
        await store.raise_threshold(scope, 0.9)
    await store.raise_threshold("route", 0.95)  # raised again: the most recent
    await store.raise_threshold("e3", 0.9)
    assert await store.get_threshold("e1") is None
    assert [await store.get_threshold(s) for s in ("route", "e2", "e3")] == [0.95, 0.9, 0.9]


async def test_redis_keys_share_the_partition_hash_tag_and_all_expire(redis_url: str) -> None:
    store = RedisEvidenceStore.from_url(redis_url, max_partition_entries=3)
    client = aioredis.Redis.from_url(redis_url)
    try:
        p = pk()
        for i in range(5):
            await store.put(p, f"q{i}", entry(f"q{i}"), unit(1, i, 0), 120)
        await store.advance_source("docs-ttl", "observed", "v9", 1.0)
        await store.advance_source("docs-ttl", "observed", "v10", 2.0)
        await store.claim_probe("docs-ttl", 3.0, 60.0)
        await store.raise_threshold(p, 0.9)
        keys = [k.decode() async for k in client.scan_iter(match=f"ragtoll:{{c:{p}}}:*")]
        assert keys and all(k.startswith(f"ragtoll:{{c:{p}}}:") for k in keys)
        source = [k.decode() async for k in client.scan_iter(match="ragtoll:{v:docs-ttl}:*")]
        assert sorted(source) == ["ragtoll:{v:docs-ttl}:seen:observed", "ragtoll:{v:docs-ttl}:state"]
        for k in keys + source + [f"ragtoll:{{a:{p}}}:audit"]:
            assert 0 < await client.ttl(k) <= 30 * 24 * 3600
        # bounded: the two oldest were trimmed with their vectors
        assert await client.hlen(f"ragtoll:{{c:{p}}}:v") == 3
        assert await store.get(p, "q0") is None and await store.get(p, "q4") is not None
        # an entry that expired before its vector: its vector is dropped on the next scan
        await client.delete(f"ragtoll:{{c:{p}}}:e:q4")
        assert [e.query for _, e in await store.nearest(p, unit(1, 4, 0), 0.0, 5)] != []
        assert await client.hexists(f"ragtoll:{{c:{p}}}:v", "q4") == 0
    finally:
        await store.aclose()
        await client.aclose()


async def test_memory_ttl_and_lru_bounds() -> None:
    clock = Clock(0.0)
    store = MemoryEvidenceStore(max_entries=3, max_bytes=10_000, clock=clock)
    for i in range(4):
        await store.put("p", f"q{i}", entry(f"q{i}"), unit(1, i, 0), 60)
    assert len(store) == 3 and await store.get("p", "q0") is None  # least recently used evicted
    await store.get("p", "q1")  # touch: now q2 is the oldest
    await store.put("p", "q4", entry("q4"), unit(1, 4, 0), 60)
    assert await store.get("p", "q2") is None and await store.get("p", "q1") is not None
    clock.now = 61
    assert await store.get("p", "q1") is None
    assert await store.nearest("p", unit(1, 1, 0), 0.0, 5) == []  # expired entries are never candidates
    big = entry("big", body=b"x" * 20_000)
    await store.put("p", "big", big, None, 60)
    assert await store.get("p", "big") is None  # larger than the whole budget: not kept
    assert store.bytes <= 10_000


@pytest.mark.slow
async def test_redis_cluster_partition_steps_are_single_slot() -> None:
    from support.budget_cluster import start_budget_cluster
    from support.redis_server import stop_all

    nodes = start_budget_cluster(masters=3)
    store = RedisEvidenceStore.from_url(f"redis+cluster://127.0.0.1:{nodes[0].port}", max_partition_entries=2,
                                        timeout_s=2.0)
    try:
        parts = [pk() for _ in range(6)]  # spread over the cluster's slots
        for p in parts:
            for i in range(3):
                await store.put(p, f"q{i}", entry(f"{p}-{i}"), unit(1, i, 0), 60)
        for p in parts:
            found = await store.nearest(p, unit(1, 2, 0), 0.0, 5)
            assert [e.query for _, e in found] == [f"{p}-2", f"{p}-1"]  # bounded to 2, oldest trimmed
            assert await store.get(p, "q0") is None
            assert [e and e.query for e in await store.get_many(p, ["q2", "q0", "q1"])] == [f"{p}-2", None, f"{p}-1"]
        for i, v in enumerate(("v3", "v4", "v3")):  # versions move forward on a Cluster too
            await store.advance_source("docs", "observed", v, float(i))
        assert (await store.get_source("docs") or {})["observed"] == "v4"
        assert (await store.claim_probe("docs", 10.0, 60.0))[0]
        for p in parts:
            assert await store.raise_threshold(p, 0.91) == pytest.approx(0.91)
            assert await store.get_threshold(p) == pytest.approx(0.91)
    finally:
        await store.aclose()
        stop_all(nodes)
