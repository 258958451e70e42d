"""The principal store: budgets across tasks, in the same store as task budgets (memory or Redis).

Per principal it keeps the tasks it has live (first call until the task ends), the tasks it started
in the last minute, and its settled cost in minute and hour buckets (core/principals.py). `admit`
is one atomic step (memory: no await between read and write; Redis: one script, one round trip,
all of a principal's keys under one hash tag `ragtoll:{p:<hash>}:`, so it runs on Cluster).
`release` forgets an ended task; a task whose end is never seen (its replica died) is dropped once
it has had no call for `stale_ms`.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..config import Settings
from ..core import principals as pc
from ..core.principals import Standing

MAX_PRINCIPALS = 100_000  # memory store: least recently seen principals go first beyond this
MAX_OWNERS = 200_000  # memory store: task -> principal entries kept for release
KEY_TTL_S = 25 * 3600  # a day of hour buckets, and an hour to spare


@dataclass(frozen=True, slots=True)
class PrincipalDecision:
    """`admitted` False: nothing was counted. In shadow mode `admitted` is True and `dimension`
    names the limit that would have refused. `standing`: the use before this call."""

    admitted: bool
    dimension: str | None
    new_task: bool
    standing: Standing


class PrincipalStore(Protocol):
    async def admit(self, principal: str, task_id: str, limits: Mapping[str, int], now_ms: int,
                    shadow: bool = False) -> PrincipalDecision:
        """Check `limits` (core/principals units); if they admit, count `task_id` as live (and as
        started now, when new to the principal)."""
        ...

    async def charge(self, principal: str, cost_nusd: int, now_ms: int) -> None:
        """Add a call's settled cost to the principal's rolling windows."""
        ...

    async def release(self, task_id: str) -> None:
        """The task ended: it no longer counts as live for its principal."""
        ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class _Principal:
    live: OrderedDict[str, int] = field(default_factory=OrderedDict)  # task -> last call ms, oldest first
    started: deque[int] = field(default_factory=deque)  # start ms of the tasks of the last minute
    minutes: dict[int, int] = field(default_factory=dict)  # minute -> nano-USD
    hours: dict[int, int] = field(default_factory=dict)


class MemoryPrincipalStore:
    def __init__(self, stale_ms: int) -> None:
        self.stale_ms = stale_ms
        self._principals: OrderedDict[str, _Principal] = OrderedDict()
        self._owners: OrderedDict[str, str] = OrderedDict()

    async def admit(self, principal: str, task_id: str, limits: Mapping[str, int], now_ms: int,
                    shadow: bool = False) -> PrincipalDecision:
        p = self._get(principal)
        while p.live and next(iter(p.live.values())) < now_ms - self.stale_ms:
            p.live.popitem(last=False)
        while p.started and p.started[0] <= now_ms - pc.NEW_TASK_WINDOW_MS:
            p.started.popleft()
        new_task = task_id not in p.live
        standing = Standing(len(p.live), len(p.started), *_costs(p, limits, now_ms))
        dim = pc.first_exceeded(limits, standing, new_task)
        if dim is not None and not shadow:
            return PrincipalDecision(False, dim, new_task, standing)
        p.live[task_id] = max(now_ms, p.live.get(task_id, now_ms))
        p.live.move_to_end(task_id)
        if new_task:
            p.started.append(now_ms)
            self._owners[task_id] = principal
            self._owners.move_to_end(task_id)
            while len(self._owners) > MAX_OWNERS:
                self._owners.popitem(last=False)
        return PrincipalDecision(True, dim, new_task, standing)

    async def charge(self, principal: str, cost_nusd: int, now_ms: int) -> None:
        p = self._get(principal)
        for buckets, current, width in ((p.minutes, pc.minute_of(now_ms), pc.HOUR_BUCKETS),
                                        (p.hours, pc.hour_of(now_ms), pc.DAY_BUCKETS)):
            buckets[current] = buckets.get(current, 0) + cost_nusd
            for k in [k for k in buckets if k <= current - width]:
                del buckets[k]

    async def release(self, task_id: str) -> None:
        principal = self._owners.pop(task_id, None)
        p = self._principals.get(principal) if principal is not None else None
        if p is not None:
            p.live.pop(task_id, None)

    def _get(self, principal: str) -> _Principal:
        p = self._principals.get(principal)
        if p is None:
            p = self._principals[principal] = _Principal()
            while len(self._principals) > MAX_PRINCIPALS:
                self._principals.popitem(last=False)
        else:
            self._principals.move_to_end(principal)
        return p

    async def aclose(self) -> None:
        return None


def _costs(p: _Principal, limits: Mapping[str, int], now_ms: int) -> tuple[int, int]:
    """The cost of the last hour and day, each summed only when it has a limit (0 otherwise)."""
    hour = pc.window_sum(p.minutes, pc.minute_of(now_ms), pc.HOUR_BUCKETS) if "max_cost_usd_per_hour" in limits else 0
    day = pc.window_sum(p.hours, pc.hour_of(now_ms), pc.DAY_BUCKETS) if "max_cost_usd_per_day" in limits else 0
    return hour, day


def principal_keys(principal: str) -> tuple[str, str, str, str]:
    """(live tasks, new tasks, cost per minute, cost per hour) keys of a principal: one hash tag."""
    tag = hashlib.blake2b(principal.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    base = f"ragtoll:{{p:{tag}}}:"
    return base + "live", base + "new", base + "cm", base + "ch"


class RedisPrincipalStore:
    """Runs on the budget store's client, its in-flight bound and script loading (`budget._run`).
    The task -> principal link, for `release`, is one key beside the task's own (its hash tag)."""

    def __init__(self, budget: Any, *, stale_ms: int, owner_ttl_s: int) -> None:
        from .redis import _script, task_keys  # late: only Redis deployments import redis

        self._budget = budget
        self._task_keys = task_keys
        self.stale_ms = stale_ms
        self.owner_ttl_s = owner_ttl_s
        self._admit = _script("principal_admit")
        self._charge = _script("principal_charge")

    def _owner_key(self, task_id: str) -> str:
        return self._task_keys(task_id)[0][:-1] + "principal"

    async def admit(self, principal: str, task_id: str, limits: Mapping[str, int], now_ms: int,
                    shadow: bool = False) -> PrincipalDecision:
        args: list[Any] = [task_id, now_ms, KEY_TTL_S, self.stale_ms, 1 if shadow else 0,
                           *(limits.get(d, -1) for d in pc.DIMENSIONS)]
        out = await self._budget._run(self._admit, principal_keys(principal), args)
        status, dim, new = out[0].decode(), out[1].decode() or None, int(out[2]) == 1
        standing = Standing(int(out[3]), int(out[4]), int(out[5]), int(out[6]))
        if status == "admit" and new:
            await self._budget.client.set(self._owner_key(task_id), principal, ex=self.owner_ttl_s)
        return PrincipalDecision(status == "admit", dim, new, standing)

    async def charge(self, principal: str, cost_nusd: int, now_ms: int) -> None:
        keys = principal_keys(principal)
        await self._budget._run(self._charge, keys[2:], [now_ms, cost_nusd, KEY_TTL_S])

    async def release(self, task_id: str) -> None:
        client = self._budget.client
        owner = await client.getdel(self._owner_key(task_id))
        if owner is not None:
            await client.zrem(principal_keys(owner.decode())[0], task_id)

    async def aclose(self) -> None:
        return None  # the budget store closes the shared client


def open_principal_store(settings: Settings, budget: Any) -> PrincipalStore | None:
    """The principal store beside the budget store `budget` (same store, same client), or None
    when `principals:` sets no limit."""
    if not settings.principals.enabled:
        return None
    if settings.store == "memory":
        return MemoryPrincipalStore(_stale_ms(settings))
    return RedisPrincipalStore(budget, stale_ms=_stale_ms(settings), owner_ttl_s=settings.budgets.task_ttl_s)


def local_principal_store(settings: Settings) -> MemoryPrincipalStore | None:
    """The local ledger a shared principal store's stage decides on while the store's answer is
    unknown (`on_store_error: open`; stores/breaker.py does the same for task budgets), or None."""
    if not settings.principals.enabled or settings.store == "memory" or settings.on_store_error != "open":
        return None
    return MemoryPrincipalStore(_stale_ms(settings))


def _stale_ms(settings: Settings) -> int:
    # a task idle past the longest a reservation can stay in flight is presumed lost with its replica
    return int((settings.tasks.idle_timeout_s + settings.budgets.reservation_ttl_s) * 1000)
