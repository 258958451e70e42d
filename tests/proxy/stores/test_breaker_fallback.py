"""The breaker's local ledger, against a real redis-server stalled with CLIENT PAUSE: while the
store's answer is unknown, reserves are decided on the local ledger (same limits, marked degraded),
and what such a reservation does next (extend, settle, escalate) goes back to that ledger."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from ragtoll.proxy.core.budget import Actual, Charge
from ragtoll.proxy.stores.base import TaskMeta
from ragtoll.proxy.stores.breaker import LOCAL_PREFIX, Breaker
from ragtoll.proxy.stores.memory import MemoryStore
from ragtoll.proxy.stores.redis import RedisStore
from support.redis_server import RedisProcess, start_redis, stop_all

LIMITS = {"max_steps": 2, "max_completion_tokens": 100}
STEP = Charge(steps=1, completion_reserve=10)


@pytest.fixture
def paused() -> Iterator[RedisProcess]:
    server = start_redis()
    try:
        yield server
    finally:
        stop_all([server])


def wall_ms() -> int:
    return int(time.time() * 1000)


async def reconciled(before: set[asyncio.Task[object]]) -> None:
    """The breaker's background cancels of the timed-out reserves (they give up at the expiry): the
    tasks this test started, not whatever else the session's loop runs."""
    started = asyncio.all_tasks() - before - {asyncio.current_task()}
    await asyncio.wait_for(asyncio.gather(*started, return_exceptions=True), 30)


@pytest.mark.slow
async def test_a_stalled_store_is_decided_on_the_local_ledger(paused: RedisProcess) -> None:
    store = RedisStore(paused.url, timeout_s=0.2)
    local = MemoryStore()
    breaker = Breaker(store, 0.2, wall_ms, reservation_ttl_ms=500, fallback=local)
    task, meta = f"t-{uuid.uuid4().hex}", TaskMeta("p")
    before = asyncio.all_tasks()
    try:
        await store.warm()
        paused.pause(3000)
        first = await breaker.reserve(task, meta, LIMITS, STEP, wall_ms())  # times out, then decides locally
        second = await breaker.reserve(task, meta, LIMITS, STEP, wall_ms())  # the breaker skips the store
        third = await breaker.reserve(task, meta, LIMITS, STEP, wall_ms())
        grant = await breaker.extend(task, first.reservation, 20, 0, LIMITS)
        settled = await breaker.settle(task, first.reservation, Actual(completion_tokens=25), wall_ms())
        await reconciled(before)
    finally:
        await store.aclose()
    assert (first.admitted, second.admitted, third.admitted) == (True, True, False)
    assert "TimeoutError" in first.degraded and "moments ago" in second.degraded and third.dimension == "max_steps"
    assert first.reservation.id.startswith(LOCAL_PREFIX)
    assert grant.tokens == 20  # extended on the local ledger, which holds the reservation
    assert settled is not None and settled.used("completion_tokens") == 25 + 10  # the second still holds 10
    ledger = await local.get_task(task)
    assert ledger is not None and ledger.used("inflight") == 1  # the first settled there, the second in flight


@pytest.mark.slow
async def test_without_a_fallback_a_stalled_store_raises(paused: RedisProcess) -> None:
    store = RedisStore(paused.url, timeout_s=0.2)
    breaker = Breaker(store, 0.2, wall_ms, reservation_ttl_ms=500)
    before = asyncio.all_tasks()
    try:
        await store.warm()
        paused.pause(2000)
        with pytest.raises(TimeoutError):
            await breaker.reserve(f"t-{uuid.uuid4().hex}", TaskMeta("p"), LIMITS, STEP, wall_ms())
        await reconciled(before)
    finally:
        await store.aclose()
