"""The `ragtoll.task` summary span, recorded into the task's own trace when the task ends.

For a task named by header, baggage or session the proxy parents every call's server span on a
virtual root whose ids it derives from the task id (proxy/request/pipeline.py `_parent_context`); the
summary span takes exactly those ids, so Jaeger shows one complete tree rooted at the task.

How the id is pinned: the SDK's Tracer draws trace and span ids from its public `id_generator`
attribute. Each tracer this module uses gets a `PinnedIdGenerator` that hands out the ids set in a
contextvar for the duration of one `start_span` and otherwise delegates to the original generator.
Unlike building an SDK `Span` by hand, spans still go through the provider's own sampler, limits,
resource and processors, and nothing private of the SDK is touched. Concurrent emits are
independent (each sets its own contextvar value).
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from . import semconv as sc

TRACER_NAME = "ragtoll.proxy"

# (trace_id or None, span_id or None) wanted by the emit running in this context
_PINNED: contextvars.ContextVar[tuple[int | None, int | None] | None] = contextvars.ContextVar(
    "ragtoll_pinned_ids", default=None
)


class PinnedIdGenerator(IdGenerator):
    """Delegates to `inner` except while an emit has pinned ids in this context."""

    def __init__(self, inner: IdGenerator) -> None:
        self.inner = inner

    def generate_span_id(self) -> int:
        pinned = _PINNED.get()
        if pinned is not None and pinned[1] is not None:
            return pinned[1]
        return self.inner.generate_span_id()

    def generate_trace_id(self) -> int:
        pinned = _PINNED.get()
        if pinned is not None and pinned[0] is not None:
            return pinned[0]
        return self.inner.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        # a derived trace id is not random (W3C trace-context level 2 "random" flag)
        if _PINNED.get() is not None:
            return False
        return self.inner.is_trace_id_random()


_tracers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _tracer(tracer_provider: trace.TracerProvider) -> tuple[trace.Tracer, bool]:
    """The provider's tracer for task spans, with a pinned id generator; False when the tracer
    cannot take one (not the SDK's), in which case ids are not pinned."""
    with _lock:
        found = _tracers.get(tracer_provider)
        if found is None:
            tracer = tracer_provider.get_tracer(TRACER_NAME)
            generator = getattr(tracer, "id_generator", None)
            pinned = isinstance(generator, IdGenerator)
            if isinstance(generator, IdGenerator):
                setattr(tracer, "id_generator", PinnedIdGenerator(generator))  # noqa: B010 - SDK Tracer attr
            found = (tracer, pinned)
            try:
                _tracers[tracer_provider] = found
            except TypeError:  # a provider that cannot be weakly referenced: no cache
                pass
        return found


def root_sampled(tracer_provider: trace.TracerProvider) -> Callable[[int], bool]:
    """Whether the provider's sampler keeps a root span of the trace `trace_id`: the sampling flag of a
    task's virtual root (proxy/request/pipeline.py). The task span is such a root, so with a trace-id
    ratio sampler (`OTEL_TRACES_SAMPLER=parentbased_traceidratio`) a task's calls and its summary are
    kept or dropped together, on every replica. A provider without a sampler (not the SDK's) keeps all."""
    sampler = getattr(tracer_provider, "sampler", None)
    if sampler is None:
        return lambda _trace_id: True
    no_parent = Context()  # not the caller's current context: the virtual root has no parent

    def sampled(trace_id: int) -> bool:
        return bool(sampler.should_sample(no_parent, trace_id, sc.TASK_SPAN).decision.is_sampled())

    return sampled


def emit_task_span(
    tracer_provider: trace.TracerProvider,
    task_id: str,
    trace_id: int,
    root_span_id: int | None,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any],
    *,
    parent_span_id: int | None = None,
    error: str | None = None,
) -> SpanContext:
    """Records the `ragtoll.task` span of one ended task; returns its span context.

    * Named tasks (header, baggage, session, per-call): `root_span_id` is the virtual root's id
      (`derived_span_id(task_id)`), `parent_span_id` None: the span is the trace's root and every
      call's server span is already its child.
    * Tasks named by a caller's traceparent: pass the caller's span as `parent_span_id`; the span
      is its child (`root_span_id` None lets the SDK choose, or pin one).
    `start_ns`/`end_ns` are epoch nanoseconds (first call start, task end). `error` marks the span
    failed (e.g. "budget exceeded: max_steps"). Sampling is the provider's: for a named task the
    span is a root, decided as `root_sampled` decided the calls' virtual root.
    """
    tracer, pinnable = _tracer(tracer_provider)
    ctx = None
    if parent_span_id is not None:
        parent = SpanContext(trace_id, parent_span_id, is_remote=True,
                             trace_flags=TraceFlags(TraceFlags.SAMPLED))
        ctx = trace.set_span_in_context(NonRecordingSpan(parent))
    attrs = {sc.TASK_ID: task_id, **attributes}
    token = _PINNED.set((trace_id if parent_span_id is None else None, root_span_id)) if pinnable else None
    try:
        span = tracer.start_span(sc.TASK_SPAN, context=ctx, kind=SpanKind.INTERNAL, attributes=attrs,
                                 start_time=start_ns)
    finally:
        if token is not None:
            _PINNED.reset(token)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error[:200]))
    span.end(end_time=max(end_ns, start_ns))
    return span.get_span_context()
