"""Span export from another process: the OTLP exporter encodes and sends in a child process.

Encoding a span as OTLP protobuf is Python work that holds the GIL (~60 µs a span plus ~5 µs per
attribute on the project's machine; a call span carries ~60 attributes), and a thread holding the
GIL delays the event loop up to the switch interval each time it wants it back: the span export
was the largest share of ragtoll's CPU per call and of its p99 (bench/bench_tail.py,
docs/performance.md). Here the SDK's BatchSpanProcessor still batches in this process, and its thread
hands each finished batch to one child process as plain tuples (~15 µs a span to copy and pickle);
the child rebuilds `ReadableSpan`s and calls the same OTLP exporter ragtoll would use in-process
(instrumentation/setup.py). Nothing is encoded or exported here, and nothing is lost in the copy:
names, ids, parents, kinds, times, attributes, events, links, status, scope, resource and the
dropped counts.

The child is spawned (never forked from a process with server threads), ignores SIGINT (the parent
flushes it on shutdown), and exits within a second of the parent's death, however it died (the pipe
alone would not tell it: the child holds both ends of its task queue). A daemonic process (the worker of a
server that runs workers with multiprocessing, as hypercorn does) may not have children: there the
spans are exported in-process, as with `telemetry.export: thread`, and a warning says so. A child that dies is replaced at
the next batch; the batch it held is reported as failed. At most `in_flight` batches wait for the
child: past that the export thread waits, its queue fills and the SDK drops spans (and says so),
as it does with an exporter that cannot keep up. Imports nothing from ragtoll.proxy.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger("ragtoll.export")
DEFAULT_IN_FLIGHT = 4  # batches handed over and not yet exported by the child
_WAIT_S = 30.0  # the longest the export thread waits for one batch (the OTLP exporter's own timeout is 10 s)
_RESTART_AFTER_S = 1.0  # a child that died is replaced at most once a second

Flat = tuple[Any, ...]


class ProcessSpanExporter(SpanExporter):
    """A `SpanExporter` whose batches are exported by `setup.span_exporter(env)` in a child process.

    `env` holds the OTEL_* settings (the child builds its exporter from them; it also inherits this
    process's environment); `resource` is the provider's, sent once when the child starts."""

    def __init__(self, env: Mapping[str, str], resource: Resource, *, in_flight: int = DEFAULT_IN_FLIGHT) -> None:
        self._init_args = ({k: v for k, v in env.items() if k.startswith("OTEL_")}, dict(resource.attributes),
                           resource.schema_url)
        self._resource = resource
        self._in_flight = max(1, in_flight)
        self._pending: collections.deque[Future[bool]] = collections.deque()
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()  # export, flush and shutdown may come from different threads
        self._scopes: dict[InstrumentationScope | None, int] = {}
        self._last_start = 0.0
        self._closed = False
        self._env = env
        self._in_process: SpanExporter | None = None  # when this process may not have children

    def _start(self) -> ProcessPoolExecutor | None:
        if self._pool is not None:
            return self._pool
        now = time.monotonic()
        if now - self._last_start < _RESTART_AFTER_S:
            return None
        self._last_start = now
        if multiprocessing.current_process().daemon and self._in_process is None:
            from .setup import span_exporter

            log.warning("a daemonic process cannot start the span export process: spans are exported in-process")
            self._in_process = span_exporter(self._env)
            return None
        self._scopes.clear()  # a new child knows no scope yet
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_child_init, initargs=self._init_args)
        return self._pool

    def _broken(self, exc: BaseException) -> None:
        log.warning("the span export process stopped (%s); starting another", type(exc).__name__)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
        self._pending.clear()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            if self._closed:
                return SpanExportResult.FAILURE
            if self._in_process is not None:
                return self._in_process.export(spans)
            pool = self._start()
            if self._in_process is not None:
                return self._in_process.export(spans)
            if pool is None:
                return SpanExportResult.FAILURE  # the child died a moment ago: this batch is dropped
            scopes: list[Flat] = []
            batch = [_flatten(span, self._scope_index(span.instrumentation_scope, scopes), self._resource)
                     for span in spans]
            try:
                self._pending.append(pool.submit(_child_export, scopes, batch))
            except (BrokenProcessPool, RuntimeError) as exc:
                self._broken(exc)
                return SpanExportResult.FAILURE
            ok = True
            while len(self._pending) > self._in_flight:
                ok = self._wait(self._pending.popleft(), _WAIT_S) and ok
            return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def _scope_index(self, scope: InstrumentationScope | None, new: list[Flat]) -> int:
        """Scopes go to the child once each; spans name theirs by index."""
        index = self._scopes.get(scope)
        if index is None:
            index = self._scopes[scope] = len(self._scopes)
            new.append((index, None) if scope is None else (index, scope.name, scope.version, scope.schema_url,
                                                            dict(scope.attributes or {})))
        return index

    def _wait(self, future: Future[bool], timeout: float) -> bool:
        try:
            return future.result(timeout)
        except BrokenProcessPool as exc:
            self._broken(exc)
        except FutureTimeout:
            log.warning("a span batch took over %.0f s to export; not waiting for it", timeout)
        except Exception:  # the child's own failure: logged, the next batch goes on
            log.exception("span export failed in the export process")
        return False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            ok = self._in_process.force_flush(timeout_millis) if self._in_process is not None else True
            while self._pending:
                ok = self._wait(self._pending.popleft(), max(0.0, deadline - time.monotonic())) and ok
            return ok

    def shutdown(self) -> None:
        self.force_flush()
        with self._lock:
            self._closed = True
            if self._in_process is not None:
                self._in_process.shutdown()
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None


def _flatten(span: ReadableSpan, scope: int, resource: Resource) -> Flat:
    """The span as plain values; its resource only when it is not the provider's (sent once)."""
    ctx, parent, status = span.context, span.parent, span.status
    return (
        span.name, ctx.trace_id, ctx.span_id, ctx.trace_flags, tuple(ctx.trace_state.items()) if ctx.trace_state else (),
        (parent.span_id, parent.is_remote, parent.trace_flags) if parent is not None else None,
        span.kind.value, span.start_time, span.end_time, dict(span.attributes or {}),
        [(e.name, e.timestamp, dict(e.attributes or {})) for e in span.events],
        [(link.context.trace_id, link.context.span_id, link.context.is_remote, link.context.trace_flags,
          dict(link.attributes or {})) for link in span.links],
        status.status_code.value, status.description, scope,
        (span.dropped_attributes, span.dropped_events, span.dropped_links),
        None if span.resource is resource else (dict(span.resource.attributes), span.resource.schema_url),
    )


# --- the child process ------------------------------------------------------------------------------

_child: dict[str, Any] = {}


def _child_init(env: dict[str, str], resource_attributes: dict[str, Any], schema_url: str) -> None:
    from .setup import span_exporter

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; the parent flushes us
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="ragtoll-export-parent",
                     daemon=True).start()
    _child["exporter"] = span_exporter(env)
    _child["resource"] = Resource(resource_attributes, schema_url)
    _child["scopes"] = {}


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:  # a dead parent's children are handed to another process
        time.sleep(1.0)
    os._exit(0)


