"""The budget store protocol: one atomic reserve and one settle per call (and, for streams, one
extend per chunk of output), per-task evidence sets.

A store keeps each task's ledger (budget.Ledger), its reservations in flight (by id, with an
expiry), its set of unique-query keys and its set of chunk ids seen. Implementations: memory.py
(one process), redis.py (shared, Cluster-safe). The shared contract tests (tests/proxy/stores/)
run unchanged against every store.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..core.budget import Actual, Charge, Ledger, Reservation
from ..core.hold import Grant

# A reservation not settled or extended within this long stops counting as in flight.
DEFAULT_RESERVATION_TTL_MS = 15 * 60 * 1000


def new_reservation_id() -> str:
    return secrets.token_hex(8)


def reservation_expiry(now_ms: int, ttl_ms: int = DEFAULT_RESERVATION_TTL_MS) -> int:
    return now_ms + ttl_ms


@dataclass(frozen=True, slots=True)
class TaskMeta:
    """Who the task is, fixed by its first call. A later call naming another profile is told
    which profile the task already has (`Decision.profile_conflict`) and must re-evaluate."""

    profile: str
    cls: str = ""
    route: str = ""
    source: str = ""  # the task identity rule (model.SOURCE_*)
    trace_id: str = ""  # 32 hex digits: the trace the task's calls go to (for the task summary)


@dataclass(frozen=True, slots=True)
class Decision:
    """The result of `reserve`.

    `admitted` False: nothing was charged; `dimension` names the limit that refused the call.
    In shadow mode `admitted` is True and `dimension` names the limit that *would* have refused.
    `profile_conflict` set: nothing was done; the task already runs under that profile.
    """

    admitted: bool
    dimension: str | None
    ledger: Ledger
    reservation: Reservation
    profile_conflict: str | None = None
    # admitted retrievals: the chunk ids the task had already seen (None: more than SEEN_CHUNKS_CAP),
    # so `x-ragtoll-evidence` can count what is new without waiting for the settle round trip
    seen_chunks: frozenset[str] | None = None
    # why the shared store's answer is unknown, when this decision is the local ledger's instead
    # (stores.breaker, `on_store_error: open`); "" when the store decided
    degraded: str = ""


# A task with more chunks than this gets its retrieval novelty from the settle instead.
SEEN_CHUNKS_CAP = 512


def wants_seen(charge: Charge) -> bool:
    """A retrieval that goes upstream: its reservation returns the task's seen chunk ids."""
    return charge.retrieval_calls > 0 and not charge.cache_hit


class Store(Protocol):
    """Every method is a single atomic step per task. Timeouts are the caller's (`asyncio.timeout`)."""

    async def reserve(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge,
                      now_ms: int, shadow: bool = False, *, reservation_id: str = "",
                      expires_ms: int = 0) -> Decision:
        """Check every dimension of `limits` (internal units) and, if all admit, add `charge` and
        keep it as reservation `reservation_id` (made here when empty) until `expires_ms`
        (default: DEFAULT_RESERVATION_TTL_MS from now). An LLM call's output is reserved as
        `budget.granted_output` grants (what the task has left, at most what it asked; enforced
        profiles only): the returned reservation says how much.

        A refusal counts one rejection for the dimension and records it as the task's exhausted
        dimension (the first one to be hit). Creates the task on its first call. A reservation id
        already cancelled (`cancel` came first) charges nothing and is refused without a dimension.
        """
        ...

    async def extend(self, task_id: str, reservation_id: str, tokens: int, cost_nusd: int,
                     limits: Mapping[str, int], now_ms: int, expires_ms: int = 0) -> Grant:
        """Add to reservation `reservation_id` as much of `tokens` output tokens (costing
        `cost_nusd`) as the task has left under `max_completion_tokens` and `max_cost_usd`
        (core.hold.grant_extension), and move its expiry to `expires_ms`. Returns what was added:
        nothing when the task has nothing left, or the reservation is settled, cancelled or gone."""
        ...

    async def cancel(self, task_id: str, reservation_id: str, now_ms: int) -> bool:
        """Undo reservation `reservation_id` whose reserve's outcome its caller never learned (the
        call was not admitted): everything its reserve and extensions added goes. If its reserve
        has not arrived yet, it will charge nothing when it does. Returns whether one was undone;
        idempotent."""
        ...

    async def settle(self, task_id: str, reservation: Reservation, actual: Actual, now_ms: int) -> Ledger | None:
        """Replace the reservation (as the store holds it, extensions included; by its id) with
        actual use; add `actual.chunk_ids` to the task's seen set and update the
        consecutive-stalled-retrievals counter (reset when any chunk is new). Settling a
        reservation that is no longer in flight changes nothing (idempotent). Returns the ledger
        after, or None when the task has ended meanwhile."""
        ...

    async def escalate(self, task_id: str, from_profile: str, to_profile: str, dimension: str) -> bool:
        """Move the task from `from_profile` to `to_profile` if it still runs under `from_profile`,
        has never moved (a profile's `escalate_to`: one climb per task) and its last retrieval was
        settled as evidence for its question (`Actual.evidence`), undoing the refusal by `dimension`
        that asked for it (one rejection; the exhausted mark it set). True when it moved."""
        ...

    async def get_task(self, task_id: str) -> Ledger | None: ...

    def failure_domain(self, task_id: str) -> str:
        """Which part of the store serves `task_id` and fails as one: a pure, cheap lookup (no I/O).

        After a failure the caller skips the store for that domain only (budget stage), so tasks
        served elsewhere are unaffected. One constant for a single server; on Redis Cluster, the
        node that owns the task's hash slot.
        """
        ...

    async def end_task(self, task_id: str, idle_before_ms: int | None = None) -> Ledger | None:
        """Remove the task and return its final ledger, or None if there is none.

        With `idle_before_ms`, only a task whose last call is older than that, and whose
        reservations in flight had all expired by then, ends (an idle sweep racing a new call
        loses). Exactly one caller gets the ledger of an ended task.
        """
        ...

    async def idle_tasks(self, idle_before_ms: int) -> list[str]:
        """Task ids (known to this process, or handed over to it) whose last call is older than
        `idle_before_ms`."""
        ...

    async def hand_over(self) -> int:
        """This process is stopping: leave the tasks it served to the processes that stay, whose
        idle sweeps then end them. Returns how many; 0 for a store no other process reads (memory),
        whose tasks the caller ends itself."""
        ...

    def local_tasks(self) -> list[str]:
        """Every task id this process holds (no I/O)."""
        ...

    async def ping(self) -> None:
        """Raise if the store cannot answer."""
        ...

    async def warm(self) -> None:
        """Make ready for a burst (connections open, server-side scripts loaded); raise if the
        store cannot answer. `/readyz` says ready only once it has succeeded."""
        ...

    async def aclose(self) -> None: ...
