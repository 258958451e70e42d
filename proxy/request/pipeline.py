"""The lifecycle of one proxied call: identify, open spans, run stages, forward, stream, settle.

Order (DESIGN.md "The pipeline of one call"): task identity first (it parents the spans), then
the stages in `Pipeline.stages` order - parse, evidence cache, budget - then the upstream, then
every stage's `on_end` in reverse. Guarantees:
  * every stage whose `on_request` ran gets exactly one `on_end`, on success, error, rejection
    or client disconnect;
  * the call span ends when the response body ends (or the exchange fails), never at headers;
  * after response headers are sent the status cannot change: later failures are recorded on
    the span and the body is cut short (the client sees an incomplete response, not a fake end).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from ragtoll.instrumentation import semconv as sc

from ..config import Settings, Timeouts
from ..errors import BadRequest, BodyTooLarge, RagtollError, Rejected, RequestTimeout, render
from ..model import SOURCE_BAGGAGE, SOURCE_TRACEPARENT, Call, Observation, TaskRef
from .identify import Identifier, derived_span_id, parse_traceparent
from .inspection import Inspector
from .routing import Route, Router
from .upstream import UpstreamClient, UpstreamResponse

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
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
TASK_HEADER_OUT = b"x-ragtoll-task-id"


@dataclass(slots=True)
class Reply:
    """A local answer; the upstream is not called."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    content_type: bytes = b"application/json"


