"""The in-process budget store (embedded default): one dict of task ledgers in this event loop.

Atomic because no method awaits between reading and writing a ledger; the admit rule is
`budget.first_exceeded`, the same one the Redis script mirrors. Idle tasks are ended by the
app's sweeper; `max_tasks` bounds memory by ending the least recently used task first.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..core.budget import (
    HELD,
    Actual,
    Charge,
    Ledger,
    Reservation,
    apply_charge,
    first_exceeded,
    granted_output,
)
from ..core.hold import Grant, grant_extension
from .base import SEEN_CHUNKS_CAP, Decision, TaskMeta, new_reservation_id, reservation_expiry, wants_seen

DEFAULT_MAX_TASKS = 200_000
MAX_TOMBSTONES = 100_000  # reservations cancelled before their reserve came (the oldest are forgotten)


@dataclass(slots=True)
class _Hold:
    """A reservation in flight: what its call charged (for a cancel) and what it holds now."""

    charge: Charge
    reservation: Reservation


@dataclass(slots=True)
class _Task:
    ledger: Ledger
    # made on first use: most tasks are LLM-only, and an empty set is ~200 bytes per live task
    queries: set[str] | None = None
    chunks: set[str] | None = None
    holds: dict[str, _Hold] = field(default_factory=dict)  # reservation id -> in flight


class MemoryStore:
    def __init__(self, max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        self._tasks: OrderedDict[str, _Task] = OrderedDict()
        self._max_tasks = max_tasks
        self._cancelled: OrderedDict[tuple[str, str], None] = OrderedDict()  # (task, reservation id)
        self.evicted = 0

    async def reserve(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge,
                      now_ms: int, shadow: bool = False, *, reservation_id: str = "",
                      expires_ms: int = 0) -> Decision:
        if self._cancelled and self._cancelled.pop((task_id, reservation_id), False) is None:
            return Decision(False, None, Ledger(task_id), Reservation())  # its caller gave up on it
        task = self._tasks.get(task_id)
        if task is None:
            task = _Task(Ledger(task_id, meta.profile, meta.cls, meta.route, started_ms=now_ms, last_ms=now_ms,
                                source=meta.source, trace_id=meta.trace_id))
            self._tasks[task_id] = task
            while len(self._tasks) > self._max_tasks:
                self._tasks.popitem(last=False)
                self.evicted += 1
        else:
            self._tasks.move_to_end(task_id)
        ledger = task.ledger
        if ledger.profile != meta.profile:
            return Decision(False, None, _copy(ledger), Reservation(), profile_conflict=ledger.profile)
        ledger.last_ms = now_ms
        new_query = charge.query_key is not None and (task.queries is None or charge.query_key not in task.queries)
        dim = first_exceeded(limits, ledger, charge, new_query, now_ms)
        if dim is not None:
            book = ledger.shadow_rejections if shadow else ledger.rejections
            book[dim] = book.get(dim, 0) + 1
            if not shadow:
                if ledger.exhausted is None:
                    ledger.exhausted = dim
                return Decision(False, dim, _copy(ledger), Reservation())
        if new_query:
            if task.queries is None:
                task.queries = set()
            task.queries.add(charge.query_key)  # type: ignore[arg-type]
        output = None if shadow else granted_output(limits, ledger, charge)  # worst-case admission
        reservation = dataclasses.replace(apply_charge(ledger, charge, new_query, now_ms, output=output),
                                          id=reservation_id or new_reservation_id(),
                                          expires_ms=expires_ms or reservation_expiry(now_ms))
        task.holds[reservation.id] = _Hold(charge, reservation)
        ledger.counters["inflight"] = ledger.counters.get("inflight", 0) + 1
        _held(ledger.counters, reservation.context_tokens, reservation.completion_tokens, reservation.cost_nusd)
        seen = None
        if wants_seen(charge) and (task.chunks is None or len(task.chunks) <= SEEN_CHUNKS_CAP):
            seen = frozenset(task.chunks or ())
        return Decision(True, dim, _copy(ledger), reservation, seen_chunks=seen)

    async def extend(self, task_id: str, reservation_id: str, tokens: int, cost_nusd: int,
                     limits: Mapping[str, int], now_ms: int, expires_ms: int = 0) -> Grant:
        task = self._tasks.get(task_id)
        hold = task.holds.get(reservation_id) if task is not None else None
        if task is None or hold is None:
            return Grant()  # settled, cancelled or ended: nothing to extend
        grant = grant_extension(task.ledger, limits, tokens, cost_nusd)
        res = hold.reservation
        hold.reservation = dataclasses.replace(res, completion_tokens=res.completion_tokens + grant.tokens,
                                               cost_nusd=res.cost_nusd + grant.cost_nusd,
                                               expires_ms=expires_ms or reservation_expiry(now_ms))
        c = task.ledger.counters
        for name, add in (("completion_tokens", grant.tokens), ("cost_nusd", grant.cost_nusd)):
            if add:
                c[name] = c.get(name, 0) + add
        _held(c, 0, grant.tokens, grant.cost_nusd)
        task.ledger.last_ms = max(task.ledger.last_ms, now_ms)
        return grant

    async def cancel(self, task_id: str, reservation_id: str, now_ms: int) -> bool:
        task = self._tasks.get(task_id)
        hold = task.holds.pop(reservation_id, None) if task is not None else None
        if task is None or hold is None:  # not come yet (or settled: a harmless tombstone)
            self._cancelled[(task_id, reservation_id)] = None
            while len(self._cancelled) > MAX_TOMBSTONES:
                self._cancelled.popitem(last=False)
            return False
        res, ledger = hold.reservation, task.ledger
        # the charge's counts, and the output the reservation holds now (as granted, extensions included)
        apply_charge(ledger, hold.charge, res.new_query, now_ms, sign=-1,
                     output=(res.completion_tokens, res.cost_nusd - hold.charge.cost_certain))
        c = ledger.counters
        c["inflight"] = max(0, c.get("inflight", 0) - 1)
        _held(c, -res.context_tokens, -res.completion_tokens, -res.cost_nusd)
        if res.new_query and task.queries is not None:
            task.queries.discard(hold.charge.query_key)
        return True

    async def settle(self, task_id: str, reservation: Reservation, actual: Actual, now_ms: int) -> Ledger | None:
        task = self._tasks.get(task_id)
        if task is None:
            return None
        self._tasks.move_to_end(task_id)
        if reservation.id:
            hold: _Hold | None = task.holds.pop(reservation.id, None)
            if hold is None:  # settled (or cancelled) already: settling twice changes nothing
                return _copy(task.ledger)
            reservation = hold.reservation  # with its extensions, whatever the caller saw of them
        else:
            hold = None  # a reservation without an id (a store written before ids) held nothing apart
        c = task.ledger.counters
        c["inflight"] = max(0, c.get("inflight", 0) - 1)
        if hold is not None:
            _held(c, -reservation.context_tokens, -reservation.completion_tokens, -reservation.cost_nusd)
        for name, delta in (("context_tokens", actual.context_tokens - reservation.context_tokens),
                            ("completion_tokens", actual.completion_tokens - reservation.completion_tokens),
                            ("cost_nusd", actual.cost_nusd - reservation.cost_nusd),
                            ("finished", 1 if actual.finished else 0),
                            ("cached_input_tokens", actual.cached_input_tokens),
                            ("cache_write_tokens", actual.cache_write_tokens), *actual.tallies):
            if delta:
                c[name] = c.get(name, 0) + delta
        if actual.chunk_ids is not None:
            if task.chunks is None:
                task.chunks = set()
            before = len(task.chunks)
            task.chunks.update(actual.chunk_ids)
            c["last_new"] = len(task.chunks) - before  # this call's novelty, for x-ragtoll-evidence
            fruitful = len(task.chunks) > before if actual.fruitful is None else actual.fruitful
            c["stalled"] = 0 if fruitful else c.get("stalled", 0) + 1
            if not fruitful:
                c["fruitless"] = c.get("fruitless", 0) + 1
            if fruitful and actual.evidence:  # fruitful evidence for the task's question (escalate)
                c["evidence"] = c.get("evidence", 0) + 1
                c["last_evidence"] = 1
            else:
                c.pop("last_evidence", None)
            task.ledger.chunks_seen = len(task.chunks)
        task.ledger.last_ms = max(task.ledger.last_ms, now_ms)
        return _copy(task.ledger)

    async def escalate(self, task_id: str, from_profile: str, to_profile: str, dimension: str) -> bool:
        task = self._tasks.get(task_id)
        if task is None or task.ledger.profile != from_profile or task.ledger.counters.get("escalated", 0):
            return False
        if task.ledger.counters.get("last_evidence", 0) != 1:  # its last retrieval was not evidence
            return False
        ledger = task.ledger
        ledger.profile = to_profile
        ledger.counters["escalated"] = 1
        left = ledger.rejections.get(dimension, 0) - 1
        if left > 0:
            ledger.rejections[dimension] = left
        else:
            ledger.rejections.pop(dimension, None)
            if ledger.exhausted == dimension:
                ledger.exhausted = None
        return True

    async def get_task(self, task_id: str) -> Ledger | None:
        task = self._tasks.get(task_id)
        return None if task is None else _copy(task.ledger)

    async def end_task(self, task_id: str, idle_before_ms: int | None = None) -> Ledger | None:
        task = self._tasks.get(task_id)
        if task is None or (idle_before_ms is not None and not _idle(task, idle_before_ms)):
            return None
        del self._tasks[task_id]
        return task.ledger

    async def idle_tasks(self, idle_before_ms: int) -> list[str]:
        # OrderedDict is in least-recently-used order, so the scan stops at the first active task
        out = []
        for task_id, task in self._tasks.items():
            if task.ledger.last_ms >= idle_before_ms:
                break
            if _idle(task, idle_before_ms):
                out.append(task_id)
        return out

    async def hand_over(self) -> int:
        return 0  # nobody else reads this process's memory

    def local_tasks(self) -> list[str]:
        return list(self._tasks)

    def failure_domain(self, task_id: str) -> str:
        return "memory"

    async def ping(self) -> None:
        return None

    async def warm(self) -> None:
        return None  # nothing to connect or load

    async def aclose(self) -> None:
        return None


def _held(counters: dict[str, int], context: int, completion: int, cost: int) -> None:
    """What reservations in flight hold of the token and cost totals (budget.HELD; reserve.lua,
    extend.lua, settle.lua and cancel.lua keep the same counters)."""
    for name, add in ((HELD["context_tokens"], context), (HELD["completion_tokens"], completion),
                      (HELD["cost_nusd"], cost)):
        if add:
            counters[name] = max(0, counters.get(name, 0) + add)


def _idle(task: _Task, idle_before_ms: int) -> bool:
    """No call since `idle_before_ms` and no reservation in flight that had not expired by then
    (one past its expiry is presumed lost with its replica)."""
    if task.ledger.last_ms >= idle_before_ms:
        return False
    return all(h.reservation.expires_ms < idle_before_ms for h in task.holds.values())


def _copy(ledger: Ledger) -> Ledger:
    return Ledger(ledger.task_id, ledger.profile, ledger.cls, ledger.route, ledger.started_ms, ledger.last_ms,
                  dict(ledger.counters), dict(ledger.rejections), dict(ledger.shadow_rejections),
                  ledger.exhausted, ledger.chunks_seen, ledger.source, ledger.trace_id)
