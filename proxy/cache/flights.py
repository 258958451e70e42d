"""Retrievals in flight in this process: a duplicate waits for the one already on its way (single flight).

Pure asyncio, no I/O. A miss that will be filed leads a `Flight`, registered under its partition
and entry key. A later lookup that would be served from it (the same key, or a query it would
verify against) waits for it instead of going upstream. The leader lands its entry as soon as it
has the whole answer - before its own client has read the body - or lands nothing (a failure, an
answer not filed); `end` always lands, saying how the leader ended (`outcome`). Bounded. Per
process: replicas do not wait for each other.

A leader that fails hands its key on, never its herd: one waiter leads a new flight (`Flights.relay`)
and the others wait for that one. A failure the upstream caused (5xx, 408, 429, a timeout or a
broken connection: FAILED) counts; after MAX_FAILURES of them in a row the waiters still waiting
get the failure instead of another call. A failure of the leader's own (its credentials refused,
any other 4xx, its client gone, its call refused by a budget: GONE) does not count: the next
waiter asks with its own request. So a key has at most one upstream call at a time, and a burst of
duplicates onto a failing upstream costs at most MAX_FAILURES calls.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..stores.evidence import Entry

if TYPE_CHECKING:
    import numpy as np

MAX_FLIGHTS = 10_000
MAX_SCAN = 32  # flights of a partition compared with a query (semantic duplicates)
MAX_FAILURES = 2  # upstream failures in a row on one key before its waiters get the failure

# How a leader ended without landing an entry (`Flight.outcome`)
UNFILED = "unfiled"  # the upstream answered, but the answer is not filed (too big, no ids...): waiters ask
FAILED = "failed"  # the upstream failed (5xx, 408, 429, timeout, broken): counts towards MAX_FAILURES
GONE = "gone"  # the leader's own failure (refused credentials, another 4xx, client gone): does not count


@dataclass(eq=False, slots=True)
class Flight:
    pkey: str
    key: str  # the entry key it will file under
    norm: str  # its normalised query
    top_k: int | None
    vector: np.ndarray | None = None  # its query's embedding, once someone needed it
    text: bool = True  # a text query (semantic duplicates may wait); False: keyed by a vector
    seq: int = 0  # start order: a leader waits only for flights older than its own (no cycles)
    failures: int = 0  # upstream failures in a row on this key before this flight (relays)
    outcome: str = GONE  # how it ended, if it landed nothing (UNFILED, FAILED, GONE)
    status: int | None = None  # the leader's answer status, when it failed
    landed: asyncio.Future[Entry | None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    def land(self, entry: Entry | None) -> None:
        if not self.landed.done():
            self.landed.set_result(entry)


class Flights:
    def __init__(self, limit: int = MAX_FLIGHTS) -> None:
        self._limit = limit
        self._parts: dict[str, dict[str, Flight]] = {}
        self._count = 0
        self._seq = itertools.count(1)

    def __len__(self) -> int:
        return self._count

    def find(self, pkey: str, key: str) -> Flight | None:
        part = self._parts.get(pkey)
        return part.get(key) if part else None

    def others(self, pkey: str, key: str, before: Flight | None = None) -> list[Flight]:
        """Text flights of the partition under other keys (at most MAX_SCAN, the newest); only those
        started before `before` when given: a leader that waited for a younger flight could wait
        for one that waits for it."""
        part = self._parts.get(pkey)
        if not part:
            return []
        limit = before.seq if before is not None else None
        return [f for k, f in list(part.items())[-MAX_SCAN:]
                if k != key and f.text and (limit is None or f.seq < limit)]

    def start(self, pkey: str, key: str, norm: str, top_k: int | None, *, text: bool = True,
              vector: np.ndarray | None = None, failures: int = 0) -> Flight | None:
        """A flight this call leads; None when one is already on its way under the key, or too many are."""
        part = self._parts.setdefault(pkey, {})
        if key in part or self._count >= self._limit:
            if not part:
                del self._parts[pkey]
            return None
        flight = part[key] = Flight(pkey, key, norm, top_k, vector, text, next(self._seq), failures)
        self._count += 1
        return flight

    def relay(self, failed: Flight, top_k: int | None) -> tuple[Flight | None, Flight | None]:
        """After `failed` ended without an entry: (the flight this waiter now leads, None) for the
        first waiter to ask; (None, the flight to wait for) for the others; (None, None) when no
        flight can be started (too many)."""
        again = failed.failures + (1 if failed.outcome == FAILED else 0)
        led = self.start(failed.pkey, failed.key, failed.norm, top_k, text=failed.text, vector=failed.vector,
                         failures=again)
        if led is not None:
            return led, None
        return None, self.find(failed.pkey, failed.key)

    def end(self, flight: Flight, outcome: str = GONE, status: int | None = None) -> None:
        """The leader is done: land nothing if it landed nothing (saying how it ended), and let no
        one else wait for it."""
        if not flight.landed.done():
            flight.outcome, flight.status = outcome, status
        flight.land(None)
        part = self._parts.get(flight.pkey)
        if part is not None and part.get(flight.key) is flight:
            del part[flight.key]
            self._count -= 1
            if not part:
                del self._parts[flight.pkey]
