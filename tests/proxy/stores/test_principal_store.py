"""The principal store contract, run unchanged against memory, a real Redis and a real 3-master
Redis Cluster: a limit of N admits N, windows roll, ended tasks free their place, refusals count nothing."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from ragtoll.proxy.core.principals import HOUR_MS, MINUTE_MS
from ragtoll.proxy.stores.principals import MemoryPrincipalStore, PrincipalStore, RedisPrincipalStore
from ragtoll.proxy.stores.redis import RedisStore
from test_store_contract import CLUSTER

T0 = 1_700_000_000_000 - 1_700_000_000_000 % HOUR_MS  # the start of an hour
STALE_MS = 20 * MINUTE_MS


@pytest.fixture(params=["memory", "redis", CLUSTER])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[PrincipalStore]:
    if request.param == "memory":
        yield MemoryPrincipalStore(STALE_MS)
        return
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    budget = RedisStore(url, timeout_s=2.0, ttl_s=3600)
    try:
        yield RedisPrincipalStore(budget, stale_ms=STALE_MS, owner_ttl_s=3600)
    finally:
        await budget.aclose()


def pid() -> str:
    return f"key:{uuid.uuid4().hex}"


async def test_new_tasks_per_minute_admits_n_and_counts_no_refusal(store: PrincipalStore) -> None:
    p, limits = pid(), {"max_new_tasks_per_minute": 3}
    decisions = [await store.admit(p, f"t{i}", limits, T0 + i) for i in range(5)]
    assert [d.admitted for d in decisions] == [True, True, True, False, False]
    assert [d.new_task for d in decisions] == [True] * 5
    assert decisions[3].dimension == "max_new_tasks_per_minute" and decisions[4].standing.new_tasks == 3
    again = await store.admit(p, "t0", limits, T0 + 10)  # a task it already has is not new
    assert again.admitted and not again.new_task
    # the window slides: 60 s after the first start, one place is free again
    assert not (await store.admit(p, "t9", limits, T0 + MINUTE_MS - 1)).admitted
    assert (await store.admit(p, "t9", limits, T0 + MINUTE_MS)).admitted


async def test_concurrent_tasks_until_one_is_released(store: PrincipalStore) -> None:
    p, limits = pid(), {"max_concurrent_tasks": 2}
    a, b, c = (f"task-{uuid.uuid4().hex}" for _ in range(3))
    assert (await store.admit(p, a, limits, T0)).admitted
    assert (await store.admit(p, b, limits, T0)).admitted
    refused = await store.admit(p, c, limits, T0)
    assert (refused.admitted, refused.dimension, refused.standing.live_tasks) == (False, "max_concurrent_tasks", 2)
    assert (await store.admit(p, a, limits, T0 + 1)).admitted  # a live task goes on
    await store.release(a)
    await store.release("never-seen")  # unknown: nothing happens
    assert (await store.admit(p, c, limits, T0 + 2)).admitted
    assert not (await store.admit(p, a, limits, T0 + 3)).admitted  # a comes back as a new task: full


async def test_a_task_whose_end_is_never_seen_is_dropped_once_stale(store: PrincipalStore) -> None:
    p, limits = pid(), {"max_concurrent_tasks": 1}
    assert (await store.admit(p, "lost", limits, T0)).admitted
    assert not (await store.admit(p, "next", limits, T0 + STALE_MS)).admitted
    assert (await store.admit(p, "next", limits, T0 + STALE_MS + 1)).admitted


async def test_cost_per_hour_and_day_roll_by_the_minute_and_the_hour(store: PrincipalStore) -> None:
    p = pid()
    hour, day = {"max_cost_usd_per_hour": 1000, "max_cost_usd_per_day": 10**6}, {"max_cost_usd_per_day": 1500}
    await store.charge(p, 600, T0)
    await store.charge(p, 400, T0 + 30 * MINUTE_MS)
    d = await store.admit(p, "t", hour, T0 + 59 * MINUTE_MS)
    assert (d.admitted, d.dimension, d.standing.cost_hour) == (False, "max_cost_usd_per_hour", 1000)
    d = await store.admit(p, "t", hour, T0 + 60 * MINUTE_MS)  # the first minute's 600 left the hour
    assert (d.admitted, d.standing.cost_hour, d.standing.cost_day) == (True, 400, 1000)
    await store.charge(p, 500, T0 + 23 * HOUR_MS)
    d = await store.admit(p, "t", day, T0 + 23 * HOUR_MS + 1)
    assert (d.admitted, d.dimension, d.standing.cost_day) == (False, "max_cost_usd_per_day", 1500)
    d = await store.admit(p, "t", day, T0 + 24 * HOUR_MS)  # the first hour left the day
    assert (d.admitted, d.standing.cost_day) == (True, 500)


async def test_shadow_counts_what_it_would_refuse(store: PrincipalStore) -> None:
    p, limits = pid(), {"max_new_tasks_per_minute": 1}
    assert (await store.admit(p, "a", limits, T0, shadow=True)).dimension is None
    d = await store.admit(p, "b", limits, T0, shadow=True)
    assert (d.admitted, d.dimension) == (True, "max_new_tasks_per_minute")
    assert (await store.admit(p, "c", limits, T0)).standing.new_tasks == 2


async def test_concurrent_admits_never_pass_the_limit(store: PrincipalStore) -> None:
    p, limits = pid(), {"max_new_tasks_per_minute": 7, "max_concurrent_tasks": 100}
    decisions = await asyncio.gather(*(store.admit(p, f"t{i}", limits, T0) for i in range(64)))
    assert sum(d.admitted for d in decisions) == 7
