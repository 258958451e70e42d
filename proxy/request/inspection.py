"""How much of a response ragtoll reads: the bounded, decoded copy that observers and stage hooks see.

The client always gets the upstream's raw bytes. The copy ragtoll reads is decompressed chunk by
chunk (gzip/deflate; other encodings are not read) and bounded, so a hostile or broken upstream
cannot make ragtoll hold or chew unbounded data:
  * at most `max_inspect_bytes` decoded bytes of a compressed response, or of any response that is
    not an event stream (a 1 MB gzip bomb that inflates to 1 GB stops at the bound, in memory too);
  * an event stream is read event by event; one event longer than `max_event_bytes` (an event that
    never ends) stops the reading.
  * what it keeps to read (the decoded copy; of an event stream, the event not yet ended) is taken
    from the process-wide `InspectBytes` (buffers.py) and given back when reading ends.
Past a bound the rest passes through unread and `observation.unread` says why; budgets then charge
the call as if it used its whole reservation. Pure: no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Protocol

from ..model import Observation
from .buffers import Held, InspectBytes


class _Observer(Protocol):
    observation: Observation

    def feed(self, chunk: bytes, end: bool) -> None: ...


# The blank lines that end an SSE event; the longest is 4 bytes, so 3 bytes of the previous chunk
# are enough to find one that straddles two chunks.
_EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")


class Inspector:
    """Feeds an observer the decoded copy of a response, within the bounds."""

    def __init__(self, observer: _Observer, *, content_encoding: str, content_type: str, max_bytes: int,
                 max_event_bytes: int, pool: InspectBytes | None = None) -> None:
        self.observer = observer
        self.held = Held(pool)
        self.unread: str | None = None
        self._max_bytes = max_bytes
        self._max_event = max_event_bytes
        self._decoded = 0
        encoding = content_encoding.strip().lower()
        self._decode: Callable[[bytes, int], bytes] | None = _identity
        self._bounded = "text/event-stream" not in content_type.lower()  # else event by event
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._decode = zlib.decompressobj(zlib.MAX_WBITS | 32).decompress  # gzip or zlib header
            self._bounded = True
        elif encoding not in ("", "identity"):
            self._decode = None
            self._stop(f"content-encoding {content_encoding!r} not read")
        self._pending = 0  # bytes of the event stream since the last event ended
        self._tail = b""

    def feed(self, raw: bytes) -> bytes | None:
        """The decoded chunk, after the observer has seen it; None once reading has stopped."""
        if self._decode is None:
            return None
        left = self._max_bytes - self._decoded
        try:
            plain = self._decode(raw, left + 1)  # decompression stops one byte past the bound
        except zlib.error as exc:
            self._stop(f"response body does not decode: {exc}")
            return None
        self._decoded += len(plain)
        if self._bounded and self._decoded > self._max_bytes:
            self._stop(f"decoded response over server.max_inspect_bytes ({self._max_bytes} bytes)")
            return None
        if not self._bounded and self._event_too_long(plain):
            self._stop(f"an event over server.max_event_bytes ({self._max_event} bytes)")
            return None
        if not (self.held.take(len(plain)) if self._bounded else self.held.set(self._pending)):
            limit = self.held.pool.limit if self.held.pool is not None else 0
            self._stop(f"the process holds server.max_inspect_total_bytes ({limit} bytes) for inspection already")
            return None
        self.observer.feed(plain, False)
        return plain

    def end(self) -> None:
        """The response ended; the observer finishes unless reading stopped early."""
        if self._decode is not None:
            self.observer.feed(b"", True)

    def release(self) -> None:
        """Give back what this response holds of the process-wide bound, once the call is done with
        it (what the observer read, the answer's chunks, lives as long as the call)."""
        self.held.release()

    def _event_too_long(self, plain: bytes) -> bool:
        seen = self._tail + plain
        last = max((i + len(end) for end in _EVENT_ENDS if (i := seen.rfind(end)) >= 0), default=-1)
        if last >= 0:
            self._pending = len(seen) - last
        else:
            self._pending += len(plain)
        self._tail = seen[-3:]
        return self._pending > self._max_event

    def _stop(self, why: str) -> None:
        self.held.release()
        self._decode = None
        self.unread = why
        self.observer.observation.unread = why


def _identity(chunk: bytes, _max: int) -> bytes:
    return chunk
