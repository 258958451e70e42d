"""The budget store protocol: one atomic reserve and one settle per call, per-task evidence sets.

A store keeps each task's ledger (budget.Ledger), its set of unique-query keys and its set of
chunk ids seen. Implementations: memory.py (one process), redis.py (shared, Cluster-safe).
The shared contract tests (tests/proxy/stores/) run unchanged against every store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..core.budget import Actual, Charge, Ledger, Reservation


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


# A task with more chunks than this gets its retrieval novelty from the settle instead.
SEEN_CHUNKS_CAP = 512


def wants_seen(charge: Charge) -> bool:
    """A retrieval that goes upstream: its reservation returns the task's seen chunk ids."""
    return charge.retrieval_calls > 0 and not charge.cache_hit


class Store(Protocol):
    """Every method is a single atomic step per task. Timeouts are the caller's (`asyncio.timeout`)."""

    async def reserve(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge,
                      now_ms: int, shadow: bool = False) -> Decision:
        """Check every dimension of `limits` (internal units) and, if all admit, add `charge`.

        A refusal counts one rejection for the dimension and records it as the task's exhausted
        dimension (the first one to be hit). Creates the task on its first call.
        """
        ...

    async def settle(self, task_id: str, reservation: Reservation, actual: Actual, now_ms: int) -> Ledger | None:
        """Replace the reservation with actual use; add `actual.chunk_ids` to the task's seen set
        and update the consecutive-stalled-retrievals counter (reset when any chunk is new).
        Returns the ledger after, or None when the task has ended meanwhile."""
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

        With `idle_before_ms`, only a task whose last call is older than that ends (an idle
        sweep racing a new call loses). Exactly one caller gets the ledger of an ended task.
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

    async def aclose(self) -> None: ...
