"""Self-audit of semantic hits: a sample is re-run upstream off the request path and compared.

The stage does the re-run; this module keeps the score. Agreement means the same top result and
at least `overlap_floor` of the same top-k ids. A partition whose agreement over this replica's
recent audits falls below `target` has its similarity threshold raised by `step` (never above
`ceiling`). A raised threshold lives in the evidence store (`raise_threshold`), so every replica on
a shared store applies it: each replica reads a scope's threshold at most every `REFRESH_S`, and
keeps the last value it read in between (no store round trip on most lookups).

The same audits estimate each scope's live error rate (the share of audited hits whose evidence
disagreed with live retrieval, over this replica's last `ERROR_WINDOW` audits). When the error rate's
lower 95% Wilson bound is above the scope's error bound (`cache.max_error` to begin with), the bound
is halved (never below `MIN_ERROR`): fewer, safer semantic hits until the audits agree again. A
tightened bound lives in the store like a raised threshold (as its complement, which only ever
rises), so it too holds for every replica.

Per entry, as vCache does per cached prompt: an audit that disagreed raises that entry's own
similarity floor to just above the similarity it was served at (`ENTRY_STEP`), so the same paraphrase,
or a farther one, never draws on it again while closer ones still may; the rest of the route keeps its
threshold. Kept in the store under the route's scope and the entry's id (`entry_scope`), only raised.
"""

from __future__ import annotations

import math
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
MAX_ERROR = 0.2  # config.CacheConfig.max_error's default
ERROR_WINDOW = 200  # audits per scope the live error rate is estimated over
MIN_ERROR = 0.001  # a bound is never tightened below this
BOUND = "#max_error"  # suffix of the store key that keeps a scope's tightened bound (as 1 - bound)
ENTRY = "#entry:"  # infix of the store key that keeps one entry's own similarity floor
ENTRY_STEP = 0.005  # how far above a disagreeing serve's similarity an entry's floor is raised


def entry_scope(scope: str, entry_id: str) -> str:
    return scope + ENTRY + entry_id


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a share k/n (95% by default); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, mid - half), min(1.0, mid + half)


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
                 refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic,
                 max_error: float = MAX_ERROR) -> None:
        self.fraction = fraction
        self.max_error = max_error
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
        self._errors: OrderedDict[str, deque[bool]] = OrderedDict()  # scope -> recent audits: True = wrong

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
        return await self._read(scope, self.base)

    async def _read(self, key: str, floor: float) -> float:
        known = self._known.get(key)
        now = self._clock()
        if self.store is None or (known is not None and now - known[1] < self.refresh_s):
            return known[0] if known is not None else floor
        shared = await self.store.get_threshold(key)
        value = max(floor, shared) if shared is not None else floor
        self._remember(key, value, now)
        return value

    async def bound(self, scope: str) -> float:
        """The error bound a lookup in `scope` serves under: `max_error`, or tighter when audits said so."""
        return max(MIN_ERROR, 1.0 - await self._read(scope + BOUND, 1.0 - self.max_error))

    async def entry_floor(self, scope: str, entry_id: str) -> float:
        """The similarity a candidate needs to draw on this entry: 0, or above a serve an audit found wrong."""
        return await self._read(entry_scope(scope, entry_id), 0.0)

    def bound_now(self, scope: str) -> float:
        """This replica's current view of `scope`'s bound (no I/O)."""
        known = self._known.get(scope + BOUND)
        return max(MIN_ERROR, 1.0 - known[0]) if known is not None else self.max_error

    def error_rate(self, scope: str) -> tuple[float, int]:
        """This replica's live error estimate for `scope`: (share of recent audits that disagreed, audits)."""
        window = self._errors.get(scope)
        if not window:
            return 0.0, 0
        return sum(window) / len(window), len(window)

    def sample(self) -> bool:
        return self.fraction > 0 and self._rng.random() < self.fraction

    async def record(self, scope: str, result: Agreement, entry_id: str | None = None,
                     similarity: float | None = None) -> float | None:
        """Count one audit; returns the new threshold when this audit raised it (for every replica).
        The audit also counts towards the scope's live error rate, which may tighten its bound, and a
        disagreement raises the served entry's own floor above `similarity`."""
        await self._judge_error(scope, not result.agrees)
        if not result.agrees and entry_id is not None and similarity is not None:
            key = entry_scope(scope, entry_id)
            floor = min(1.0, similarity + ENTRY_STEP)
            if self.store is not None:
                floor = await self.store.raise_threshold(key, floor)
            self._remember(key, floor, self._clock())
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

    async def _judge_error(self, scope: str, wrong: bool) -> float | None:
        """Count one audit towards the live error rate; returns the new bound when it was tightened."""
        errors = self._errors.get(scope)
        if errors is None:
            errors = self._errors[scope] = deque(maxlen=ERROR_WINDOW)
            while len(self._errors) > MAX_SCOPES:
                self._errors.popitem(last=False)
        self._errors.move_to_end(scope)
        errors.append(wrong)
        bound = await self.bound(scope)
        if len(errors) < MIN_SAMPLES or wilson(sum(errors), len(errors))[0] <= bound or bound <= MIN_ERROR:
            return None
        new = max(MIN_ERROR, bound / 2)
        strict = 1.0 - new
        if self.store is not None:
            strict = await self.store.raise_threshold(scope + BOUND, strict)
        self._remember(scope + BOUND, strict, self._clock())
        errors.clear()  # judge the tighter bound on fresh audits
        return max(MIN_ERROR, 1.0 - strict)

    def _remember(self, scope: str, value: float, at: float) -> None:
        self._known[scope] = (value, at)
        self._known.move_to_end(scope)
        while len(self._known) > MAX_SCOPES:
            self._known.popitem(last=False)
