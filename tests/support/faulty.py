"""Misbehaving peers on loopback, on raw sockets: an upstream that resets, stalls, answers garbage,
sends 10 MB or dribbles its body, and clients that vanish or read slowly.

The upstream picks its fault from the request header `x-fault`, which ragtoll forwards like any
other header, so every adapter's real path can be used: ok, no-headers, reset-before-headers,
reset-mid-stream, stall-mid-stream, garbage, garbage-mid-body, big, slow-body. It records what
it saw per request: bytes it managed to write and whether the proxy closed the connection early.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import orjson

CHAT_ANSWER = orjson.dumps({
    "id": "chatcmpl-f", "object": "chat.completion", "created": 1700000000, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}})


# What the fault tests send it through ragtoll: a chat call, routes with a short read timeout
# (a stall is noticed in 0.5 s), a budget roomy enough that no fault test is refused by it.
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
BUDGETS = {"default_profile": "p", "profiles": {"p": {"max_steps": 50, "max_completion_tokens": 10_000}}}


def routes(url: str, read_timeout: float = 0.5) -> list[dict[str, Any]]:
    """An `openai` route (/openai) and a pass-through route (/raw) to `url`."""
    t = {"read": read_timeout, "connect": 1.0}
    return [{"name": "openai", "kind": "llm", "api": "openai", "url": url, "prefix": "/openai", "timeouts": t},
            {"name": "raw", "kind": "other", "api": "passthrough", "url": url, "prefix": "/raw", "timeouts": t}]


def new_task() -> str:
    return f"rel-{uuid.uuid4().hex[:12]}"


def sse_event(i: int) -> bytes:
    doc = {"id": "c", "object": "chat.completion.chunk", "created": 1700000000, "model": "gpt-4o-mini",
           "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def search_results(request: bytes) -> bytes:
    """A retrieval answer (the `json` adapter's default shape) that depends on the query."""
    try:
        query = str(orjson.loads(request).get("query", ""))
    except (orjson.JSONDecodeError, AttributeError):
        query = ""
    return orjson.dumps({"results": [{"id": f"{query[:20]}-{i}", "text": f"chunk {i} about {query}",
                                      "score": 0.9 - i / 10} for i in range(3)]})


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@dataclass
class Seen:
    """One request as the faulty upstream saw it."""

    fault: str
    path: str
    body: bytes
    bytes_sent: int = 0
    peer_closed: bool = False  # the proxy hung up before the upstream finished
    done: threading.Event = field(default_factory=threading.Event)


class FaultyUpstream:
    """`with FaultyUpstream() as up:` serves on `up.url`; `up.seen` lists the requests."""

    def __init__(self, big_bytes: int = 10 * 1024 * 1024) -> None:
        self.big_bytes = big_bytes
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop

            async def main() -> None:
                self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
                self.port = self._server.sockets[0].getsockname()[1]
                started.set()
                async with self._server:
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._server.serve_forever()

            with contextlib.suppress(RuntimeError):
                loop.run_until_complete(main())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("faulty upstream did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        loop, server = self._loop, self._server
        if loop is not None and server is not None:
            async def stop() -> None:
                server.close()
                for task in asyncio.all_tasks():  # open handlers (stalls) and serve_forever
                    if task is not asyncio.current_task():
                        task.cancel()

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(stop(), loop).result(5)
        if self._thread is not None:
            self._thread.join(10)

    def last(self, timeout: float = 5.0) -> Seen:
        """The latest request, once its handler has finished (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        while not self.seen and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = self.seen[-1]
        seen.done.wait(max(0.0, deadline - time.monotonic()))
        return seen

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen: Seen | None = None
        try:
            while True:  # keep-alive: one request after another on this connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = b""
                if "content-length" in headers:
                    body = await reader.readexactly(int(headers["content-length"]))
                elif "chunked" in headers.get("transfer-encoding", ""):
                    while (size := int((await reader.readline()).split(b";")[0], 16)) > 0:
                        body += await reader.readexactly(size + 2)
                        body = body[:-2]
                    await reader.readline()
                seen = Seen(headers.get("x-fault", "ok"), path, body)
                with self._lock:
                    self.seen.append(seen)
                if not await self._answer(seen, reader, writer):
                    return
                seen.done.set()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            if seen is not None:
                seen.peer_closed = True
        finally:
            if seen is not None:
                seen.done.set()
            with contextlib.suppress(Exception):
                writer.close()

    async def _send(self, seen: Seen, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()  # waits while the proxy does not read: backpressure is visible here
        seen.bytes_sent += len(data)

    async def _answer(self, seen: Seen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False closes the connection."""
        sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        fault = seen.fault
        if fault == "ok":
            body = search_results(seen.body) if seen.path.split("?")[0].endswith("/search") else CHAT_ANSWER
            await self._send(seen, writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)
            return True
        if fault == "reset-before-headers":
            _reset(writer)
            return False
        if fault == "no-headers":  # accepts the request, never answers: the proxy's read timeout decides
            if await reader.read(1) == b"":
                seen.peer_closed = True
            return False
        if fault == "reset-mid-stream":
            await self._send(seen, writer, sse + _chunk(sse_event(0)) + _chunk(sse_event(1)))
            await asyncio.sleep(0.05)
            _reset(writer)
            return False
        if fault == "stall-mid-stream":
            await self._send(seen, writer, sse + _chunk(sse_event(0)))
            # wait until the proxy gives up (its read timeout) or the server stops
            if await reader.read(1) == b"":
                seen.peer_closed = True
            return False
        if fault == "garbage":
            await self._send(seen, writer, b"\x00\xff\x13garbage, not HTTP at all\r\n\r\n" * 4)
            return False
        if fault == "garbage-mid-body":  # valid headers and an event, then (later) a broken chunked framing
            await self._send(seen, writer, sse + _chunk(sse_event(0)))
            await asyncio.sleep(0.05)  # in one segment with the head, a client may refuse the head itself
            await self._send(seen, writer, b"zz-not-a-chunk-size\r\n\r\n")
            return False
        if fault == "big":
            size = self.big_bytes
            await self._send(seen, writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                             b"content-length: %d\r\n\r\n" % size)
            block, body_sent = b"x" * 65536, 0
            while body_sent < size:
                part = block[: size - body_sent]
                await self._send(seen, writer, part)
                body_sent += len(part)
            return True
        if fault == "slow-body":
            parts = [CHAT_ANSWER[i: i + 40] for i in range(0, len(CHAT_ANSWER), 40)]
            await self._send(seen, writer, b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(CHAT_ANSWER))
            for part in parts:
                await asyncio.sleep(0.1)
                await self._send(seen, writer, part)
            return True
        await self._send(seen, writer, b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
        return True


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), not a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# --- misbehaving clients -------------------------------------------------------------------------


def host_port(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def raw_request(method: str, path: str, headers: dict[str, str], body: bytes = b"",
                content_length: int | None = None) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def exchange(base: str, data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, read until the server closes (send `Connection: close`)."""
    with socket.create_connection(host_port(base), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


@contextlib.contextmanager
def slow_reader(base: str, data: bytes, rcvbuf: int = 4096) -> Iterator[socket.socket]:
    """A connection with a small receive buffer that has sent `data` and reads nothing until the
    caller does: the proxy's writes to it block, as they would toward a slow client."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    try:
        sock.connect(host_port(base))
        sock.sendall(data)
        yield sock
    finally:
        sock.close()


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def open_fds(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))
