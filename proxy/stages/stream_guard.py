"""The budget stage's part while a stream runs: it never lets output past what the stream holds.

It asks the store ahead for the next chunk of hold (`Breaker.extend`, in the background), holds
a chunk back (`ex.gate`) while an extension it needs is on its way, and cuts the stream cleanly
when the task has nothing left to extend with or its deadline passed. Shadow mode never holds
back nor cuts: it records once what enforcement would have done.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from ragtoll.instrumentation import semconv as sc

from ..core.budget import Admission
from ..core.hold import Grant, StreamState
from ..request.exchange import Exchange
from ..stores.breaker import Breaker
from .budget_span import flush_record, record_degraded


class StreamGuard:
    """`on_store_error`: what a failed extension does (open: the stream goes on unbudgeted;
    closed: it is cut)."""

    def __init__(self, store: Breaker, on_store_error: str, wall_ms: Callable[[], int]) -> None:
        self.store = store
        self.on_store_error = on_store_error
        self._wall_ms = wall_ms
        self._extensions: set[asyncio.Task[None]] = set()  # on their way (the loop keeps only weak references)

    def on_chunk(self, ex: Exchange, chunk: bytes) -> bytes | None:
        """The stage's `on_chunk` for an admitted stream (see the module docstring)."""
        adm, state = ex.admission, ex.stream_state
        if adm is None or state is None or state.cut:
            return None
        seen = ex.observation.output_tokens_seen
        hold = state.hold
        dim = None
        if hold is not None:
            if hold.wants_more(seen) and state.extending is None:
                self._extend(ex, adm, state, seen)
            dim = hold.over(seen)
            if dim is not None and state.extending is not None and not adm.shadow:
                ex.gate = functools.partial(self._wait, ex, adm, state, chunk)
                return None
        if dim is None and adm.deadline_ms is not None and self._wall_ms() >= adm.deadline_ms:
            dim = "max_latency_ms"
        if dim is None or (adm.shadow and hold is not None and state.extending is not None):
            state.tail_clean = chunk.endswith((b"\n\n", b"\r\n\r\n")) or (not chunk and state.tail_clean)
            return None
        return self._cut(ex, adm, state, dim, chunk, seen)

    async def _wait(self, ex: Exchange, adm: Admission, state: StreamState, chunk: bytes) -> bytes | None:
        """The gate of a held-back chunk: wait for the extensions it needs; None sends it, bytes end
        the stream instead (the task had nothing left)."""
        seen = ex.observation.output_tokens_seen
        while True:
            if state.extending is not None:
                await asyncio.wait({state.extending})
            hold = state.hold
            dim = hold.over(seen) if hold is not None else None
            if dim is None:
                state.tail_clean = chunk.endswith((b"\n\n", b"\r\n\r\n")) or (not chunk and state.tail_clean)
                return None
            if hold is not None and hold.refused:
                return self._cut(ex, adm, state, dim, chunk, seen)
            self._extend(ex, adm, state, seen)

    def _extend(self, ex: Exchange, adm: Admission, state: StreamState, seen: int) -> None:
        """Ask the store for the stream's next chunk of hold, in the background."""
        assert state.hold is not None and ex.task is not None
        ask = state.hold.ask(seen)
        task = asyncio.get_running_loop().create_task(self._extension(ex, adm, state, ask))
        state.extending = task
        self._extensions.add(task)
        task.add_done_callback(self._extensions.discard)

    async def _extension(self, ex: Exchange, adm: Admission, state: StreamState, ask: Grant) -> None:
        assert ex.task is not None and state.hold is not None
        try:
            grant = await self.store.extend(ex.task.id, adm.reservation, ask.tokens, ask.cost_nusd, adm.limits)
        except Exception as exc:  # noqa: BLE001 - as for a reserve: the local ledger (open), or stop (closed)
            why = f"extend failed: {type(exc).__name__}"
            if self.on_store_error == "closed":
                record_degraded(ex.span, why, on_store_error=self.on_store_error)
                state.hold.refused = True
                return
            if self.store.fallback is None:  # no local ledger (a store that cannot fail): unbudgeted
                record_degraded(ex.span, why, on_store_error=self.on_store_error)
                state.hold = None
                return
            record_degraded(ex.span, why + "; extended on the local ledger", on_store_error="open", bound="local")
            grant = await self.store.extend_locally(ex.task.id, adm.profile, ask.tokens, ask.cost_nusd, adm.limits)
        finally:
            state.extending = None
        state.hold.add(grant)
        state.extensions += grant.tokens > 0

    def _cut(self, ex: Exchange, adm: Admission, state: StreamState, dim: str, chunk: bytes,
             seen: int) -> bytes | None:
        """End the stream at `chunk` (enforce), or record once that enforcement would have (shadow)."""
        flush_record(ex)  # the reservation's events come before the cut's
        if adm.shadow:  # record once what enforcement would have done; never cut
            state.cut = dim
            if ex.span is not None:
                ex.span.set_attribute(sc.BUDGET_WOULD_REJECT, dim)
                ex.span.add_event(sc.EVENT_EXCEEDED, {"dimension": dim, "stream_cut": False, "would_reject": True,
                                                      "mode": "shadow", "output_tokens_seen": seen})
            return None
        state.cut = dim
        if ex.span is not None:
            ex.span.set_attribute(sc.BUDGET_STREAM_CUT, dim)
            ex.span.add_event(sc.EVENT_EXCEEDED, {"dimension": dim, "stream_cut": True, "mode": "enforce",
                                                  "output_tokens_seen": seen})
        prefix = b""
        if not state.tail_clean:  # finish the event the client is in the middle of
            end, width = chunk.find(b"\n\n"), 2
            crlf = chunk.find(b"\r\n\r\n")
            if crlf >= 0 and (end < 0 or crlf < end):
                end, width = crlf, 4
            prefix = chunk[: end + width] if end >= 0 else b"\n\n"
        return prefix + ex.route.adapter.stream_end(ex.call, ex.observation, ex.target.split("?", 1)[0],
                                                    self._wall_ms() // 1000)
