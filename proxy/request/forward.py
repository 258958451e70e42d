"""Forwarding one call: the request as it goes upstream, and the response as it streams back.

The client always gets the upstream's bytes; the stages see a bounded, decoded copy (Inspector)
through their `on_chunk` and, for small retrieval answers read whole, `on_response`. After the
response head is sent the status cannot change: a later failure cuts the body short.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import trace

from ..errors import BadRequest
from .buffers import Held, InspectBytes
from .exchange import Exchange, Reply, Stage
from .inspection import Inspector
from .offload import off_loop_if_big
from .upstream import UpstreamClient, UpstreamResponse

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# RFC 9110 7.6.1 hop-by-hop headers, never forwarded in either direction.
HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
     b"te", b"trailer", b"transfer-encoding", b"upgrade", b"host"}
)
YIELD_AFTER_S = 0.002  # a stream hands the event loop to other calls at least this often
SMALL_RESPONSE = 64 * 1024  # a non-streamed answer up to this size is read whole before it is sent on
# The request's framing is set anew for what goes upstream: exactly one of content-length or chunked.
_FRAMING = frozenset({b"content-length", b"transfer-encoding"})
# ragtoll's own request headers are for ragtoll, not for the upstream.
_OWN_PREFIX = b"x-ragtoll-"


def upstream_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The caller's headers as they go upstream: without hop-by-hop headers, framing and ragtoll's own.

    A value holding CR, LF or NUL is refused (BadRequest): it could end the header line early."""
    out = []
    for k, v in raw:
        name = k.lower()
        if name in HOP_BY_HOP or name in _FRAMING or name.startswith(_OWN_PREFIX):
            continue
        if b"\r" in v or b"\n" in v or b"\0" in v:
            raise BadRequest(f"header {k.decode('latin-1')!r} holds a line break or NUL")
        out.append((k, v))
    return out


