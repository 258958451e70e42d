"""One HTTP/1.1 client connection: a request written in one go, the response read with httptools.

httpcore2's connection runs every exchange through h11's pure-Python state machine, an anyio lock
and a dozen trace context managers; on a cold process (bench/bench_proxy.py's stream phase) that
was the largest piece of ragtoll's time before the first streamed event that it could change.
Here the request head is formatted directly and the response is parsed by httptools (llhttp, the
C parser uvicorn already uses for requests). Measured in the stream-phase harness (600 cold calls
per build): ragtoll's first event 1.63 ms over direct on this connection, 1.91 ms on httpcore2's
(two runs; the httpx floor 1.84 and 1.78 ms in them). The rules it keeps:

  * request framing from the request's own headers: `transfer-encoding: chunked` is chunk-encoded,
    `content-length` must match the body (else `LocalProtocolError`, nothing more is sent), no
    framing header means no body; header names must be tokens and values free of CR, LF and NUL;
  * 1xx informational responses are skipped; 204, 304 and answers to HEAD have no body; a body
    with neither length nor chunking runs until the server closes (and the connection is not
    reused); a connection closed before the head, or before a framed body ends, is a
    `RemoteProtocolError`, as is anything llhttp cannot parse (including bytes after the response);
  * a server that answers before reading the whole request body still has its answer read;
  * the connection is reused only when the exchange completed and both sides allow keep-alive;
    a response closed early, an error or a cancellation closes it;
  * errors are httpcore2's exception types (as netio's are); the pool maps them to httpx2's.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable

import httptools
from httpcore2 import AsyncNetworkStream, LocalProtocolError, RemoteProtocolError, WriteError

_READ_SIZE = 1 << 16
_MAX_HEAD = 1 << 18  # response heads past this many bytes are refused
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(rb"[\r\n\x00]")


class Response:
    """The response head, and its body as an async iterator that must be closed."""

    __slots__ = ("body", "headers", "http_version", "reason", "status")

    def __init__(self, status: int, reason: bytes, headers: list[tuple[bytes, bytes]], http_version: bytes,
                 body: Body) -> None:
        self.status, self.reason, self.headers, self.http_version, self.body = status, reason, headers, http_version, body


class Connection:
    """An HTTP/1.1 connection to one origin; one exchange at a time (the pool sees to that)."""

    def __init__(self, stream: AsyncNetworkStream, keepalive_expiry: float | None = None) -> None:
        self.stream = stream
        self._expiry = keepalive_expiry
        self._expire_at: float | None = None
        self._state = "idle"  # idle | active | closed

    def is_idle(self) -> bool:
        return self._state == "idle"

    def is_closed(self) -> bool:
        return self._state == "closed"

    def has_expired(self) -> bool:
        """Idle past its keep-alive expiry, or the server sent something (its close) while idle."""
        if self._state != "idle":
            return False
        if self._expire_at is not None and time.monotonic() > self._expire_at:
            return True
        return bool(self.stream.get_extra_info("is_readable"))

    async def aclose(self) -> None:
        if self._state != "closed":
            self._state = "closed"
            await self.stream.aclose()

    async def send(self, method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]],
                   body: AsyncIterable[bytes], read_timeout: float | None, write_timeout: float | None) -> Response:
        """Write the request and read the response head; the caller closes `Response.body`."""
        if self._state != "idle":
            raise LocalProtocolError(f"the connection is {self._state}, not idle")
        self._state = "active"
        try:
            head, framing, length, close = _request_head(method, target, headers)
            await self.stream.write(head, write_timeout)
            reader = _Reader(self, method == b"HEAD", read_timeout, reuse=not close)
            try:
                await _write_body(self.stream, body, framing, length, write_timeout)
            except WriteError:
                pass  # the server may have answered (and closed) before reading it all: read that answer
            return await reader.head()
        except BaseException:
            await self.aclose()
            raise

    def _finished(self, reusable: bool) -> None:
        if reusable and self._state == "active":
            self._state = "idle"
            self._expire_at = None if self._expiry is None else time.monotonic() + self._expiry


def _request_head(method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]]
                  ) -> tuple[bytes, str, int, bool]:
    """The request head, its body framing ('none' | 'length' | 'chunked'), the declared length,
    and whether the request itself asks for `connection: close`."""
    lines = [method, b" ", target, b" HTTP/1.1\r\n"]
    framing, length, close = "none", 0, False
    for name, value in headers:
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise LocalProtocolError(f"invalid request header {name[:40]!r}")
        lower = name.lower()
        if lower == b"content-length":
            if framing == "chunked":
                continue  # chunked wins (RFC 9112 6.3): the length is not sent
            if not value.strip().isdigit() or (framing == "length" and int(value) != length):
                raise LocalProtocolError(f"invalid content-length {value[:40]!r}")
            framing, length = "length", int(value)
        elif lower == b"transfer-encoding":
            if value.strip().lower() != b"chunked":
                raise LocalProtocolError(f"unsupported transfer-encoding {value[:40]!r}")
            framing = "chunked"
        elif lower == b"connection" and b"close" in value.lower():
            close = True
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines), framing, length, close


async def _write_body(stream: AsyncNetworkStream, body: AsyncIterable[bytes], framing: str, length: int,
                      timeout: float | None) -> None:
    sent = 0
    async for part in body:
        if not part:
            continue
        if framing == "chunked":
            await stream.write(b"%x\r\n%s\r\n" % (len(part), part), timeout)
            continue
        sent += len(part)
        if framing == "none" or sent > length:
            raise LocalProtocolError("request body longer than its content-length" if framing == "length"
                                     else "request body without content-length or transfer-encoding")
        await stream.write(part, timeout)
    if framing == "chunked":
        await stream.write(b"0\r\n\r\n", timeout)
    elif sent != length:
        raise LocalProtocolError(f"request body shorter than its content-length ({sent} of {length} bytes)")


class _Reader:
    """llhttp callbacks for one response, and the reads that feed it."""

    def __init__(self, conn: Connection, head_only: bool, timeout: float | None, reuse: bool) -> None:
        self.conn, self.head_only, self.timeout, self.reuse = conn, head_only, timeout, reuse
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.until_close = False
        self.parts: list[bytes] = []
        self.head_bytes = 0
        self.error: RemoteProtocolError | None = None  # the body broke after these parts

    # llhttp callbacks
    def on_status(self, reason: bytes) -> None:
        self.reason = reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status < 200:  # informational: the real response follows
            self.headers, self.reason = [], b""
            return
        self.status, self.head_done = status, True
        self.keep_alive = self.parser.should_keep_alive()
        framed = any(n.lower() in (b"content-length", b"transfer-encoding") for n, _ in self.headers)
        if self.head_only:
            self.complete = True
        elif not framed and status not in (204, 304):
            self.until_close = True  # the body ends when the server closes

    def on_body(self, part: bytes) -> None:
        if not self.complete:
            self.parts.append(part)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True
            self.keep_alive = self.keep_alive and self.parser.should_keep_alive()

    async def feed(self) -> bool:
        """Read once and parse it; False at the end of the connection."""
        data = await self.conn.stream.read(_READ_SIZE, self.timeout)
        if not data:
            return False
        if not self.head_done:
            self.head_bytes += len(data)
            if self.head_bytes > _MAX_HEAD:
                raise RemoteProtocolError(f"response head larger than {_MAX_HEAD} bytes")
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            raise RemoteProtocolError("the server switched protocols; only HTTP/1.1 is supported") from None
        except httptools.HttpParserError as exc:
            self.reuse = False
            if not self.head_done:
                raise RemoteProtocolError(f"malformed response: {exc}") from None
            if not self.complete:  # the body broke: what was parsed before it still goes out first
                self.error = RemoteProtocolError(f"malformed response body: {exc}")
            # else: bytes after the response: pass on what came, never reuse the connection
        return True

    async def head(self) -> Response:
        while not self.head_done:
            if not await self.feed():
                raise RemoteProtocolError("Server disconnected without sending a response.")
        return Response(self.status, self.reason, self.headers, b"HTTP/" + self.parser.get_http_version().encode(),
                        Body(self))

    async def next_parts(self) -> list[bytes] | None:
        """Body pieces parsed so far (reading more if there are none), None once the body ended."""
        while not self.parts:
            if self.error is not None:
                raise self.error
            if self.complete:
                return None
            if not await self.feed():
                if self.until_close:
                    self.complete, self.keep_alive = True, False
                    return None
                raise RemoteProtocolError("peer closed connection without sending complete message body")
        parts, self.parts = self.parts, []
        return parts


class Body:
    """A response body; closing it hands the connection back (reusable or not) exactly once."""

    def __init__(self, reader: _Reader) -> None:
        self._reader = reader
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        reader = self._reader
        try:
            while (parts := await reader.next_parts()) is not None:
                for part in parts:
                    yield part
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        r = self._reader
        if r.complete and r.keep_alive and r.reuse:
            r.conn._finished(True)
        else:
            await r.conn.aclose()
