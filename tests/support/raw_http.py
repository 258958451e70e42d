"""A raw asyncio HTTP/1.1 server on its own event loop in a thread, for tests of the upstream
client's sockets and pool: it records every `data_received` call (how a request left the client),
counts connections (opened, open now, most open at once, closed by the client) and can answer late.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
import threading
from collections.abc import Callable
from typing import Self

# (head, body) -> the raw response, or (seconds, response) to answer that much later
Respond = Callable[[bytes, bytes], bytes | tuple[float, bytes]]


def localhost_tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for `localhost` from a fresh test CA, and a client
    context that trusts only that CA."""
    import trustme

    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server_ctx)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)
    return server_ctx, trusting


def ok(head: bytes, body: bytes) -> bytes:
    payload = b"got %d bytes, sha %s" % (len(body), hashlib.sha256(body).hexdigest().encode())
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload)


class RawServer(asyncio.Protocol):
    """Parses Content-Length requests; answers each with `respond`; optionally closes after it."""

    def __init__(self, respond: Respond, recvs: list[bytes], heads: threading.Event, close_after: bool,
                 server: Server, answer_at_head: bool = False) -> None:
        self.answer_at_head = answer_at_head
        self.respond, self.recvs, self.heads, self.close_after = respond, recvs, heads, close_after
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.open_now += 1
        self.server.max_open = max(self.server.max_open, self.server.open_now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.open_now -= 1

    def eof_received(self) -> bool | None:
        self.server.client_closed += 1  # the client hung up (FIN) first
        return None

    def data_received(self, data: bytes) -> None:
        self.recvs.append(data)
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            self.heads.set()
            if self.answer_at_head:  # refuse at once, without reading the body
                self.buffer = b""
                self._answer(self.respond(head, b""))  # type: ignore[arg-type]
                return
            fields = dict(line.lower().partition(b":")[::2] for line in head.split(b"\r\n")[1:])
            if fields.get(b"transfer-encoding", b"").strip() == b"chunked":
                body, rest = _dechunk(rest)
                if body is None:
                    return
            else:
                length = int(fields.get(b"content-length", b"0"))
                if len(rest) < length:
                    return
                body, rest = rest[:length], rest[length:]
            self.buffer = rest
            answer = self.respond(head, body)
            if isinstance(answer, tuple):
                asyncio.get_running_loop().call_later(answer[0], self._answer, answer[1])
            else:
                self._answer(answer)
            if self.close_after:
                return

    def _answer(self, answer: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if answer:
            self.transport.write(answer)
        if self.close_after:
            self.transport.close()


def _dechunk(data: bytes) -> tuple[bytes | None, bytes]:
    """A whole chunked body and what follows it, or (None, data) while it is incomplete."""
    body, pos = b"", 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return None, data
        size = int(data[pos:end].split(b";")[0], 16)
        if len(data) < end + 2 + size + 2:
            return None, data
        if size == 0:
            return body, data[end + 4:]
        body += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


class Server:
    """The raw server on its own event loop in a thread, so it reads each segment as it arrives."""

    def __init__(self, respond: Respond = ok, *, tls: ssl.SSLContext | None = None, close_after: bool = False,
                 answer_at_head: bool = False):
        self.respond, self.tls, self.close_after, self.answer_at_head = respond, tls, close_after, answer_at_head
        self.recvs: list[bytes] = []
        self.connections = 0  # opened so far
        self.open_now = 0
        self.max_open = 0  # most connections open at once
        self.client_closed = 0  # connections the client closed first
        self.heads = threading.Event()
        self._protocols: list[RawServer] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def _factory(self) -> RawServer:
        self.connections += 1
        self._protocols.append(RawServer(self.respond, self.recvs, self.heads, self.close_after, self,
                                         self.answer_at_head))
        return self._protocols[-1]

    async def __aenter__(self) -> Self:
        self._thread.start()
        start = self._loop.create_server(self._factory, "127.0.0.1", 0, ssl=self.tls)
        self.server = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(start, self._loop))
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        def close() -> None:
            self.server.close()
            for protocol in self._protocols:
                if protocol.transport is not None:  # None: its TLS handshake failed
                    protocol.transport.close()
            self._loop.call_soon(self._loop.stop)  # after the transports' close callbacks

        self._loop.call_soon_threadsafe(close)
        await asyncio.to_thread(self._thread.join, 5)
        self._loop.close()


