"""The lifecycle of one proxied call, in three phases: admit, respond, finish.

  * admit: task identity (it parents the call span), who is calling (`ex.caller`, resolved once), the
    call span (opened as the request's server span), the request body, the adapter's parse (which
    names the call span), then every stage's `on_request` in order
    (cache, context, principal, budget, evidence, span, outcome; their order is checked against the stages'
    contracts when the pipeline is made);
  * respond: the local answer (a reply a stage returned, or a proposal no later stage vetoed) or
    the upstream's, streamed through `Forwarder`;
  * finish: every stage's `on_end` in reverse, the call span's end, the per-call metrics hook.
Guarantees: every stage whose `on_request` ran gets exactly one `on_end`, on success, error,
refusal or client disconnect; one span per request (the call span: kind SERVER, child of the
caller's context; a request refused before its task is known gets a small span of its own,
`refusal_span`, a root, at most `REFUSAL_SPANS_PER_SECOND` a second); the call span ends when the response body ends (or the exchange fails),
never at headers; after response headers are sent the status cannot change (a later failure is
recorded on the span and the body is cut short: never a fake clean end).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from ragtoll.instrumentation import semconv as sc

from ..adapters.base import DUPLICATE_KEY
from ..config import Settings
from ..core import queries
from ..errors import (
    BadRequest,
    BodyTooLarge,
    Overloaded,
    RagtollError,
    Rejected,
    RequestTimeout,
    UpstreamTimeout,
    render,
)
from ..model import SOURCE_BAGGAGE, SOURCE_PER_CALL, SOURCE_TRACEPARENT, TaskRef
from .body import ClientDisconnected, RequestBody
from .buffers import Held, InspectBytes
from .caller import CallerResolver
from .conversation import Conversations
from .exchange import Exchange, Reply, Stage, check_contracts
from .forward import Forwarder
from .identify import Identifier, derived_span_id, parse_traceparent
from .offload import off_loop_if_big
from .routing import Route, Router
from .upstream import UpstreamClient

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
TASK_HEADER_OUT = b"x-ragtoll-task-id"


class Pipeline:
    def __init__(self, settings: Settings, router: Router, client: UpstreamClient, stages: list[Stage],
                 identifier: Identifier, callers: CallerResolver, tracer: trace.Tracer,
                 on_end: Callable[[Exchange], None] | None = None,
                 root_sampled: Callable[[int], bool] = lambda _trace_id: True,
                 conversations: Conversations | None = None, refusals: RefusalSpans | None = None,
                 end_task: Callable[[Exchange], Awaitable[None]] | None = None) -> None:
        """Raises ContractError when the stages' order cannot serve what each reads (exchange.py).
        `conversations`: tells the task of an untracked call by its conversation (None: the session).
        `end_task`: ends a per-call task once its call is settled, before the call's span ends."""
        check_contracts(stages)
        self.conversations = conversations
        self.router = router
        self.callers = callers
        self.stages = stages
        self.identifier = identifier
        self.tracer = tracer
        self.refusals = refusals or RefusalSpans(tracer)
        self._root_sampled = root_sampled  # the sampling flag of a task's virtual root
        # every byte held for inspection, request bodies and answers, across the process (buffers.py)
        self.inspect_bytes = InspectBytes(settings.server.max_inspect_total_bytes)
        self.forwarder = Forwarder(client, stages, max_inspect_bytes=settings.server.max_inspect_bytes,
                                   max_event_bytes=settings.server.max_event_bytes, pool=self.inspect_bytes,
                                   on_answered=self._answered if conversations is not None else None)
        self._max_query = settings.server.max_query_chars
        self._max_body = settings.server.max_body_bytes
        self._body_timeout = settings.server.body_timeout_s
        self._on_end = on_end  # per-call metrics; failsafe
        self._end_task = end_task  # failsafe, as on_end

    async def handle(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        headers, duplicated = read_headers(raw_headers)
        client = scope.get("client")
        address = client[0] if client else ""
        try:
            target = self.router.target(route, scope.get("raw_path") or scope["path"].encode(), scope["query_string"])
            task = self.identifier.identify(headers, address, duplicated)
            caller = self.callers.resolve(headers, duplicated, address, route.adapter.credential_headers)
            if caller.refusal is not None:  # a token that failed, a refused anonymous caller
                raise caller.refusal
        except Rejected as exc:
            self.refusals.record(scope, route.prefix + "/*", exc)
            await _send_error(send, exc, route.adapter.error_style, [])
            return
        ex = Exchange(route, scope["method"], target, headers, raw_headers, address, time.perf_counter(), task=task,
                      caller=caller, timeouts=route.upstream.timeouts)
        request_body = ex.request_body = RequestBody(receive, headers, self._max_body,
                                                     asyncio.get_running_loop().time() + self._body_timeout,
                                                     Held(self.inspect_bytes))
        started_ns = time.time_ns()
        ex.response_headers.append((TASK_HEADER_OUT, task.id.encode()))
        body: AsyncIterator[bytes] | None | bool = None
        early = self.conversations is not None and route.adapter.reads_body and self.conversations.applies(task)
        if early:  # the conversation names the task, and so the trace: read before the spans start
            body = await self._read(ex, request_body, send)
            if body is not False:
                await self._parse(ex)
                found = await self.conversations.resolve(ex)  # type: ignore[union-attr]
                if found is not None:
                    task = ex.task = found[0]
                    ex.thread = found[1]
                    ex.response_headers[0] = (TASK_HEADER_OUT, task.id.encode())
        # The call span is the request's server span too: one span per call (docs/observability.md).
        # Named by the request until the parse names the call (`_describe_call`).
        # A per-call task is its one call: that call's span is the trace's root and, once the task
        # ends with the call, carries the task's summary (no `ragtoll.task` span of its own).
        per_call = task.source == SOURCE_PER_CALL
        parent = Context() if per_call else \
            trace.set_span_in_context(NonRecordingSpan(_parent_context(task, headers, self._root_sampled)))
        span = ex.span = self.tracer.start_span(
            f"{ex.method} {route.prefix}", context=parent, kind=SpanKind.SERVER, start_time=started_ns,
            attributes={sc.HTTP_REQUEST_METHOD: ex.method, sc.HTTP_ROUTE: route.prefix + "/*",
                        sc.URL_PATH: scope["path"][:256]},
        )
        if per_call and span.get_span_context().is_valid:  # the task's record names the span's trace
            task = ex.task = dataclasses.replace(task, trace_id=span.get_span_context().trace_id)
        ran = False
        try:
            if not early:
                body = await self._read(ex, request_body, send)
            if body is not False:
                if not early:
                    await self._parse(ex)
                ran = True  # `_run` ends the span from here on, whatever happens
                await self._run(ex, body, send)  # type: ignore[arg-type]
        finally:
            if not ran:  # the body failed (413, 408, gone) or could not be parsed: the span as far as it got
                _end_request_span(span, ex.status)
            # An error's traceback holds this call's frames, and so the exchange and the server's
            # receive channel: a cycle only the garbage collector would break, keeping the client's
            # connection open until then (seen after a 408 on a streamed body).
            ex.error = ex.body_error = None
            request_body.release()

    async def _read(self, ex: Exchange, request_body: RequestBody, send: Send) -> AsyncIterator[bytes] | None | bool:
        """Read the body of a route whose adapter reads it; else the stream to forward (None: no
        body). False: the body failed and the client has its answer (413, 408) or is gone."""
        try:
            if ex.route.adapter.reads_body:
                ex.body = await request_body.read()
                return None
            if "content-length" in ex.headers or "transfer-encoding" in ex.headers:
                request_body.check_declared_length()
                # the disconnect watcher may only read `receive` once the body is consumed
                return request_body.stream(ex, functools.partial(request_body.watch_disconnect, ex))
            ex.body = b""  # no body framing: forward none (not an empty chunked body)
            return None
        except (BodyTooLarge, RequestTimeout, ClientDisconnected, Overloaded) as exc:
            ex.outcome = "client_disconnect" if isinstance(exc, ClientDisconnected) else "rejected"
            if not isinstance(exc, ClientDisconnected):
                ex.status = exc.status
                await _send_error(send, exc, ex.route.adapter.error_style, ex.response_headers)
            return False

    async def _run(self, ex: Exchange, body: AsyncIterator[bytes] | None, send: Send) -> None:
        self._describe_call(ex)
        ran: list[Stage] = []
        try:
            reply = await self._admit(ex, ran)
            await self._respond(ex, reply, body, send)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if ex.outcome != "client_disconnect" or task is None:
                raise
            task.uncancel()  # cancelled by our own disconnect watcher: finish the bookkeeping
        except (ClientDisconnected, RagtollError) as raised:
            await self._failed(ex, raised, send)
        except Exception as exc:  # noqa: BLE001 - a bug: answer 500 if we still can, record it, never hang
            ex.outcome = "error"
            ex.span.record_exception(exc)
            if not ex.headers_sent:
                ex.status = 500
                await _send_error(send, RagtollError(f"internal error: {type(exc).__name__}"),
                                  ex.route.adapter.error_style, ex.response_headers)
        finally:
            await self._finish(ex, ran)

    async def _parse(self, ex: Exchange) -> None:
        """The adapter's reading of the body: on the inspection thread when the body is big (parsing and
        counting the tokens of a large prompt held the event loop for every other call), then an
        oversized query set aside (`_oversized`)."""
        if not ex.route.adapter.reads_body or ex.body is None:
            return
        parse = functools.partial(ex.route.adapter.parse_request, ex.method, ex.target.split("?", 1)[0],
                                  ex.headers, ex.body)
        ex.call = await off_loop_if_big(len(ex.body), parse)
        if ex.call.query is not None and len(ex.call.query) > self._max_query:
            ex.oversized_query = _oversized(ex)

    async def _answered(self, ex: Exchange) -> None:
        """The whole answer is read: an untracked LLM call files what its conversation's next calls
        are found by (before the client has the answer, so before it can make them)."""
        if ex.thread is not None and self.conversations is not None:
            await self.conversations.observe(ex, ex.thread)

    def _describe_call(self, ex: Exchange) -> None:
        """The call span named by GenAI conventions (`chat gpt-4o`, `retrieval docs`) once the call is parsed."""
        route = ex.route
        call = ex.call
        span = ex.span
        span.update_name(f"{call.operation} {call.model or route.upstream.name}")
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
        if ex.task and ex.task.match:
            span.set_attributes({sc.TASK_MATCH: ex.task.match, sc.TASK_CONFIDENCE: ex.task.confidence or 0.0})
        if ex.oversized_query:
            span.set_attribute(sc.QUERY_OVERSIZED, ex.oversized_query)

    async def _admit(self, ex: Exchange, ran: list[Stage]) -> Reply | None:
        """Every stage's `on_request` in order; the local answer, if any (see `Exchange`). A body
        holding a key twice is refused first, on every route whose body ragtoll reads: ragtoll and
        the upstream could read two different requests from it."""
        if ex.call.parse_error and ex.call.parse_error.startswith(DUPLICATE_KEY):
            raise BadRequest(f"the request body holds a {ex.call.parse_error[len('duplicate '):]}; send each key once",
                             code="duplicate_json_key")
        for stage in self.stages:
            ran.append(stage)
            reply = await stage.on_request(ex)
            if reply is not None:
                return reply
        return ex.proposal

    async def _respond(self, ex: Exchange, reply: Reply | None, body: AsyncIterator[bytes] | None,
                       send: Send) -> None:
        if reply is not None:
            ex.status = reply.status
            if reply.status >= 400:
                ex.outcome = "rejected"
            elif reply is ex.proposal and ex.route.adapter.reads_body:
                reply = await self.forwarder.read_local(ex, reply)
            ex.headers_sent = True
            ex.complete = True
            await _send_reply(send, reply, ex.response_headers)
            return
        if body is None:
            ex.request_body.watch_disconnect(ex)  # type: ignore[union-attr]
        await self.forwarder.forward(ex, body, send)

    async def _failed(self, ex: Exchange, raised: Exception, send: Send) -> None:
        # A streamed request body that failed (too large, too slow, client gone) reaches the
        # upstream only as a broken exchange: the body's own error is the one to answer.
        failure = ex.body_error or raised
        if isinstance(failure, ClientDisconnected):
            ex.outcome = "client_disconnect"
            return
        if not isinstance(failure, RagtollError):
            raise failure from raised
        if isinstance(failure, UpstreamTimeout) and ex.timeout_error is not None:
            failure = ex.timeout_error() or failure  # a deadline ran out, not the upstream's patience
        ex.error = failure
        if ex.headers_sent:
            ex.outcome = "upstream_error"
            return
        ex.status = failure.status  # nothing sent yet: a clean JSON error
        ex.outcome = "rejected" if isinstance(failure, Rejected) else "upstream_error"
        await _send_error(send, failure, ex.route.adapter.error_style, ex.response_headers)

    async def _finish(self, ex: Exchange, ran: list[Stage]) -> None:
        if ex.watcher is not None:
            ex.watcher.cancel()
        span = ex.span
        for stage in reversed(ran):
            try:
                await stage.on_end(ex)
            except Exception as exc:  # noqa: BLE001 - failsafe: a stage's bookkeeping never fails the call
                span.record_exception(exc)
        if self._end_task is not None and ex.task is not None and ex.task.source == SOURCE_PER_CALL:
            try:
                await self._end_task(ex)
            except Exception as exc:  # noqa: BLE001 - failsafe, as above: the idle sweep ends it then
                span.record_exception(exc)
        _finish_span(span, ex)
        if self._on_end is not None:
            try:
                self._on_end(ex)
            except Exception as exc:  # noqa: BLE001 - failsafe, as above
                span.record_exception(exc)


def read_headers(raw: list[tuple[bytes, bytes]]) -> tuple[dict[str, str], frozenset[str]]:
    """The request's headers by lower-case name (repeats joined with ", ", as RFC 9110 allows for
    lists) and the names that came more than once (identity rules refuse to guess among them)."""
    headers: dict[str, str] = {}
    duplicated: set[str] = set()
    for k, v in raw:
        key = k.decode("latin-1").lower()
        if key in headers:
            duplicated.add(key)
            headers[key] = f"{headers[key]}, {v.decode('latin-1')}"
        else:
            headers[key] = v.decode("latin-1")
    return headers, frozenset(duplicated)


def _parent_context(task: TaskRef, headers: dict[str, str], root_sampled: Callable[[int], bool]) -> SpanContext:
    """The caller's span when it sent a valid traceparent (its sampling flag decides); else the task's
    virtual root, sampled as the provider's sampler would sample a root of the task's trace, so the
    calls of a task are kept or dropped together, with its summary span (task_span.root_sampled)."""
    if task.source in (SOURCE_TRACEPARENT, SOURCE_BAGGAGE):
        parsed = parse_traceparent(headers.get("traceparent"))
        if parsed is not None:
            trace_id, span_id, flags = parsed
            return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags & 1))
    return SpanContext(task.trace_id, derived_span_id(task.id), is_remote=True,
                       trace_flags=TraceFlags(1 if root_sampled(task.trace_id) else 0))