@dataclass(slots=True)
class Exchange:
    """Everything stages share about one call. Stages add what they own to `state`."""

    route: Route
    method: str
    target: str
    headers: dict[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    client: str
    started: float
    task: TaskRef | None = None
    call: Call = field(default_factory=lambda: Call(operation="other"))
    body: bytes | None = None
    observation: Observation = field(default_factory=Observation)
    span: Any = None
    status: int | None = None
    error: RagtollError | None = None
    outcome: str = "ok"  # ok | rejected | upstream_error | client_disconnect | error
    timeouts: Timeouts | None = None
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    upstream_seconds: float = 0.0
    bytes_out: int = 0
    headers_sent: bool = False  # after this the status can no longer change
    request_body: RequestBody | None = None  # the client's body, read through this once
    body_error: Exception | None = None  # why a streamed request body failed (the upstream sees only a break)
    state: dict[str, Any] = field(default_factory=dict)


class Stage(Protocol):
    """One concern of the pipeline. `on_request` may return a `Reply` to answer locally."""

    async def on_request(self, ex: Exchange) -> Reply | None: ...

    async def on_end(self, ex: Exchange) -> None: ...


class ChunkHook(Protocol):
    """Optional stage capability: see each decoded response chunk; return bytes to end the
    stream with those bytes instead of the rest (mid-stream budget enforcement)."""

    def on_chunk(self, ex: Exchange, chunk: bytes) -> bytes | None: ...


class ResponseHook(Protocol):
    """Optional stage capability: runs after a small non-streamed retrieval response was read whole
    and observed, before its headers are sent; may append to `ex.response_headers`."""

    async def on_response(self, ex: Exchange) -> None: ...


class ClientDisconnected(Exception):
    pass


class Pipeline:
    def __init__(
        self,
        settings: Settings,
        router: Router,
        client: UpstreamClient,
        stages: list[Stage],
        identifier: Identifier,
        tracer: trace.Tracer,
        on_end: Callable[[Exchange], None] | None = None,
    ) -> None:
        self.settings = settings
        self.router = router
        self.client = client
        self.stages = stages
        self.identifier = identifier
        self.tracer = tracer
        self._chunk_hooks = [s for s in stages if hasattr(s, "on_chunk")]
        self._response_hooks = [s for s in stages if hasattr(s, "on_response")]
        self._max_body = settings.server.max_body_bytes
        self._body_timeout = settings.server.body_timeout_s
        self._max_inspect = settings.server.max_inspect_bytes
        self._max_event = settings.server.max_event_bytes
        self._on_end = on_end  # per-call metrics; failsafe

    async def handle(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        headers: dict[str, str] = {}
        duplicated: set[str] = set()
        for k, v in raw_headers:
            key = k.decode("latin-1").lower()
            if key in headers:
                duplicated.add(key)
                headers[key] = f"{headers[key]}, {v.decode('latin-1')}"
            else:
                headers[key] = v.decode("latin-1")
        client = scope.get("client")
        style = route.adapter.error_style
        try:
            target = self.router.target(route, scope.get("raw_path") or scope["path"].encode(), scope["query_string"])
            task = self.identifier.identify(headers, client[0] if client else "", frozenset(duplicated))
        except Rejected as exc:
            await _send_error(send, exc, style, [])
            return
        ex = Exchange(route, scope["method"], target, headers, raw_headers, client[0] if client else "",
                      time.perf_counter(), task=task, timeouts=route.upstream.timeouts)
        ex.request_body = RequestBody(receive, headers, self._max_body,
                                      asyncio.get_running_loop().time() + self._body_timeout)
        ex.response_headers.append((TASK_HEADER_OUT, task.id.encode()))
        parent = trace.set_span_in_context(NonRecordingSpan(_parent_context(task, headers)))
        server_span = self.tracer.start_span(
            f"{ex.method} {route.prefix}", context=parent, kind=SpanKind.SERVER,
            attributes={sc.HTTP_REQUEST_METHOD: ex.method, sc.HTTP_ROUTE: route.prefix + "/*",
                        sc.URL_PATH: scope["path"][:256]},
        )
        try:
            await self._run(ex, server_span, send)
        finally:
            if ex.status is not None:
                server_span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, ex.status)
                if ex.status >= 500:
                    server_span.set_status(Status(StatusCode.ERROR))
            server_span.end()
            # An error's traceback holds this call's frames, and so the exchange and the server's
            # receive channel: a cycle only the garbage collector would break, keeping the client's
            # connection open until then (seen after a 408 on a streamed body).
            ex.error = ex.body_error = None
            ex.request_body.release()

    async def _run(self, ex: Exchange, server_span: Any, send: Send) -> None:
        route = ex.route
        style = route.adapter.error_style
        body_iter: AsyncIterator[bytes] | None = None
        request_body = ex.request_body
        assert request_body is not None
        try:
            if route.adapter.reads_body:
                ex.body = await request_body.read()
            elif "content-length" in ex.headers or "transfer-encoding" in ex.headers:
                request_body.check_declared_length()
                # the disconnect watcher may only read `receive` once the body is consumed
                body_iter = request_body.stream(ex, functools.partial(request_body.watch_disconnect, ex))
            else:
                ex.body = b""  # no body framing: forward none (not an empty chunked body)
        except (BodyTooLarge, RequestTimeout, ClientDisconnected) as exc:
            ex.outcome = "client_disconnect" if isinstance(exc, ClientDisconnected) else "rejected"
            if not isinstance(exc, ClientDisconnected):
                ex.status = exc.status
                await _send_error(send, exc, style, ex.response_headers)
            return
        if route.adapter.reads_body and ex.body is not None:
            ex.call = route.adapter.parse_request(ex.method, ex.target.split("?", 1)[0], ex.headers, ex.body)
        call = ex.call
        name = f"{call.operation} {call.model or route.upstream.name}"
        span = self.tracer.start_span(name, context=trace.set_span_in_context(server_span), kind=SpanKind.CLIENT)
        ex.span = span
        span.set_attributes({
            sc.GEN_AI_OPERATION_NAME: call.operation,
            sc.GEN_AI_PROVIDER_NAME: route.upstream.api,
            sc.UPSTREAM: route.upstream.name,
            sc.UPSTREAM_KIND: route.upstream.kind,
            sc.TASK_ID: ex.task.id if ex.task else "",
            sc.TASK_SOURCE: ex.task.source if ex.task else "",
        })
        if ex.task and ex.task.notes:
            span.set_attribute(sc.TASK_NOTES, list(ex.task.notes))
        ran: list[Stage] = []
        try:
            reply: Reply | None = None
            for stage in self.stages:
                ran.append(stage)
                reply = await stage.on_request(ex)
                if reply is not None:
                    break
            if reply is not None:
                ex.status = reply.status
                if reply.status >= 400:
                    ex.outcome = "rejected"
                ex.headers_sent = True
                await _send_reply(send, reply, ex.response_headers)
                return
            if body_iter is None:
                request_body.watch_disconnect(ex)
            await self._forward(ex, body_iter, send)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if ex.outcome != "client_disconnect" or task is None:
                raise
            task.uncancel()  # cancelled by our own disconnect watcher: finish the bookkeeping
        except (ClientDisconnected, RagtollError) as raised:
            # A streamed request body that failed (too large, too slow, client gone) reaches the
            # upstream only as a broken exchange: the body's own error is the one to answer.
            failure = ex.body_error or raised
            if isinstance(failure, ClientDisconnected):
                ex.outcome = "client_disconnect"
            elif not isinstance(failure, RagtollError):
                raise failure from raised
            elif not ex.headers_sent:  # nothing sent yet: a clean JSON error
                ex.error = failure
                ex.status = failure.status
                ex.outcome = "rejected" if isinstance(failure, Rejected) else "upstream_error"
                await _send_error(send, failure, style, ex.response_headers)
            else:
                ex.error = failure
                ex.outcome = "upstream_error"
        except Exception as exc:  # noqa: BLE001 - a bug: answer 500 if we still can, record it, never hang
            ex.outcome = "error"
            span.record_exception(exc)
            if not ex.headers_sent:
                ex.status = 500
                await _send_error(send, RagtollError(f"internal error: {type(exc).__name__}"), style, ex.response_headers)
        finally:
            watcher = ex.state.pop("watcher", None)
            if watcher is not None:
                watcher.cancel()
            for stage in reversed(ran):
                try:
                    await stage.on_end(ex)
                except Exception as exc:  # noqa: BLE001 - failsafe: a stage's bookkeeping never fails the call
                    span.record_exception(exc)
            _finish_span(span, ex)
            if self._on_end is not None:
                try:
                    self._on_end(ex)
                except Exception as exc:  # noqa: BLE001 - failsafe, as above
                    span.record_exception(exc)

    async def _forward(self, ex: Exchange, body: AsyncIterator[bytes] | None, send: Send) -> None:
        route = ex.route
        out_headers = upstream_headers(ex.raw_headers)
        declared = ex.headers.get("content-length")
        if body is not None and declared is not None and "transfer-encoding" not in ex.headers:
            out_headers.append((b"content-length", declared.encode()))  # the server checked the body against it
        t0 = time.perf_counter()
        with trace.use_span(ex.span, end_on_exit=False):
            response = await self.client.send(
                route.upstream, ex.method, ex.target, out_headers,
                ex.body if ex.body is not None else body,  # type: ignore[arg-type]
                timeouts=ex.timeouts or route.upstream.timeouts,
            )
        try:
            ex.status = response.status
            observer = route.adapter.observer(ex.call, response.status, response.headers)
            ex.observation = observer.observation
            inspector = Inspector(observer, content_encoding=response.headers.get("content-encoding", ""),
                                  content_type=response.headers.get("content-type", ""),
                                  max_bytes=self._max_inspect, max_event_bytes=self._max_event)
            headers = [(k, v) for k, v in response.raw_headers if k.lower() not in HOP_BY_HOP]
            if inspector.unread is None and self._should_buffer(ex, response):
                await self._send_buffered(ex, response, inspector, headers, send)
                return
            ex.headers_sent = True
            await send({"type": "http.response.start", "status": response.status,
                        "headers": headers + ex.response_headers})
            cut: bytes | None = None
            turn = time.perf_counter()
            async for chunk in response.chunks():
                if time.perf_counter() - turn > YIELD_AFTER_S:
                    # A fast upstream's chunks are ready at once, so neither reading nor sending
                    # waits: let the other calls (and /healthz) run before reading more.
                    await asyncio.sleep(0)
                    turn = time.perf_counter()
                plain = inspector.feed(chunk)
                if plain is not None:
                    for hook in self._chunk_hooks:
                        cut = hook.on_chunk(ex, plain)  # type: ignore[attr-defined]
                        if cut is not None:
                            break
                if cut is not None:
                    inspector.end()
                    ex.state["complete"] = True
                    await send({"type": "http.response.body", "body": cut, "more_body": False})
                    ex.bytes_out += len(cut)
                    break
                ex.bytes_out += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            else:
                inspector.end()
                ex.state["complete"] = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            ex.upstream_seconds = time.perf_counter() - t0
            await response.aclose()


    def _should_buffer(self, ex: Exchange, response: UpstreamResponse) -> bool:
        # A small answer is read whole, so its head and body reach the server in one hand-off (and
        # leave in one segment). Non-streamed retrieval answers up to max_inspect_bytes are read
        # whole before headers go out, so stages can add headers that depend on the result
        # (x-ragtoll-evidence). Streams never wait.
        if "text/event-stream" in response.headers.get("content-type", ""):
            return False
        length = response.headers.get("content-length")
        if length is None or not length.isdigit():
            return False
        return int(length) <= SMALL_RESPONSE or (self._describes(ex, response) and int(length) <= self._max_inspect)

    def _describes(self, ex: Exchange, response: UpstreamResponse) -> bool:
        """Whether response hooks (x-ragtoll-evidence) run for this answer."""
        return bool(self._response_hooks) and ex.call.operation == "retrieval" and response.status == 200

    async def _send_buffered(self, ex: Exchange, response: UpstreamResponse, inspector: Inspector,
                             headers: list[tuple[bytes, bytes]], send: Send) -> None:
        parts = [chunk async for chunk in response.chunks()]
        raw = b"".join(parts)
        plain = inspector.feed(raw)
        inspector.end()
        if plain is not None:
            for chunk_hook in self._chunk_hooks:  # they see the body as they would a stream (no cut here)
                chunk_hook.on_chunk(ex, plain)  # type: ignore[attr-defined]
        for hook in self._response_hooks if self._describes(ex, response) else ():
            try:
                await hook.on_response(ex)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - failsafe: a header hook never fails the call
                ex.span.record_exception(exc)
        ex.state["complete"] = True
        ex.bytes_out = len(raw)
        ex.headers_sent = True
        await send({"type": "http.response.start", "status": response.status, "headers": headers + ex.response_headers})
        await send({"type": "http.response.body", "body": raw, "more_body": False})


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


def _parent_context(task: TaskRef, headers: dict[str, str]) -> SpanContext:
    """The caller's span when it sent a valid traceparent; else the task's virtual root."""
    if task.source in (SOURCE_TRACEPARENT, SOURCE_BAGGAGE):
        parsed = parse_traceparent(headers.get("traceparent"))
        if parsed is not None:
            trace_id, span_id, flags = parsed
            return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))
    return SpanContext(task.trace_id, derived_span_id(task.id), is_remote=True, trace_flags=TraceFlags(1))


