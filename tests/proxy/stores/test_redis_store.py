"""Redis-only promises: one script call per reserve and per settle, one hash tag per task, TTL on every key."""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import redis
import redis.asyncio as aioredis
from ragtoll.proxy.core.budget import Actual, Charge
from ragtoll.proxy.stores.base import TaskMeta
from ragtoll.proxy.stores.redis import RedisStore, task_keys

META = TaskMeta("bounded")


class CountingConnection(aioredis.Connection):
    """Counts commands written to the socket: one per client round trip (no pipelining here)."""

    sent: ClassVar[list[bytes]] = []

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        packed = command if isinstance(command, bytes) else b"".join(command)
        CountingConnection.sent.append(packed.split(b"\r\n")[2].upper())
        await super().send_packed_command(command, check_health)


async def test_one_round_trip_per_reserve_and_per_settle(redis_url: str) -> None:
    store = RedisStore(redis_url, timeout_s=2.0, connection_class=CountingConnection)
    try:
        t = f"rt-{uuid.uuid4().hex}"
        d = await store.reserve(t, META, {"max_steps": 5}, Charge(steps=1), 1)  # connects, loads scripts
        await store.settle(t, d.reservation, Actual(chunk_ids=("a",)), 2)
        CountingConnection.sent.clear()
        for i in range(10):
            d = await store.reserve(t, META, {"max_steps": 50}, Charge(steps=1), 10 + i)
            await store.settle(t, d.reservation, Actual(completion_tokens=3, chunk_ids=("b", "c")), 20 + i)
        assert CountingConnection.sent == [b"EVALSHA"] * 20
    finally:
        await store.aclose()


async def test_every_key_of_a_task_shares_a_hash_tag_and_has_a_ttl(redis_url: str) -> None:
    store = RedisStore(redis_url, timeout_s=2.0, ttl_s=600)
    sync = redis.Redis.from_url(redis_url)
    try:
        t = "weird}{task\r\nid"
        d = await store.reserve(t, META, {}, Charge(retrieval_calls=1, query_key="q"), 1)
        await store.settle(t, d.reservation, Actual(chunk_ids=("c1",)), 2)
        keys = task_keys(t)
        tags = {k[k.index("{"): k.index("}") + 1] for k in keys}
        assert len(tags) == 1 and "\n" not in next(iter(tags))
        for key in keys:
            assert sync.exists(key) == 1
            assert 0 < sync.ttl(key) <= 600
        await store.end_task(t)
        assert sync.exists(*keys) == 0
    finally:
        sync.close()
        await store.aclose()


async def test_records_go_to_a_stream(redis_url: str) -> None:
    stream = f"ragtoll:test-records:{uuid.uuid4().hex}"
    store = RedisStore(redis_url, timeout_s=2.0, records_stream=stream)
    sync = redis.Redis.from_url(redis_url)
    try:
        await store.append_records([{"task_id": "x", "steps": 2}, {"task_id": "y", "steps": 1}])
        entries = sync.xrange(stream)
        assert [e[1] for e in entries] == [{b"record": b'{"task_id":"x","steps":2}'},
                                           {b"record": b'{"task_id":"y","steps":1}'}]
    finally:
        sync.delete(stream)
        sync.close()
        await store.aclose()