def _child_export(scopes: list[Flat], batch: list[Flat]) -> bool:
    known: dict[int, InstrumentationScope | None] = _child["scopes"]
    for index, *fields in scopes:
        known[index] = None if fields == [None] else InstrumentationScope(*fields)
    exporter = _child["exporter"]
    if exporter is None:
        return True  # no exporter configured: nothing to send (the parent would not have started us)
    result = exporter.export([_rebuild(flat, _child["resource"], known) for flat in batch])
    return bool(result is SpanExportResult.SUCCESS)


def _rebuild(flat: Flat, resource: Resource, scopes: Mapping[int, InstrumentationScope | None]) -> ReadableSpan:
    (name, trace_id, span_id, flags, state, parent, kind, start, end, attributes, events, links, code,
     description, scope, (dropped_attributes, dropped_events, dropped_links), own_resource) = flat
    attrs: Mapping[str, Any] = attributes
    if dropped_attributes:
        attrs = BoundedAttributes(attributes=attributes, immutable=True)
        attrs.dropped = dropped_attributes
    event_list: Sequence[Event] = [Event(n, a, timestamp=t) for n, t, a in events]
    if dropped_events:
        event_list = BoundedList.from_seq(None, event_list)
        event_list.dropped = dropped_events
    link_list: Sequence[Link] = [Link(SpanContext(t, s, r, TraceFlags(f)), a) for t, s, r, f, a in links]
    if dropped_links:
        link_list = BoundedList.from_seq(None, link_list)
        link_list.dropped = dropped_links
    return ReadableSpan(
        name=name,
        context=SpanContext(trace_id, span_id, False, TraceFlags(flags), TraceState(list(state)) if state else None),
        parent=SpanContext(trace_id, parent[0], parent[1], TraceFlags(parent[2])) if parent is not None else None,
        resource=resource if own_resource is None else Resource(*own_resource), attributes=attrs, events=event_list, links=link_list, kind=SpanKind(kind),
        status=Status(StatusCode(code), description), start_time=start, end_time=end,
        instrumentation_scope=scopes.get(scope),
    )