REFUSAL_SPANS_PER_SECOND = 20  # per process; past it a refused request is answered and not traced


class RefusalSpans:
    """Spans of requests refused before their task is known, at most `per_second` a second. Their
    callers were not accepted, so they must not be able to crowd the span queue every accepted
    call's span goes through (at ~850 req/s its 2,048 spans already fill): a flood of 401s costs at
    most `per_second` spans a second, and `skipped` says how many were not traced."""

    def __init__(self, tracer: trace.Tracer, per_second: int = REFUSAL_SPANS_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.tracer, self.per_second, self.clock = tracer, per_second, clock
        self.skipped = 0
        self._second, self._spent = -1, 0

    def record(self, scope: Scope, route: str | None, error: RagtollError) -> None:
        second = int(self.clock())
        if second != self._second:
            self._second, self._spent = second, 0
        if self._spent >= self.per_second:
            self.skipped += 1
            return
        self._spent += 1
        refusal_span(self.tracer, scope, route, error)


def refusal_span(tracer: trace.Tracer, scope: Scope, route: str | None, error: RagtollError) -> None:
    """The span of a request refused before its task is known (a caller that failed authentication, a
    task header refused, a path no upstream serves): the request's method, route, path, status and
    error. Always a root, with no task id: the caller was not accepted, so its `traceparent` does not
    place a span in a trace it names (an unauthenticated client could otherwise write into anyone's
    trace whose id it knows). Worst case: one such span per refused request, five attributes, no
    body read, and at most `RefusalSpans.per_second` of them a second."""
    attrs = {sc.HTTP_REQUEST_METHOD: scope["method"], sc.URL_PATH: scope["path"][:256], sc.ERROR_TYPE: error.code}
    if route is not None:
        attrs[sc.HTTP_ROUTE] = route
    name = scope["method"] if route is None else f"{scope['method']} {route.removesuffix('/*')}"
    span = tracer.start_span(name, context=_ROOT, kind=SpanKind.SERVER, attributes=attrs)
    _end_request_span(span, error.status)


_ROOT = trace.set_span_in_context(trace.INVALID_SPAN)  # a context with no span: a new trace


def _end_request_span(span: Any, status: int | None) -> None:
    """End a span that no call finished: its status, if an answer was sent."""
    if status is not None:
        span.set_attribute(sc.HTTP_RESPONSE_STATUS_CODE, status)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
    span.end()


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


async def _send_reply(send: Send, reply: Reply, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [(b"content-type", reply.content_type), (b"content-length", str(len(reply.body)).encode()),
               *reply.headers, *extra]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body, "more_body": False})


def _oversized(ex: Exchange) -> int:
    """A query past `server.max_query_chars`: keyed by a hash of its raw text (its unique-query key;
    two spellings are two queries) and then forgotten, so nothing downstream normalises, tokenises,
    embeds, compares, caches or records it: the progress verdict judges its results alone, the
    cache passes it by (`no_query`), and the span records its length. Returns that length."""
    call = ex.call
    assert call.query is not None
    call.query_key = queries.oversized_key(ex.route.upstream.name, call.query, call.query_vector, call.filters)
    length, call.query = len(call.query), None
    return length


async def _send_error(send: Send, error: RagtollError, style: str, extra: list[tuple[bytes, bytes]]) -> None:
    headers: list[tuple[bytes, bytes]] = []
    if isinstance(error, Overloaded):
        headers.append((b"retry-after", b"1"))
    if isinstance(error, Rejected):
        # A local refusal is final: the OpenAI and Anthropic SDKs would otherwise retry it.
        headers.append((b"x-should-retry", b"false"))
    if isinstance(error, RequestTimeout | BodyTooLarge | Overloaded):  # the body was not read to its end: no reuse
        headers.append((b"connection", b"close"))
    await _send_reply(send, Reply(error.status, render(error, style=style), headers), extra)
