"""An experiment, not what ragtoll ships: its ASGI app on granian's RSGI interface, each request's RSGI
scope and protocol turned into ASGI's scope, `receive` and `send` (issue 34).

Why it was tried: granian's ASGI interface hands every `receive` and `send` across from its Rust
threads and a body arrives as separate messages; on RSGI a body of declared length comes in one
`await proto()` and an answer of one body leaves in one `response_bytes` call. Granian and hyper
still do all of HTTP. What it measured (docs/performance.md, "granian's RSGI interface"): 0.07-0.09x
the floor's added p50 and 0.08-0.10x its CPU per call less than granian's ASGI; the body read whole
is all of that (the same adapter reading the body as chunks gains nothing).

Why it is not shipped: RSGI's scope has no raw path. `scope.path` arrives percent-decoded
(`/a%2Fb%20c` as `/a/b c`), so a transparent proxy can no longer forward the request target
byte for byte, nor refuse what only the raw target shows; and a header whose value is not UTF-8
is left out of `scope.headers` without a word. Both are granian's RSGI API, not this adapter's.

How: the body whole when its Content-Length is declared within `max_body_bytes`, else as its
chunks come (`async for`); after the body, `receive` answers `http.disconnect` when the client
goes away (`client_disconnect()`) or the answer is complete; start plus one final body is one
`response_bytes`, anything else streams through `response_stream`'s transport, which granian ends
when it is dropped. `python granian_app.py ragtoll_uvicorn:app() PORT rsgi-adapter` serves ragtoll
through it (`bench_tail.py --servers`), its lifespan run on granian's own `LifespanProtocol`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from granian.rsgi import ProtocolClosed

Message = dict[str, Any]
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_DISCONNECT: Message = {"type": "http.disconnect"}
_NO_BODY: Message = {"type": "http.request", "body": b"", "more_body": False}


class RsgiApp:
    """`app` (ASGI) served on granian's RSGI interface. `state`: the lifespan's state, which every
    request's scope carries (a copy, as ASGI asks); `max_body_bytes`: the largest body read whole."""

    def __init__(self, app: Any, state: dict[str, Any], max_body_bytes: int = 8 * 1024 * 1024) -> None:
        self.app = app
        self.state = state
        self.max_body_bytes = max_body_bytes

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":  # websockets are off (server.py)
            return
        host, _, port = scope.client.rpartition(":")
        server_host, _, server_port = scope.server.rpartition(":")
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in scope.headers.items()]
        exchange = _Exchange(proto, self._whole(scope.headers))
        try:
            await self.app({
                "type": "http", "asgi": _ASGI, "http_version": scope.http_version, "method": scope.method,
                "scheme": scope.scheme, "path": scope.path, "raw_path": scope.path.encode("latin-1"),
                "query_string": scope.query_string.encode("latin-1"), "root_path": "", "headers": headers,
                "client": (host.strip("[]"), int(port or 0)), "server": (server_host.strip("[]"), int(server_port or 0)),
                "state": self.state.copy(),
            }, exchange.receive, exchange.send)
        finally:
            exchange.finish()

    def _whole(self, headers: Any) -> bool:
        """Whether the body is read in one piece: its length declared, within the limit, not chunked."""
        if "transfer-encoding" in headers:
            return False
        declared = headers.get("content-length")
        return declared is not None and declared.isdigit() and int(declared) <= self.max_body_bytes


class _Exchange:
    """One request's ASGI `receive` and `send` over its RSGI protocol."""

    __slots__ = ("answered", "body_done", "chunks", "headers", "over", "proto", "status", "stream", "whole")

    def __init__(self, proto: Any, whole: bool) -> None:
        self.proto = proto
        self.whole = whole
        self.chunks: Any = None  # the body's chunks, once a receive asks for them
        self.body_done = False
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.stream: Any = None  # the streamed answer's transport
        self.answered = False
        self.over: asyncio.Future[None] | None = None  # the answer's end or the client's going

    async def receive(self) -> Message:
        if self.body_done:
            return await self._ended()
        if self.whole:
            self.body_done = True
            try:
                return {"type": "http.request", "body": await self.proto(), "more_body": False}
            except ProtocolClosed:
                return _DISCONNECT
        if self.chunks is None:
            self.chunks = self.proto.__aiter__()
        try:
            chunk = await self.chunks.__anext__()
        except StopAsyncIteration:
            self.body_done = True
            return _NO_BODY
        except ProtocolClosed:
            self.body_done = True
            return _DISCONNECT
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def _ended(self) -> Message:
        """After the body: `http.disconnect` once the client goes away or the answer is complete."""
        if not self.answered:
            self.over = over = asyncio.get_running_loop().create_future()
            gone = asyncio.ensure_future(self.proto.client_disconnect())
            gone.add_done_callback(lambda _: over.done() or over.set_result(None))
            try:
                await over
            finally:
                gone.cancel()
        return _DISCONNECT

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            self.headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", ())]
            return
        if kind != "http.response.body" or self.answered:
            return
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if self.stream is None:
            if not more:
                self.proto.response_bytes(self.status, self.headers, body)
                self._answered()
                return
            self.stream = self.proto.response_stream(self.status, self.headers)
        if body:
            try:
                await self.stream.send_bytes(body)
            except ProtocolClosed:  # the client went away mid-answer: what an ASGI server raises
                self._answered()
                raise OSError("the client went away") from None
        if not more:
            self._answered()

    def _answered(self) -> None:
        self.answered = True
        self.stream = None  # granian ends a streamed answer when its transport is dropped
        if self.over is not None and not self.over.done():
            self.over.set_result(None)

    def finish(self) -> None:
        """After the app returned: an answer it never started is a 500, as granian's ASGI sends."""
        if not self.answered and self.stream is None:
            self.proto.response_empty(self.status or 500, self.headers if self.status else [])
        self._answered()