class Forwarder:
    def __init__(self, client: UpstreamClient, stages: list[Stage], *, max_inspect_bytes: int,
                 max_event_bytes: int, pool: InspectBytes | None = None,
                 on_answered: Callable[[Exchange], Awaitable[None]] | None = None) -> None:
        """`on_answered`: awaited once the whole answer was read, before its last bytes go to the
        client (what the client's next call depends on is filed by then: request/conversation.py)."""
        self.client = client
        self.pool = pool  # the process-wide bound on bytes held for inspection
        self._on_answered = on_answered
        # the phases the pipeline calls per chunk and per read-whole answer: only stages that have them
        self._chunk_stages = [s for s in stages if type(s).on_chunk is not Stage.on_chunk]
        self._response_stages = [s for s in stages if type(s).on_response is not Stage.on_response]
        self._max_inspect = max_inspect_bytes
        self._max_event = max_event_bytes

    async def forward(self, ex: Exchange, body: AsyncIterator[bytes] | None, send: Send) -> None:
        """Send the call upstream and stream the answer to the client (`body`: a streamed request body)."""
        route = ex.route
        out_headers = upstream_headers(ex.raw_headers)
        declared = ex.headers.get("content-length")
        if body is not None and declared is not None and "transfer-encoding" not in ex.headers:
            out_headers.append((b"content-length", declared.encode()))  # the server checked the body against it
        t0 = time.perf_counter()
        with trace.use_span(ex.span, end_on_exit=False):
            response = await self.client.send(
                route.upstream, ex.method, ex.target, out_headers, ex.body if body is None else body,  # type: ignore[arg-type]
                timeouts=ex.timeouts or route.upstream.timeouts,
            )
        try:
            ex.status = response.status
            observer = route.adapter.observer(ex.call, response.status, response.headers)
            ex.observation = observer.observation
            inspector = Inspector(observer, content_encoding=response.headers.get("content-encoding", ""),
                                  content_type=response.headers.get("content-type", ""),
                                  max_bytes=self._max_inspect, max_event_bytes=self._max_event, pool=self.pool)
            headers = [(k, v) for k, v in response.raw_headers if k.lower() not in HOP_BY_HOP]
            whole = Held(self.pool)
            try:
                if inspector.unread is None and self._read_whole(ex, response, whole, inspector):
                    await self._send_whole(ex, response, inspector, headers, send)
                else:
                    await self._stream(ex, response, inspector, headers, send)
            finally:
                whole.release()
                inspector.release()
        finally:
            ex.upstream_seconds = time.perf_counter() - t0
            await response.aclose()

    async def _stream(self, ex: Exchange, response: UpstreamResponse, inspector: Inspector,
                      headers: list[tuple[bytes, bytes]], send: Send) -> None:
        ex.headers_sent = True
        await send({"type": "http.response.start", "status": response.status, "headers": headers + ex.response_headers})
        turn = time.perf_counter()
        async for chunk in response.chunks():
            if time.perf_counter() - turn > YIELD_AFTER_S:
                # A fast upstream's chunks are ready at once, so neither reading nor sending
                # waits: let the other calls (and /healthz) run before reading more.
                await asyncio.sleep(0)
                turn = time.perf_counter()
            plain = inspector.feed(chunk)
            cut = self._chunk(ex, plain) if plain is not None else None
            if cut is None and ex.gate is not None:  # held back until it may go (a budget extension)
                gate, ex.gate = ex.gate, None
                cut = await gate()
            if cut is not None:  # a stage ends the stream here (a budget ran out)
                inspector.end()
                ex.complete = True
                ex.bytes_out += len(cut)
                await send({"type": "http.response.body", "body": cut, "more_body": False})
                return
            ex.bytes_out += len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        inspector.end()
        ex.complete = True
        await self._answered(ex)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def read_local(self, ex: Exchange, reply: Reply) -> Reply:
        """The adapter reads a local answer (a cache hit) as it reads the upstream's: the observation
        (a retrieval's chunks are the task's evidence) and `on_response` (x-ragtoll-evidence, and
        adaptive depth: a hit is cut as the same answer from upstream would be, so what an agent
        does next with it, a rerank say, matches what it did the first time). The reply to send."""
        observer = ex.route.adapter.observer(ex.call, reply.status, {"content-type": reply.content_type.decode()})
        ex.observation = observer.observation
        inspector = Inspector(observer, content_encoding="", content_type=reply.content_type.decode(),
                              max_bytes=self._max_inspect, max_event_bytes=self._max_event, pool=self.pool)
        try:
            plain = await _read(inspector, reply.body)
        finally:
            inspector.release()
        if plain is not None:
            self._chunk(ex, plain)
        if self._response_stages and ex.call.operation == "retrieval" and reply.status == 200:
            ex.response_body = plain
            await self._on_response(ex)
            if ex.response_body is not plain and ex.response_body is not None:  # a stage trimmed the answer
                return dataclasses.replace(reply, body=ex.response_body)
        return reply

    async def _answered(self, ex: Exchange) -> None:
        if self._on_answered is not None:
            try:
                await self._on_answered(ex)
            except Exception as exc:  # noqa: BLE001 - failsafe: bookkeeping never fails the call
                ex.span.record_exception(exc)

    async def _on_response(self, ex: Exchange) -> None:
        for stage in self._response_stages:
            try:
                await stage.on_response(ex)
            except Exception as exc:  # noqa: BLE001 - failsafe: a header hook never fails the call
                ex.span.record_exception(exc)

    def _chunk(self, ex: Exchange, plain: bytes) -> bytes | None:
        for stage in self._chunk_stages:
            cut = stage.on_chunk(ex, plain)
            if cut is not None:
                return cut
        return None

    def _read_whole(self, ex: Exchange, response: UpstreamResponse, whole: Held, inspector: Inspector) -> bool:
        # A small answer is read whole, so its head and body reach the server in one hand-off (and
        # leave in one segment). Non-streamed retrieval answers up to max_inspect_bytes are read
        # whole before headers go out, so stages can add headers that depend on the result
        # (x-ragtoll-evidence). Streams never wait.
        if "text/event-stream" in response.headers.get("content-type", ""):
            return False
        length = response.headers.get("content-length")
        if length is None or not length.isdigit():
            return False
        size = int(length)
        if size > SMALL_RESPONSE and not (self._described(ex, response) and size <= self._max_inspect):
            return False
        # held whole until it is sent: past the process-wide bound it streams instead (and, its
        # decoded copy refused too, passes through unread). The decoded copy's room (the same size
        # unless compressed) is held with it, or neither is
        if not whole.take(size):
            return False
        if self._described(ex, response) and not inspector.held.reserve(size):
            whole.release()
            return False
        return True

    def _described(self, ex: Exchange, response: UpstreamResponse) -> bool:
        """Whether `on_response` (x-ragtoll-evidence) runs for this answer."""
        return bool(self._response_stages) and ex.call.operation == "retrieval" and response.status == 200

    async def _send_whole(self, ex: Exchange, response: UpstreamResponse, inspector: Inspector,
                          headers: list[tuple[bytes, bytes]], send: Send) -> None:
        raw = b"".join([chunk async for chunk in response.chunks()])
        plain = await _read(inspector, raw)
        if plain is not None:
            self._chunk(ex, plain)  # stages see the body as they would a stream (a cut cannot apply here)
        if self._described(ex, response):
            ex.response_body = plain
            await self._on_response(ex)
            if ex.response_body is not plain and ex.response_body is not None:  # a stage trimmed the answer
                raw = ex.response_body
                headers = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"content-encoding")]
                headers.append((b"content-length", str(len(raw)).encode()))
        ex.complete = True
        await self._answered(ex)
        ex.bytes_out = len(raw)
        ex.headers_sent = True
        await send({"type": "http.response.start", "status": response.status, "headers": headers + ex.response_headers})
        await send({"type": "http.response.body", "body": raw, "more_body": False})


async def _read(inspector: Inspector, body: bytes) -> bytes | None:
    """A whole answer decoded and read by its observer (parsed at its end): on the inspection
    thread when it is big, so no one answer holds the event loop (the observer is this call's alone)."""

    def read() -> bytes | None:
        plain = inspector.feed(body)
        inspector.end()
        return plain

    return await off_loop_if_big(len(body), read)
