"""The upstream client's sockets: httpcore2's network backend interface, on asyncio directly.

httpcore2's default backend goes through anyio. Each of its reads and writes opens a cancel scope
and first yields to the event loop (a full loop turn, an `epoll_wait`), and a request goes out as
two writes: the head, then the body. Measured on an idle 2-core VM (bench/bench_proxy.py stream
phase, where every call starts cold), each anyio write took about 0.3 ms, and the second segment
woke the upstream a second time.

This backend:
  * answers a read from data already received without yielding;
  * coalesces writes issued in the same event-loop turn into one `transport.write` - a request
    whose body is in memory leaves as one segment - and flushes what it holds before the turn
    ends (a streamed body's next chunk never waits for the head to go out);
  * keeps httpcore2's contract: its exceptions (`ReadTimeout`, `WriteError`, ...), timeouts per
    operation, TLS through `start_tls`, `get_extra_info` keys, flow control both ways.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Iterable
from typing import Any

from httpcore2 import (
    AsyncNetworkBackend,
    AsyncNetworkStream,
    ConnectError,
    ConnectTimeout,
    ReadError,
    ReadTimeout,
    WriteError,
    WriteTimeout,
)
from httpcore2._utils import is_socket_readable

# Reading pauses while this much received data waits for httpcore to ask for it.
_PAUSE_READING_AT = 1 << 20
# Writes are held for the rest of the event-loop turn only up to this much, then handed over.
_HOLD_AT_MOST = 1 << 16


class _Protocol(asyncio.Protocol):
    """Receives into a queue of chunks and wakes the one reader or writer waiting on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.offset = 0  # into chunks[0]: what of it was already read
        self.buffered = 0
        self.eof = False
        self.error: BaseException | None = None  # the connection was lost with this
        self.reader: asyncio.Future[None] | None = None
        self.drain: asyncio.Future[None] | None = None
        self.writing_paused = False
        self.reading_paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered >= _PAUSE_READING_AT and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> None:
        self.eof = True
        self._wake_reader()

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake_reader()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)

    def _wake_reader(self) -> None:
        if self.reader is not None and not self.reader.done():
            self.reader.set_result(None)

    def take(self, max_bytes: int) -> bytes:
        """Up to `max_bytes` of the oldest received data. A received chunk larger than that is
        handed out in pieces from an offset: only the piece returned is copied."""
        head = self.chunks[0]
        if self.offset == 0 and len(head) <= max_bytes:
            chunk = self.chunks.popleft()
        else:
            chunk = head[self.offset:self.offset + max_bytes]
            self.offset += len(chunk)
            if self.offset == len(head):
                self.chunks.popleft()
                self.offset = 0
        self.buffered -= len(chunk)
        if self.reading_paused and self.buffered < _PAUSE_READING_AT // 2 and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return chunk


async def _wait(fut: asyncio.Future[None], timeout: float | None, error: type[Exception]) -> None:
    """Await `fut`; after `timeout` seconds raise `error` instead (None: no limit)."""
    if timeout is None:
        await fut
        return
    timer = asyncio.get_running_loop().call_later(timeout, _expire, fut)
    try:
        await fut
    except _Expired:
        raise error(f"timed out after {timeout} s") from None
    finally:
        timer.cancel()


class _Expired(Exception):
    pass


def _expire(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_exception(_Expired())


class AsyncioStream(AsyncNetworkStream):
    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._held: list[bytes] = []  # writes of this loop turn, not yet handed to the transport
        self._held_bytes = 0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._flush()
        p = self._protocol
        while not p.chunks:
            if p.error is not None:
                raise ReadError(f"{type(p.error).__name__}: {p.error}")
            if p.eof:
                return b""
            p.reader = asyncio.get_running_loop().create_future()
            try:
                await _wait(p.reader, timeout, ReadTimeout)
            finally:
                p.reader = None
        return p.take(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        p = self._protocol
        if p.error is not None or self._transport.is_closing():
            raise WriteError("the connection is closed")
        if not self._held:
            asyncio.get_running_loop().call_soon(self._flush)
        self._held.append(buffer)
        self._held_bytes += len(buffer)
        if self._held_bytes >= _HOLD_AT_MOST:
            self._flush()
        if p.writing_paused:  # the peer is not reading: hand over what is held and wait
            self._flush()
            p.drain = asyncio.get_running_loop().create_future()
            try:
                await _wait(p.drain, timeout, WriteTimeout)
            finally:
                p.drain = None
            if p.error is not None:
                raise WriteError(f"{type(p.error).__name__}: {p.error}")

    def _flush(self) -> None:
        if self._held:
            data = self._held[0] if len(self._held) == 1 else b"".join(self._held)
            self._held.clear()
            self._held_bytes = 0
            if not self._transport.is_closing():
                self._transport.write(data)

    async def aclose(self) -> None:
        self._flush()
        self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> AsyncNetworkStream:
        self._flush()
        loop = asyncio.get_running_loop()
        try:
            transport = await loop.start_tls(self._transport, self._protocol, ssl_context,
                                             server_hostname=server_hostname, ssl_handshake_timeout=timeout)
        except TimeoutError as exc:
            self._transport.close()
            raise ConnectTimeout(f"TLS handshake timed out ({timeout} s)") from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise ConnectError(f"TLS handshake failed: {exc}") from exc
        if transport is None:  # the connection closed during the handshake
            raise ConnectError("the connection closed during the TLS handshake")
        self._protocol.transport = transport  # type: ignore[assignment]
        return AsyncioStream(transport, self._protocol)  # type: ignore[arg-type]

    def get_extra_info(self, info: str) -> Any:
        t = self._transport
        if info == "ssl_object":
            return t.get_extra_info("ssl_object")
        if info == "client_addr":
            return t.get_extra_info("sockname")
        if info == "server_addr":
            return t.get_extra_info("peername")
        if info == "socket":
            return t.get_extra_info("socket")
        if info == "is_readable":
            # Already-received data or a closed connection count: the socket alone would not show them.
            p = self._protocol
            return bool(p.chunks) or p.eof or t.is_closing() or is_socket_readable(t.get_extra_info("socket"))
        return None


class AsyncioBackend(AsyncNetworkBackend):
    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        local = (local_address, 0) if local_address else None
        return await self._connect(
            lambda: loop.create_connection(_Protocol, host, port, local_addr=local), timeout, socket_options
        )

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        return await self._connect(lambda: loop.create_unix_connection(_Protocol, path), timeout, socket_options)

    @staticmethod
    async def _connect(open_: Any, timeout: float | None, socket_options: Iterable[Any] | None) -> AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                transport, protocol = await open_()
        except TimeoutError as exc:  # before OSError: TimeoutError is one
            raise ConnectTimeout(f"connect timed out ({timeout} s)") from exc
        except OSError as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        sock = transport.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return AsyncioStream(transport, protocol)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
