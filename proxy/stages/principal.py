"""Principal stage: budgets across tasks (`principals:`), before the task's own budget.

Guarantees: one store round trip before forwarding (`admit`: is the task new to its principal,
and do the principal's new-tasks-per-minute, concurrent-tasks and rolling-cost limits admit it);
a refused call never reaches the upstream and raises `BudgetExceeded` with `scope: principal`
(the pipeline renders it as every budget rejection, `x-should-retry: false`); an admitted call's
settled spend (`ex.settlement`, which the budget stage after it writes in its `on_end`, so before
this one's) is charged to the principal in `on_end`; a task stops counting as live when it ends
(`on_task_end`: records end, idle sweep, admin end). While the store's answer is unknown (it
failed, or failed moments ago), `on_store_error: open` decides on a local ledger (`fallback`, the
memory store's rule and the same limits; every settled cost this replica sees is charged to it
too) and marks the call degraded; `closed` answers 503. The principal is `ex.caller.id`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ragtoll.instrumentation import semconv as sc

from ..config import Settings
from ..core import principals as pc
from ..core.budget import sf_dictionary
from ..errors import BudgetExceeded, StoreUnavailable
from ..request.exchange import Exchange, Reply, Stage, contract
from ..stores.breaker import STORE_RETRY_MS
from ..stores.principals import PrincipalDecision, PrincipalStore
from .budget import REMAINING_HEADER, store_failed
from .budget_span import record_degraded


class PrincipalStage(Stage):
    contract = contract(reads="task caller route span",
                        writes="charged_principal degraded degraded_bound response_headers",
                        end_reads="charged_principal settlement span")

    def __init__(self, settings: Settings, store: PrincipalStore, *, wall_ms: Callable[[], int] | None = None,
                 fallback: PrincipalStore | None = None) -> None:
        """`fallback`: the local ledger (stores.principals.local_principal_store), or None."""
        self.settings = settings
        self.cfg = settings.principals
        self.store = store
        self.fallback = fallback
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self._timeout_s = settings.store_timeout_ms / 1000
        self._shadow = settings.budgets.mode == "shadow"
        self._units: dict[str, dict[str, int]] = {}  # principal with an override -> its limits
        self._default = pc.to_units(self.cfg.default.limits())
        self._down_until = 0  # wall ms: after a store failure, skip it for a moment (as stores.breaker)
        self._releases: set[asyncio.Task[None]] = set()

    def limits(self, principal: str) -> dict[str, int]:
        if principal not in self.cfg.overrides:
            return self._default
        units = self._units.get(principal)
        if units is None:
            units = self._units[principal] = pc.to_units(self.cfg.limits_for(principal))
        return units

    async def on_request(self, ex: Exchange) -> Reply | None:
        if ex.task is None or ex.caller is None:
            return None
        principal = ex.caller.id
        limits = self.limits(principal)
        if not limits:  # only overrides set limits, none for this principal: nothing to count
            return None
        now = self._wall_ms()
        try:
            if now < self._down_until:
                raise StoreUnavailable("the store failed moments ago; not retried yet")
            async with asyncio.timeout(self._timeout_s):
                decision = await self.store.admit(principal, ex.task.id, limits, now, self._shadow)
        except Exception as exc:  # noqa: BLE001 - any store failure: open or closed, never hang
            if self.fallback is None:
                self._store_failed(ex, exc, now)
                return None
            if not isinstance(exc, StoreUnavailable):
                self._down_until = now + STORE_RETRY_MS
            decision = await self.fallback.admit(principal, ex.task.id, limits, now, self._shadow)
            ex.degraded = f"principal store: {type(exc).__name__}; decided on the local ledger"
            record_degraded(ex.span, ex.degraded, on_store_error="open", bound="local")
            if decision.admitted:
                ex.degraded_bound = "local"
        self._annotate(ex, principal, limits, decision)
        if not decision.admitted:  # the task's budget is not consulted: the header names what is spent
            ex.response_headers.append((REMAINING_HEADER, sf_dictionary({decision.dimension or "unknown": 0})))
            raise self._exceeded(ex, principal, limits, decision)
        ex.charged_principal = principal
        return None

    async def on_end(self, ex: Exchange) -> None:
        """Charge the principal what the task's ledger was charged for the call (`ex.settlement`)."""
        principal, settled = ex.charged_principal, ex.settlement
        if principal is None or settled is None or settled.cost_nusd <= 0:
            return
        cost = settled.cost_nusd
        if self.fallback is not None:  # the local ledger's cost windows: what this replica saw settle
            await self.fallback.charge(principal, cost, self._wall_ms())
        try:
            async with asyncio.timeout(self._timeout_s):
                await self.store.charge(principal, cost, self._wall_ms())
        except Exception as exc:  # noqa: BLE001 - the response is sent; record, never fail
            if ex.span is not None:
                ex.span.set_attribute(sc.DEGRADED, True)
                ex.span.add_event(sc.EVENT_DEGRADED, {"reason": f"principal charge failed: {type(exc).__name__}"})

    def on_task_end(self, task_id: str) -> None:
        release = asyncio.get_running_loop().create_task(self._release(task_id))
        self._releases.add(release)
        release.add_done_callback(self._releases.discard)

    async def drain(self) -> None:
        """Wait for the releases of ended tasks still under way (shutdown, before the store closes)."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    async def _release(self, task_id: str) -> None:
        if self.fallback is not None:
            await self.fallback.release(task_id)
        try:
            async with asyncio.timeout(self._timeout_s * 4):
                await self.store.release(task_id)
        except Exception:  # noqa: BLE001, S110 - the task is dropped once stale (stores/principals.py)
            pass

    def _store_failed(self, ex: Exchange, exc: BaseException, now: int) -> None:
        if not isinstance(exc, StoreUnavailable):
            self._down_until = now + STORE_RETRY_MS
        store_failed(self.settings, ex, exc, "principal store")

    def _annotate(self, ex: Exchange, principal: str, limits: dict[str, int], d: PrincipalDecision) -> None:
        span = ex.span
        if span is None or not span.is_recording():
            return
        attrs: dict[str, Any] = {sc.PRINCIPAL_ID: principal, sc.PRINCIPAL_NEW_TASK: d.new_task}
        if d.dimension:
            attrs[sc.BUDGET_SCOPE] = pc.SCOPE
            if d.admitted:  # shadow
                attrs[sc.BUDGET_WOULD_REJECT] = d.dimension
            else:
                attrs[sc.BUDGET_EXCEEDED] = True
                attrs[sc.BUDGET_EXCEEDED_DIMENSION] = d.dimension
            span.add_event(sc.EVENT_EXCEEDED, {
                "dimension": d.dimension, "scope": pc.SCOPE, "limit": pc.limit_value(d.dimension, limits[d.dimension]),
                "used": pc.used_value(d.dimension, d.standing), "mode": "shadow" if d.admitted else "enforce",
                "would_reject": d.admitted})
        span.set_attributes(attrs)

    def _exceeded(self, ex: Exchange, principal: str, limits: dict[str, int], d: PrincipalDecision) -> BudgetExceeded:
        dim = d.dimension or "unknown"
        limit = pc.limit_value(dim, limits.get(dim, 0))
        used = pc.used_value(dim, d.standing)
        return BudgetExceeded(
            f"budget exhausted: {dim} limit {limit:g}, used {used:g} (principal {principal!r}); "
            "this client may not start more tasks or spend more until its window frees up",
            status=self.settings.budgets.reject_status or ex.route.adapter.reject_status, dimension=dim, limit=limit,
            used=used, scope=pc.SCOPE,
            principal=principal, task_id=ex.task.id if ex.task else "",
        )
