"""Self-audit of semantic hits: a sample is re-run upstream off the request path and compared.

Pure bookkeeping (the stage does the I/O): agreement means the same top result and at least
`overlap_floor` of the same top-k ids. A partition whose agreement over its recent audits falls
below `target` has its similarity threshold raised by `step` (never above `ceiling`).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 20
MIN_SAMPLES = 5


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
                 ceiling: float = 0.99, rng: random.Random | None = None) -> None:
        self.fraction = fraction
        self.base = base_threshold
        self.target = target
        self.step = step
        self.ceiling = ceiling
        self._rng = rng or random.Random()
        self._raised: dict[str, float] = {}
        self._recent: dict[str, deque[bool]] = {}

    def threshold(self, scope: str) -> float:
        return self._raised.get(scope, self.base)

    def sample(self) -> bool:
        return self.fraction > 0 and self._rng.random() < self.fraction

    def record(self, scope: str, result: Agreement) -> float | None:
        """Count one audit; returns the new threshold when this audit raised it."""
        window = self._recent.setdefault(scope, deque(maxlen=WINDOW))
        window.append(result.agrees)
        if len(window) < MIN_SAMPLES or sum(window) / len(window) >= self.target:
            return None
        new = min(self.ceiling, self.threshold(scope) + self.step)
        self._raised[scope] = new
        window.clear()  # judge the new threshold on fresh audits
        return new
