"""The store registry: a `store:` URL picks the budget store. A new store is one module plus one
line in `open_store`. Stores are created in the app lifespan, never at import."""

from __future__ import annotations

from ..config import Settings
from ..errors import ConfigError
from .base import Decision, Store, TaskMeta
from .memory import MemoryStore

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://")


def open_store(settings: Settings) -> Store:
    """The store `settings.store` names. Does no I/O: Redis connects on first use."""
    url = settings.store
    if url == "memory":
        return MemoryStore()
    if url.startswith(REDIS_SCHEMES):
        from .redis import RedisStore  # late: only Redis deployments import redis

        return RedisStore(url, timeout_s=settings.store_timeout_ms / 1000, ttl_s=settings.budgets.task_ttl_s,
                          records_stream=settings.budgets.records_stream)
    raise ConfigError(f"Config 'store' has value {url!r}. Expected memory or a redis URL.", key="store")


__all__ = ["Decision", "MemoryStore", "Store", "TaskMeta", "open_store"]
