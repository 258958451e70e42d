"""The store registry: a `store:` URL picks the budget store and the evidence cache's store, which
share one client (one Redis connection pool per process). A new store is one module plus one line
in `open_stores`. Stores are created in the app lifespan, never at import."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Settings
from ..errors import ConfigError
from .base import Decision, Store, TaskMeta
from .evidence import EvidenceStore
from .memory import MemoryStore

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://")


@dataclass(frozen=True, slots=True)
class Stores:
    budget: Store  # task ledgers, and task records when the store is Redis
    evidence: EvidenceStore  # the evidence cache (entries, vectors, audit thresholds)

    async def aclose(self) -> None:
        await self.evidence.aclose()
        await self.budget.aclose()  # closes the shared client last


def open_stores(settings: Settings) -> Stores:
    """The stores `settings.store` names. Does no I/O: Redis connects on first use."""
    url = settings.store
    cache = settings.cache
    if url == "memory":
        from .evidence_memory import MemoryEvidenceStore

        return Stores(MemoryStore(), MemoryEvidenceStore(cache.max_entries, cache.max_bytes,
                                                         cache.max_partition_entries))
    if url.startswith(REDIS_SCHEMES):
        from .evidence_redis import RedisEvidenceStore  # late: only Redis deployments import redis
        from .redis import RedisStore

        budget = RedisStore(url, timeout_s=settings.store_timeout_ms / 1000, ttl_s=settings.budgets.task_ttl_s,
                            records_stream=settings.budgets.records_stream)
        return Stores(budget, RedisEvidenceStore(budget.client, cache.max_partition_entries, owns_client=False))
    raise ConfigError(f"Config 'store' has value {url!r}. Expected memory or a redis URL.", key="store")


__all__ = ["Decision", "MemoryStore", "Store", "Stores", "TaskMeta", "open_stores"]
