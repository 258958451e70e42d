"""The process-wide bound on bytes held for inspection (`server.max_inspect_total_bytes`).

Each call's own bounds (`max_body_bytes`, `max_inspect_bytes`, `max_event_bytes`) say what one call
may hold; without a bound across calls, 100 concurrent 7 MB retrieval answers read whole held
1.37 GB and starved /healthz (issue 30). Every byte ragtoll keeps to read is taken from one
`InspectBytes` first and given back when the call is done with it:

  * a request body read whole (its adapter reads it): past the bound the call gets 503
    `overloaded` (the client may retry; nothing reached the upstream);
  * an answer read whole before its head goes out, and the decoded copy the observers read (of a
    stream, the event not yet ended): past the bound the answer passes through unread, as past
    `max_inspect_bytes`, and the span says why (budgets charge the call its whole reservation).

An answer is never refused for it: the upstream has done the work already. Taking is never
waiting, so nothing queues behind the bound. The counter is touched from worker threads too (an
answer decoded off the loop), hence the lock.
"""

from __future__ import annotations

import threading

from .offload import TRIM_EVERY, trim_soon


class InspectBytes:
    """A counter of bytes held for inspection, never above `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0  # the most held at once (for tests and the benchmark)
        self.refused = 0  # takes refused so far
        self._lock = threading.Lock()
        self._given = 0  # bytes given back since the process last trimmed its heap

    def take(self, n: int) -> bool:
        """Hold `n` more bytes if that stays within the limit; False (nothing held) otherwise."""
        with self._lock:
            if self.held + n > self.limit:
                self.refused += 1
                return False
            self.held += n
            self.peak = max(self.peak, self.held)
            return True

    def give(self, n: int) -> None:
        """Give back `n` bytes taken earlier."""
        with self._lock:
            self.held -= n
            self._given += n
            trim = self.held == 0 and self._given >= TRIM_EVERY
            if trim:
                self._given = 0
        if trim:  # everything read is let go of: the memory it took goes back to the system
            trim_soon()


class Held:
    """What one reader holds of an `InspectBytes` (always given back whole by `release`)."""

    __slots__ = ("credit", "held", "pool")

    def __init__(self, pool: InspectBytes | None) -> None:
        self.pool = pool
        self.held = 0
        self.credit = 0  # bytes reserved ahead (`reserve`), spent by `take` before the pool is asked

    def take(self, n: int) -> bool:
        if self.pool is None or n <= 0:
            return True
        spent = min(self.credit, n)
        self.credit -= spent
        if n > spent and not self.pool.take(n - spent):
            self.credit += spent
            return False
        self.held += n - spent
        return True

    def reserve(self, n: int) -> bool:
        """Hold `n` bytes now for takes to come: an answer read whole holds its decoded copy's room
        when its raw bytes are taken, so two answers can never each hold their raw bytes and both
        be refused the copy they were held for."""
        if self.pool is None or n <= 0:
            return True
        if not self.pool.take(n):
            return False
        self.held += n
        self.credit += n
        return True

    def set(self, n: int) -> bool:
        """Hold exactly `n` bytes (more or fewer than now); False if more would pass the bound."""
        if n > self.held:
            return self.take(n - self.held)
        self.give(self.held - n)
        return True

    def give(self, n: int) -> None:
        if self.pool is not None and n > 0:
            self.pool.give(n)
            self.held -= n

    def release(self) -> None:
        self.credit = 0
        self.give(self.held)
