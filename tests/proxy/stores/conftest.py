"""Store fixtures: every contract test runs against memory, a real Redis and a real 3-master Cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from ragtoll.proxy.stores.base import Store
from ragtoll.proxy.stores.memory import MemoryStore
from ragtoll.proxy.stores.redis import RedisStore
from support.budget_cluster import start_budget_cluster
from support.redis_server import stop_all


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    nodes = start_budget_cluster(3)
    try:
        yield f"redis+cluster://127.0.0.1:{nodes[0].port}"
    finally:
        stop_all(nodes)


@pytest.fixture(params=["memory", "redis", "cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    s = RedisStore(url, timeout_s=2.0, ttl_s=3600)
    try:
        yield s
    finally:
        await s.aclose()
