"""Source versions and the version probe under attack (issue 30 item 9), on memory and on a real Redis:
a probe the source refused (401/403: the caller's credentials) claims nothing, and no number of
newer values brings an old one back as new."""

from __future__ import annotations

import uuid

import pytest
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.cache.versions import VersionSuperseded, probed_version
from ragtoll.proxy.model import Principal
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore
from support.clock import Clock

ALICE = Principal("alice", frozenset({"staff"}))


def source() -> str:
    return f"docs-{uuid.uuid4().hex[:8]}"  # the Redis server is shared by the session


async def test_no_number_of_newer_values_brings_an_old_one_back(evidence_store: MemoryEvidenceStore) -> None:
    name = source()
    assert (await evidence_store.advance_source(name, "pushed", "v-old", 1.0))[1]
    for i in range(1001):  # more than the old window of 1,000 values remembered
        assert (await evidence_store.advance_source(name, "pushed", f"v{i}", 2.0 + i))[1]
    fields, current = await evidence_store.advance_source(name, "pushed", "v-old", 5000.0)
    assert not current and fields["pushed"] == "v1000"
    fields, current = await evidence_store.advance_source(name, "pushed", "v1", 5001.0)  # any superseded value
    assert not current and fields["pushed"] == "v1000"


async def test_an_old_push_is_refused_by_the_admin_path_after_many_newer_ones(evidence_store: MemoryEvidenceStore) -> None:
    cache = EvidenceCache(evidence_store)
    name = source()
    await cache.versions.set(name, "release-1")
    for i in range(1001):
        await evidence_store.advance_source(name, "pushed", f"r{i}", 10.0 + i)
    with pytest.raises(VersionSuperseded):
        await cache.versions.set(name, "release-1")
    assert (await cache.versions.state(name, fresh=True)).pushed == "r1000"


async def test_a_released_claim_lets_the_next_caller_probe(evidence_store: MemoryEvidenceStore) -> None:
    name = source()
    assert (await evidence_store.claim_probe(name, 100.0, 60.0))[0]
    await evidence_store.release_probe(name, 100.0)
    assert (await evidence_store.claim_probe(name, 101.0, 60.0))[0]
    await evidence_store.release_probe(name, 100.0)  # not ours any more: the newer claim stands
    assert not (await evidence_store.claim_probe(name, 102.0, 60.0))[0]


async def test_a_probe_refused_for_the_callers_credentials_claims_nothing(evidence_store: MemoryEvidenceStore) -> None:
    """The reproduction: a caller the source refuses (401) triggers the probe; the good callers after
    it, on this replica and on another one sharing the store, still get a probe of their own."""
    clock = Clock()
    name = source()
    replicas = [EvidenceCache(evidence_store, max_staleness_s=60, clock=clock) for _ in range(2)]
    lk = await replicas[0].lookup(Query(name, "q", None, 5, ALICE))
    await replicas[0].store_evidence(lk, chunk_ids=["a"], acls=[("staff",)], body=b'{"results": []}', version="v1")
    asked: list[int] = []

    def probe(status: int):  # as the cache stage's probe reads the source's answer
        async def run() -> str | None:
            asked.append(status)
            return probed_version(None, "x-source-version", status, b"", {"x-source-version": "v1"})
        return run

    clock.now += 61  # past the bound: every hit needs the version confirmed
    for refused in (401, 403):
        bad = await replicas[0].lookup(Query(name, "q", None, 5, ALICE, probe=probe(refused)))
        assert not bad.hit and bad.reason == "stale:unconfirmed"
    for replica in replicas:  # the next good caller probes and is served, on either replica
        good = await replica.lookup(Query(name, "q", None, 5, ALICE, probe=probe(200)))
        assert good.hit and good.freshness in ("probed", "confirmed")
    assert asked[:3] == [401, 403, 200]
    # a probe that failed for the source's own reasons (5xx) keeps its claim: the source is not hammered
    clock.now += 61
    assert not (await replicas[0].lookup(Query(name, "q", None, 5, ALICE, probe=probe(503)))).hit
    assert not (await replicas[1].lookup(Query(name, "q", None, 5, ALICE, probe=probe(200)))).hit
    assert asked[-1] == 503
