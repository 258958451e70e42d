"""The client side's sockets: uvicorn's HTTP/1.1 protocol, with a response head sent together
with the first body bytes.

uvicorn writes a response head the moment `http.response.start` is sent, then each body message
as it comes: a small answer leaves as two segments, and a stream's first event follows its head
in a second one. Each loopback send wakes the peer, and costs the sender's own time: a 200-byte
send() measured 15 us between busy processes and 60-100 us after 50-200 ms idle on this 2-core
VM, the case of every streamed call in bench/bench_proxy.py. Here a write is held until the next
one, which then goes out with it, or until the event-loop turn ends:

  * a head and the body (or the first event) written in the same turn leave as one segment;
  * nothing waits past the turn it was written in: a stream whose next event has not arrived
    yields to the event loop, and the held write goes out then;
  * a response that completes is handed over at once, before ragtoll's bookkeeping after it;
  * `close()` sends what is held first; flow control stays the transport's (at most one write,
    of at most `_HOLD_AT_MOST` bytes, is held).
"""

from __future__ import annotations

import asyncio
from typing import Any

_HOLD_AT_MOST = 1 << 16  # larger writes are not held, nor joined to what is


class HeldTransport:
    """The connection's transport as uvicorn sees it: a write is held until the next one or the
    end of the event-loop turn, whichever comes first."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if not data:
            return
        held = self._held
        if held is None:
            if len(data) >= _HOLD_AT_MOST:
                self._transport.write(data)
                return
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._held = None
        if len(data) >= _HOLD_AT_MOST:
            self._transport.write(held)
            self._transport.write(data)
        else:
            self._transport.write(held + data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + (len(self._held) if self._held is not None else 0)

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)


def http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (httptools when installed, else h11) on a `HeldTransport`."""
    base: Any
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:  # httptools missing: uvicorn's pure-Python parser
        from uvicorn.protocols.http.h11_impl import H11Protocol as base

    class HeldWritesProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(HeldTransport(transport))

        def on_response_complete(self) -> None:
            self.transport.flush()
            super().on_response_complete()

    HeldWritesProtocol.__qualname__ = HeldWritesProtocol.__name__ = f"HeldWrites{base.__name__}"
    return HeldWritesProtocol