def _finish_span(span: Any, ex: Exchange) -> None:
    attrs: dict[str, Any] = {sc.OUTCOME: ex.outcome, sc.BYTES_OUT: ex.bytes_out}
    if ex.status is not None:
        attrs[sc.HTTP_RESPONSE_STATUS_CODE] = ex.status
    if ex.error is not None:
        attrs[sc.ERROR_TYPE] = ex.error.code
        span.set_status(Status(StatusCode.ERROR, ex.error.message[:200]))
    elif ex.status is not None and ex.status >= 500:
        attrs[sc.ERROR_TYPE] = str(ex.status)
        span.set_status(Status(StatusCode.ERROR))
    if ex.outcome == "client_disconnect":
        attrs[sc.ERROR_TYPE] = "client_disconnect"
    span.set_attributes(attrs)
    span.end()


class RequestBody:
    """The client's request body: read once, whole or as a stream, by `server.body_timeout_s`
    (RequestTimeout, 408), at most `server.max_body_bytes` (BodyTooLarge, 413).

    The server's receive channel is reached only through this object, and `release()` drops it when
    the call ends: an error's traceback can keep a failed read's frames alive in a reference cycle,
    and while anything holds the channel the server keeps the client's connection open.
    """

    def __init__(self, receive: Receive, headers: dict[str, str], limit: int, deadline: float) -> None:
        self._receive: Receive | None = receive
        self._headers = headers
        self._limit = limit
        self._deadline = deadline

    def release(self) -> None:
        self._receive = None

    async def read(self) -> bytes:
        """The whole body."""
        self.check_declared_length()
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self._next()
            chunk = message.get("body", b"")
            size += len(chunk)
            self._check_size(size)
            parts.append(chunk)
            if not message.get("more_body", False):
                return parts[0] if len(parts) == 1 else b"".join(parts)

    async def stream(self, ex: Exchange, on_done: Callable[[], None]) -> AsyncIterator[bytes]:
        """The body as it arrives, for the upstream. A failure is kept in `ex.body_error`, since the
        upstream client reports it only as a broken exchange."""
        size = 0
        try:
            while True:
                message = await self._next()
                chunk = message.get("body", b"")
                size += len(chunk)
                self._check_size(size)
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    on_done()
                    return
        except (ClientDisconnected, BodyTooLarge, RequestTimeout) as exc:
            ex.body_error = exc
            raise

    def check_declared_length(self) -> None:
        declared = self._headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._limit:
            raise BodyTooLarge(f"request body exceeds {self._limit} bytes (server.max_body_bytes)", limit=self._limit)

    def _check_size(self, size: int) -> None:
        if size > self._limit:
            raise BodyTooLarge(f"request body exceeds {self._limit} bytes (server.max_body_bytes)", limit=self._limit)

    def watch_disconnect(self, ex: Exchange) -> None:
        """Cancel the current task if the client goes away while the upstream is still working.

        Only once the body is consumed. The server also answers `http.disconnect` once the response
        is complete, so a finished exchange (`state["complete"]`) is never cancelled.
        """
        handler = asyncio.current_task()

        async def watch() -> None:
            while self._receive is not None and (await self._receive())["type"] != "http.disconnect":
                pass  # an unread empty request body
            if handler is None or handler.done() or ex.state.get("complete"):
                return
            ex.outcome = "client_disconnect"
            handler.cancel()

        ex.state["watcher"] = asyncio.get_running_loop().create_task(watch())

    async def _next(self) -> MutableMapping[str, Any]:
        if self._receive is None:
            raise ClientDisconnected()  # the call has ended
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise RequestTimeout("the request body did not arrive within server.body_timeout_s") from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        return message


async def _send_reply(send: Send, reply: Reply, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", reply.content_type), (b"content-length", str(len(reply.body)).encode()),
               *reply.headers, *extra]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


async def _send_error(send: Send, error: RagtollError, style: str, extra: list[tuple[bytes, bytes]]) -> None:
    headers: list[tuple[bytes, bytes]] = []
    if isinstance(error, Rejected):
        # A local refusal is final: the OpenAI and Anthropic SDKs would otherwise retry it.
        headers.append((b"x-should-retry", b"false"))
    if isinstance(error, RequestTimeout | BodyTooLarge):  # the body was not read to its end: no reuse
        headers.append((b"connection", b"close"))
    await _send_reply(send, Reply(error.status, render(error, style=style), headers), extra)
