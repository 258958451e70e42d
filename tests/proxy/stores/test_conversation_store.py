"""The conversation store contract, run unchanged against memory, a real Redis and a real Redis
Cluster: links found until they expire, pending tool calls newest first, one entry per
conversation, bounded per client scope."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from ragtoll.proxy.core.conversation import Pending
from ragtoll.proxy.stores.conversations import (
    MAX_PENDING,
    ConversationStore,
    MemoryConversationStore,
    RedisConversationStore,
)
from ragtoll.proxy.stores.redis import RedisStore
from test_store_contract import CLUSTER


@pytest.fixture(params=["memory", "redis", CLUSTER])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ConversationStore]:
    if request.param == "memory":
        yield MemoryConversationStore(60)
        return
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    budget = RedisStore(url, timeout_s=2.0, ttl_s=3600)
    try:
        yield RedisConversationStore(budget.client, 60)
    finally:
        await budget.aclose()


def key() -> str:
    return uuid.uuid4().hex


async def test_links_are_found(store: ConversationStore) -> None:
    k = key()
    assert await store.find(k) is None
    await store.link(k, "conv-1")
    assert await store.find(k) == "conv-1"
    await store.link(k, "conv-2")  # a later link wins
    assert await store.find(k) == "conv-2"
    assert await store.take(k) == "conv-2"
    assert await store.take(k) is None  # taken once


async def test_pending_is_newest_first_one_entry_per_conversation(store: ConversationStore) -> None:
    scope = key()
    assert await store.recent(scope) == ([], set())
    await store.pending(scope, Pending("a", ("q1",), "k1"))
    await store.pending(scope, Pending("b", ("q2",), "k2"))
    await store.pending(scope, Pending("a", ("q3",), "k3"))  # a's latest answer replaces its earlier one
    assert await store.recent(scope) == ([Pending("a", ("q3",), "k3"), Pending("b", ("q2",), "k2")], set())
    assert await store.consume(scope, "k2:0")
    assert not await store.consume(scope, "k2:0")  # claimed once
    assert (await store.recent(scope))[1] == {"k2:0"}
    assert await store.recent(key()) == ([], set())  # scopes are apart


async def test_pending_is_bounded_per_scope(store: ConversationStore) -> None:
    scope = key()
    for i in range(MAX_PENDING * 3):
        await store.pending(scope, Pending(f"t{i}", (f"q{i}",), f"k{i}"))
    recent, _ = await store.recent(scope)
    assert len(recent) == MAX_PENDING
    assert recent[0].task_id == f"t{MAX_PENDING * 3 - 1}"


async def test_memory_links_expire() -> None:
    now = [0.0]
    store = MemoryConversationStore(10, clock=lambda: now[0])
    await store.link("k", "conv-1")
    await store.pending("s", Pending("conv-1", ("q",)))
    now[0] = 11
    assert await store.find("k") is None
    assert await store.recent("s") == ([], set())


async def test_memory_scopes_are_bounded() -> None:
    from ragtoll.proxy.stores.conversations import MAX_SCOPES

    store = MemoryConversationStore(60)
    for i in range(MAX_SCOPES + 50):
        await store.pending(f"scope-{i}", Pending("t", ("q",), "k"))
        await store.consume(f"scope-{i}", "k:0")
    assert len(store._scopes) == MAX_SCOPES and len(store._consumed) <= MAX_SCOPES
    assert await store.recent("scope-0") == ([], set())  # the least recent went first
