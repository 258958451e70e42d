"""A budget store behind a circuit breaker per failure domain, with every call bounded in time, and
the reconciliation of reservations whose outcome a store fault hid.

After a store failure, reservations for tasks in the same failure domain (on Redis Cluster: the
node that owns the task's slot) fail at once for STORE_RETRY_MS instead of each waiting out
`store_timeout_ms` against a store that is down; other domains are unaffected.

While the store's answer is unknown (a reserve timed out or failed, or its domain is skipped), a
breaker with a `fallback` (`on_store_error: open`) decides on a local, in-process ledger instead: a
MemoryStore, the same admit rule and limits per task, with this process's own count of the task's
calls (`Decision.degraded` says so). Its reservations carry LOCAL_PREFIX, so their extensions and
settle go back to it. So a cold or flaky store never lets a call through unbudgeted: what it costs
is that each replica's local ledger admits at most a task's limit, on top of what the store admitted
(docs "Guarantees": at most `(replicas + 1) x limit` per task, however long the store stays away).

A reserve that fails (timeout, a broken connection, the caller gone) may still run on the store
later (a paused server works through its backlog): its reservation is cancelled in the
background, retried until its expiry, so a call that was never admitted is never charged. A
settle that fails is retried the same way (settle is idempotent by reservation id), so no call
stays in flight. A reservation whose store stays away past its expiry stops counting as in
flight there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace

from ..core.budget import Actual, Charge, Ledger, Reservation
from ..core.hold import Grant
from ..errors import StoreUnavailable
from .base import DEFAULT_RESERVATION_TTL_MS, Decision, Store, TaskMeta, new_reservation_id

STORE_RETRY_MS = 1000
LOCAL_PREFIX = "local-"  # the reservations of the local ledger (a store's ids are hex digits)
# tasks the local ledger keeps, least recently used first out (a task it forgets starts afresh there)
LOCAL_MAX_TASKS = 50_000
MAX_DOWN_DOMAINS = 1024  # domains remembered as down: a cluster's nodes (or slots, before its map is known)
MAX_RECONCILING = 100_000  # reservations being reconciled at once; past this, their expiry does it
FIRST_RETRY_S = 0.05


class Breaker:
    """`reserve`, `extend` and `settle` of `store`, each within `timeout_s`; a failed reserve or
    extend opens the breaker for its task's domain. Reservations expire `reservation_ttl_ms` after
    their reserve or last extension."""

    def __init__(self, store: Store, timeout_s: float, wall_ms: Callable[[], int],
                 reservation_ttl_ms: int = DEFAULT_RESERVATION_TTL_MS, fallback: Store | None = None) -> None:
        """`fallback`: the local ledger that decides while the store's answer is unknown (None:
        such a reserve raises, and the caller applies `on_store_error`)."""
        self.store = store
        self.fallback = fallback
        self.timeout_s = timeout_s
        self.reservation_ttl_ms = reservation_ttl_ms
        self._wall_ms = wall_ms
        self._down_until: dict[str, int] = {}  # failure domain -> wall ms until which it is skipped
        self._reconciling: set[asyncio.Task[None]] = set()

    async def reserve(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge,
                      now_ms: int, shadow: bool = False) -> Decision:
        domain = self.store.failure_domain(task_id)
        if now_ms < self._down_until.get(domain, 0):
            why = f"the store ({domain}) failed moments ago; not retried yet"
            if self.fallback is None:
                raise StoreUnavailable(why)
            return await self._local(task_id, meta, limits, charge, now_ms, shadow, why)
        rid, expires = new_reservation_id(), now_ms + self.reservation_ttl_ms
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.store.reserve(task_id, meta, limits, charge, now_ms, shadow,
                                                reservation_id=rid, expires_ms=expires)
        except BaseException as exc:  # the reserve may yet run: make sure it charges nothing
            self._later(task_id, lambda: self.store.cancel(task_id, rid, self._wall_ms()), expires)
            if not isinstance(exc, Exception):
                raise
            self._open(domain)
            if self.fallback is None:
                raise
            return await self._local(task_id, meta, limits, charge, now_ms, shadow,
                                     f"the store did not answer: {type(exc).__name__}")

    async def _local(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge,
                     now_ms: int, shadow: bool, why: str) -> Decision:
        """The local ledger's decision (no I/O: it cannot fail or wait), marked degraded."""
        assert self.fallback is not None
        decision = await self.fallback.reserve(
            task_id, meta, limits, charge, now_ms, shadow, reservation_id=LOCAL_PREFIX + new_reservation_id(),
            expires_ms=now_ms + self.reservation_ttl_ms)
        return replace(decision, degraded=why)

    def _for(self, reservation: Reservation) -> Store:
        """The store that holds `reservation`: the local ledger's own, else the store."""
        if self.fallback is not None and reservation.id.startswith(LOCAL_PREFIX):
            return self.fallback
        return self.store

    async def forget(self, task_id: str) -> None:
        """The task ended: the local ledger lets it go too."""
        if self.fallback is not None:
            await self.fallback.end_task(task_id)

    async def extend(self, task_id: str, reservation: Reservation, tokens: int, cost_nusd: int,
                     limits: Mapping[str, int]) -> Grant:
        """Extend `reservation` (and its expiry). A lost answer costs nothing: settle replaces
        whatever the store holds for the reservation."""
        now = self._wall_ms()
        if (store := self._for(reservation)) is not self.store:
            return await store.extend(task_id, reservation.id, tokens, cost_nusd, limits, now,
                                      now + self.reservation_ttl_ms)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.store.extend(task_id, reservation.id, tokens, cost_nusd, limits, now,
                                               now + self.reservation_ttl_ms)
        except Exception:
            self._open(self.store.failure_domain(task_id))
            raise

    async def escalate(self, task_id: str, from_profile: str, to_profile: str, dimension: str,
                       local: bool = False) -> bool:
        """The store's escalate within `timeout_s` (`local`: the local ledger's, for a task it refused);
        a failure opens the breaker like a reserve's."""
        if local and self.fallback is not None:
            return await self.fallback.escalate(task_id, from_profile, to_profile, dimension)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.store.escalate(task_id, from_profile, to_profile, dimension)
        except Exception:
            self._open(self.store.failure_domain(task_id))
            raise

    async def settle(self, task_id: str, reservation: Reservation, actual: Actual, now_ms: int) -> Ledger | None:
        if (store := self._for(reservation)) is not self.store:
            return await store.settle(task_id, reservation, actual, now_ms)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.store.settle(task_id, reservation, actual, now_ms)
        except BaseException:
            if reservation.id:  # idempotent: a settle that did land changes nothing the second time
                until = max(reservation.expires_ms, now_ms + self.reservation_ttl_ms)
                self._later(task_id, lambda: self.store.settle(task_id, reservation, actual, self._wall_ms()), until)
            raise

    def _later(self, task_id: str, step: Callable[[], Awaitable[object]], until_ms: int) -> None:
        """Run `step` (a store call for `task_id`) in the background until it succeeds or
        `until_ms` passes."""
        if len(self._reconciling) >= MAX_RECONCILING:
            return
        task = asyncio.get_running_loop().create_task(self._retry(self.store.failure_domain(task_id), step, until_ms))
        self._reconciling.add(task)
        task.add_done_callback(self._reconciling.discard)

    async def _retry(self, domain: str, step: Callable[[], Awaitable[object]], until_ms: int) -> None:
        delay, first = FIRST_RETRY_S, True
        while self._wall_ms() < until_ms:
            # at once (to queue behind its reserve), then only when the domain is not marked down:
            # a store that stays away gets a probe a while, not one per reservation
            if first or self._wall_ms() >= self._down_until.get(domain, 0):
                first = False
                try:
                    async with asyncio.timeout(self.timeout_s):
                        await step()
                    return
                except Exception:  # noqa: BLE001 - the store is still away: again, until the expiry
                    self._open(domain)
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORE_RETRY_MS / 1000)

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
