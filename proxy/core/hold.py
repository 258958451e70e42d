"""What a stream may spend (pure): reserve -> extend -> settle.

A stream starts holding its reservation and, as it runs, asks the store to extend its own
reservation from what the task has left, one chunk at a time; it never delivers output beyond
what it holds. `grant_extension` is the store's rule (the memory store calls it, the Redis
script mirrors it); `StreamHold` is the stream's side. Internal units: tokens and nano-USD.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .budget import Ledger

if TYPE_CHECKING:
    import asyncio

DEFAULT_EXTENSION_TOKENS = 256


@dataclass(frozen=True, slots=True)
class Grant:
    """What an extension added to a reservation: output tokens and their cost (nano-USD)."""

    tokens: int = 0
    cost_nusd: int = 0


def grant_extension(ledger: Ledger, limits: Mapping[str, int], tokens: int, cost_nusd: int) -> Grant:
    """How much of an asked extension (`tokens` output tokens costing `cost_nusd`) the task has
    left: all of it, or as much as fits under `max_completion_tokens` and `max_cost_usd`, never
    more, so extensions never take a task past those limits."""
    if tokens <= 0:
        return Grant()
    granted = tokens
    comp = limits.get("max_completion_tokens")
    if comp is not None:
        granted = min(granted, comp - ledger.used("completion_tokens"))
    cost = limits.get("max_cost_usd")
    if cost is not None and cost_nusd > 0:
        granted = min(granted, (cost - ledger.used("cost_nusd")) * tokens // cost_nusd)
    if granted <= 0:
        return Grant()
    return Grant(granted, cost_nusd if granted == tokens else cost_nusd * granted // tokens)


@dataclass(slots=True)
class StreamHold:
    """The output one stream holds. `tokens`: held against `max_completion_tokens` (None: no such
    limit); `cost_nusd`: held against `max_cost_usd` at `price_nusd` per output token (None: no
    cost limit or no price). `chunk`: tokens asked per extension."""

    tokens: int | None
    cost_nusd: int | None
    price_nusd: float
    chunk: int = DEFAULT_EXTENSION_TOKENS
    refused: bool = False  # the task had nothing left to extend with: the next pass is a cut

    def headroom(self, seen: int) -> float:
        """Output tokens the stream may still deliver before it passes its hold (may be < 0)."""
        room = math.inf
        if self.tokens is not None:
            room = self.tokens - seen
        if self.cost_nusd is not None and self.price_nusd > 0:
            room = min(room, self.cost_nusd / self.price_nusd - seen)
        return room

    def over(self, seen: int) -> str | None:
        """The dimension whose hold `seen` output tokens pass, or None."""
        if self.tokens is not None and seen > self.tokens:
            return "max_completion_tokens"
        if self.cost_nusd is not None and seen * self.price_nusd > self.cost_nusd:
            return "max_cost_usd"
        return None

    def wants_more(self, seen: int) -> bool:
        """Ask ahead: less than half a chunk of headroom is left (and the task may still grant)."""
        return not self.refused and self.headroom(seen) < self.chunk / 2

    def ask(self, seen: int) -> Grant:
        """The next extension to ask for: one chunk beyond what `seen` already needs."""
        tokens = self.chunk + max(0, math.ceil(-self.headroom(seen)))
        return Grant(tokens, math.ceil(tokens * self.price_nusd) if self.cost_nusd is not None else 0)

    def add(self, grant: Grant) -> None:
        if grant.tokens <= 0:
            self.refused = True
            return
        if self.tokens is not None:
            self.tokens += grant.tokens
        if self.cost_nusd is not None:
            self.cost_nusd += grant.cost_nusd


@dataclass(slots=True)
class StreamState:
    """One admitted stream as the stream guard runs it: its hold (None: no token or cost cut), the
    extension on its way to the store, and the cut once made."""

    hold: StreamHold | None
    extending: asyncio.Task[None] | None = None  # the extension on its way to the store
    extensions: int = 0  # extensions the store granted (some tokens at least)
    tail_clean: bool = True  # the bytes sent so far end on an SSE event boundary
    cut: str | None = None  # the dimension the stream was cut at (or, in shadow, would have been)
