"""Self-audit of semantic hits: a sample is re-run upstream off the request path and compared.

The stage does the re-run; this module keeps the score. Agreement means the same top result and
at least `overlap_floor` of the same top-k ids. A partition whose agreement over this replica's
recent audits falls below `target` has its similarity threshold raised by `step` (never above
`ceiling`). A raised threshold lives in the evidence store (`raise_threshold`), so every replica on
a shared store applies it: each replica reads a scope's threshold at most every `REFRESH_S`, and
keeps the last value it read in between (no store round trip on most lookups).
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

WINDOW = 20
MIN_SAMPLES = 5
REFRESH_S = 2.0  # how stale a replica's view of a shared raised threshold may be
MAX_SCOPES = 10_000  # scopes whose threshold a replica remembers (least recently used dropped)


class ThresholdStore(Protocol):
    async def get_threshold(self, scope: str) -> float | None: ...

    async def raise_threshold(self, scope: str, threshold: float) -> float: ...


@dataclass(frozen=True, slots=True)
class Agreement:
    same_top: bool
    overlap: float
    agrees: bool


def compare(cached: Sequence[str], live: Sequence[str], k: int | None, overlap_floor: float = 0.8) -> Agreement:
    n = k or max(len(cached), len(live))
    a, b = list(cached[:n]), list(live[:n])
    if not a and not b:
        return Agreement(True, 1.0, True)
    same_top = bool(a and b and a[0] == b[0])
    overlap = len(set(a) & set(b)) / max(len(a), len(b), 1)
    return Agreement(same_top, overlap, same_top and overlap >= overlap_floor)


class Auditor:
    def __init__(self, fraction: float, base_threshold: float, target: float = 0.95, step: float = 0.02,
                 ceiling: float = 0.99, rng: random.Random | None = None, store: ThresholdStore | None = None,
                 refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.fraction = fraction
        self.base = base_threshold
        self.target = target
        self.step = step
        self.ceiling = ceiling
        self.store = store
        self.refresh_s = refresh_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._known: OrderedDict[str, tuple[float, float]] = OrderedDict()  # scope -> (threshold, read at)
        self._recent: dict[str, deque[bool]] = {}

    def bind(self, store: ThresholdStore) -> None:
        """Share raised thresholds through `store` (the evidence cache binds its own, unless one was given)."""
        if self.store is None:
            self.store = store

    def threshold(self, scope: str) -> float:
        """This replica's current view (no I/O): what the last read or raise saw, else the base."""
        known = self._known.get(scope)
        return known[0] if known is not None else self.base

    async def current(self, scope: str) -> float:
        """The threshold for a lookup: re-read from the store when this replica's view is older than `refresh_s`."""
        known = self._known.get(scope)
        now = self._clock()
        if self.store is None or (known is not None and now - known[1] < self.refresh_s):
            return known[0] if known is not None else self.base
        shared = await self.store.get_threshold(scope)
        value = max(self.base, shared) if shared is not None else self.base
        self._remember(scope, value, now)
        return value

    def sample(self) -> bool:
        return self.fraction > 0 and self._rng.random() < self.fraction

    async def record(self, scope: str, result: Agreement) -> float | None:
        """Count one audit; returns the new threshold when this audit raised it (for every replica)."""
        window = self._recent.setdefault(scope, deque(maxlen=WINDOW))
        window.append(result.agrees)
        if len(window) < MIN_SAMPLES or sum(window) / len(window) >= self.target:
            return None
        new = min(self.ceiling, await self.current(scope) + self.step)
        if self.store is not None:
            new = await self.store.raise_threshold(scope, new)
        self._remember(scope, new, self._clock())
        window.clear()  # judge the new threshold on fresh audits
        return new

    def _remember(self, scope: str, value: float, at: float) -> None:
        self._known[scope] = (value, at)
        self._known.move_to_end(scope)
        while len(self._known) > MAX_SCOPES:
            self._known.popitem(last=False)
