"""A budget store behind a circuit breaker per failure domain, with every call bounded in time.

After a store failure, reservations for tasks in the same failure domain (on Redis Cluster: the
node that owns the task's slot) fail at once for STORE_RETRY_MS instead of each waiting out
`store_timeout_ms` against a store that is down; other domains are unaffected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from ..core.budget import Actual, Charge, Ledger, Reservation
from ..errors import StoreUnavailable
from .base import Decision, Store, TaskMeta

STORE_RETRY_MS = 1000
MAX_DOWN_DOMAINS = 1024  # domains remembered as down: a cluster's nodes (or slots, before its map is known)


class Breaker:
    """`reserve` and `settle` of `store`, each within `timeout_s`; a failed reserve opens the
    breaker for its task's domain."""

    def __init__(self, store: Store, timeout_s: float, wall_ms: Callable[[], int]) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self._wall_ms = wall_ms
        self._down_until: dict[str, int] = {}  # failure domain -> wall ms until which it is skipped

    async def reserve(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge,
                      now_ms: int, shadow: bool = False) -> Decision:
        domain = self.store.failure_domain(task_id)
        if now_ms < self._down_until.get(domain, 0):
            raise StoreUnavailable(f"the store ({domain}) failed moments ago; not retried yet")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.store.reserve(task_id, meta, limits, charge, now_ms, shadow)
        except Exception:
            self._open(domain)
            raise

    async def settle(self, task_id: str, reservation: Reservation, actual: Actual, now_ms: int) -> Ledger | None:
        async with asyncio.timeout(self.timeout_s):
            return await self.store.settle(task_id, reservation, actual, now_ms)

    def _open(self, domain: str) -> None:
        """Skip `domain` for STORE_RETRY_MS. Bounded: expired windows go first, then the oldest."""
        now = self._wall_ms()
        down = self._down_until
        down.pop(domain, None)  # re-inserted last: the dict stays in order of marking
        if len(down) >= MAX_DOWN_DOMAINS:
            for d in [d for d, until in down.items() if until <= now]:
                del down[d]
            while len(down) >= MAX_DOWN_DOMAINS:
                del down[next(iter(down))]
        down[domain] = now + STORE_RETRY_MS
