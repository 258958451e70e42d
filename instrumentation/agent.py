"""The agent-side hook: an unchanged agent run as `opentelemetry-instrument python agent.py` sends
ragtoll's task context (`traceparent` + baggage) on every httpx/requests call.

`post_instrument` is the `opentelemetry_post_instrument` entry point, run after the standard
instrumentors (not a distro or configurator, so the user's own stay in charge). Needs only the
OpenTelemetry API; imports nothing of the proxy.
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import os
import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

import xxhash
from opentelemetry import baggage as otel_baggage
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from . import agent_exit
from . import semconv as sc

ENV_TASK_ID = "RAGTOLL_TASK_ID"
ENV_PROFILE = "RAGTOLL_BUDGET_PROFILE"
ENV_LIMIT_PREFIX = "RAGTOLL_BUDGET_"  # RAGTOLL_BUDGET_MAX_STEPS=4 -> ragtoll.budget.max_steps=4
ENV_TASK_ROOT = "RAGTOLL_TASK_ROOT"  # "process": one task root span (one trace, one task) per process
ENV_DISABLED = "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"  # "ragtoll" (or "*") turns the hook off
BAGGAGE_TASK_ID = "ragtoll.task.id"  # the proxy's identify stage reads this member
BAGGAGE_PROFILE = sc.PROFILE  # "ragtoll.budget.profile"
TRACER_NAME = "ragtoll.instrumentation.agent"

# The dimensions the proxy accepts (semconv.DIMENSIONS), checked here so a typo is reported in the
# agent's own stderr instead of silently ignored by the proxy.
DIMENSIONS = sc.DIMENSIONS
# RAGTOLL_BUDGET_* names that are not limits (the operator's signing key must never become baggage).
_NOT_LIMITS = frozenset({"PROFILE", "HMAC_KEY", "SIG", "EXP"})
# A signed grant (proxy/core/signing.py `sign_budget`) handed to the agent as RAGTOLL_BUDGET_SIG/_EXP
# next to the limits it raises; sent as is, verified by the proxy.
_SIGNED = {"SIG": re.compile(r"^[A-Za-z0-9_-]{43}={0,1}$"), "EXP": re.compile(r"^[0-9]{1,12}$")}
_TASK_ID = re.compile(r"^[A-Za-z0-9._:~@/+=-]{1,128}$")
_PROFILE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_NUMBER = re.compile(r"^[0-9]{1,15}(\.[0-9]{1,12})?$")

_log = logging.getLogger("ragtoll.agent")


@dataclass(frozen=True)
class AgentSettings:
    """What the environment asks the agent to send. Pure data (see `settings_from_env`)."""

    members: tuple[tuple[str, str], ...] = ()  # ragtoll baggage members, sent on every call
    parent: SpanContext | None = None  # from the TRACEPARENT env carrier
    carried_baggage: tuple[tuple[str, str], ...] = ()  # other members of the BAGGAGE env carrier
    task_root: bool = False
    warnings: tuple[str, ...] = ()

    def member(self, key: str) -> str | None:
        return dict(self.members).get(key)


def settings_from_env(env: Mapping[str, str]) -> AgentSettings:
    """Reads RAGTOLL_TASK_ID, RAGTOLL_BUDGET_*, RAGTOLL_TASK_ROOT and the TRACEPARENT/BAGGAGE carriers.

    Precedence for a ragtoll member: the RAGTOLL_* variable, then the same member in BAGGAGE. A bad
    value is dropped with a warning (the call still goes out, the proxy applies its policy).
    """
    warnings: list[str] = []
    members: dict[str, str] = {}
    carried: list[tuple[str, str]] = []
    carrier = W3CBaggagePropagator().extract({"baggage": env.get("BAGGAGE", "")})
    for key, value in otel_baggage.get_all(carrier).items():
        if key.startswith("ragtoll."):
            members[key] = str(value)
        else:
            carried.append((key, str(value)))

    task_id = env.get(ENV_TASK_ID, "").strip()
    if task_id:
        if _TASK_ID.match(task_id):
            members[BAGGAGE_TASK_ID] = task_id
        else:
            warnings.append(f"{ENV_TASK_ID} ignored: expected 1-128 characters of [A-Za-z0-9._:~@/+=-]")
    profile = env.get(ENV_PROFILE, "").strip()
    if profile:
        if _PROFILE.match(profile):
            members[BAGGAGE_PROFILE] = profile
        else:
            warnings.append(f"{ENV_PROFILE}={profile[:64]!r} ignored: not a profile name")
    for suffix, shape in _SIGNED.items():
        value = env.get(ENV_LIMIT_PREFIX + suffix, "").strip()
        if value and shape.match(value):
            members[f"ragtoll.budget.{suffix.lower()}"] = value
        elif value:
            warnings.append(f"{ENV_LIMIT_PREFIX}{suffix} ignored: not the shape sign_budget produces")
    for name in sorted(env):
        if not name.startswith(ENV_LIMIT_PREFIX) or name[len(ENV_LIMIT_PREFIX):] in _NOT_LIMITS:
            continue
        dimension = name[len(ENV_LIMIT_PREFIX):].lower()
        if "__" in dimension:
            continue  # a server config override (RAGTOLL_BUDGETS__...), not ours
        value = env[name].strip()
        if dimension not in DIMENSIONS:
            warnings.append(f"{name} ignored: not a budget dimension (one of {', '.join(DIMENSIONS)})")
        elif not _NUMBER.match(value) or (dimension != "max_cost_usd" and "." in value):
            kind = "a number >= 0" if dimension == "max_cost_usd" else "an integer >= 0"
            warnings.append(f"{name}={value[:32]!r} ignored: expected {kind}")
        else:
            members[f"ragtoll.budget.{dimension}"] = value

    parent = trace.get_current_span(
        TraceContextTextMapPropagator().extract(
            {"traceparent": env.get("TRACEPARENT", ""), "tracestate": env.get("TRACESTATE", "")}
        )
    ).get_span_context()
    if env.get("TRACEPARENT") and not parent.is_valid:
        warnings.append("TRACEPARENT ignored: not a valid W3C traceparent")
    root = env.get(ENV_TASK_ROOT, "").strip().lower()
    if root not in ("", "process", "none"):
        warnings.append(f"{ENV_TASK_ROOT}={root[:32]!r} ignored: expected 'process' or 'none'")
    return AgentSettings(
        members=tuple(members.items()),
        parent=parent if parent.is_valid else None,
        carried_baggage=tuple(carried),
        task_root=root == "process",
        warnings=tuple(warnings),
    )


def merge_baggage(header: str | None, members: tuple[tuple[str, str], ...]) -> str:
    """`header` with every member whose key it lacks appended; members already there win."""
    present = set()
    for item in (header or "").split(","):
        key = item.split(";", 1)[0].partition("=")[0].strip()
        if key:
            present.add(unquote(key))
    extra = [f"{key}={quote(value, safe='')}" for key, value in members if key not in present]
    return ",".join(p for p in [header or "", *extra] if p)


class RagtollPropagator(TextMapPropagator):
    """Wraps the global propagator: whatever it injects, plus ragtoll's members and a traceparent.

    Context attached in the main thread is invisible to threads that never inherited it; the
    members live here instead, so every inject on every thread carries them. `fallback` is the
    process-level span context, used when the current context has no valid span (no SDK, or a
    thread that never saw the task root).
    """

    def __init__(self, inner: TextMapPropagator, members: tuple[tuple[str, str], ...],
                 fallback: SpanContext | None = None) -> None:
        self.inner = inner
        self.members = members
        self.fallback = fallback
        self._tracecontext = TraceContextTextMapPropagator()

    def inject(self, carrier: CarrierT, context: otel_context.Context | None = None,
               setter: Setter[CarrierT] = default_setter) -> None:
        staged: dict[str, str] = {}  # read back what the inner propagators wrote
        self.inner.inject(staged, context)
        if "traceparent" not in staged:
            if trace.get_current_span(context).get_span_context().is_valid:
                self._tracecontext.inject(staged, context)
            elif self.fallback is not None:
                self._tracecontext.inject(staged, trace.set_span_in_context(NonRecordingSpan(self.fallback)))
        if self.members:
            staged["baggage"] = merge_baggage(staged.get("baggage"), self.members)
        for key, value in staged.items():
            setter.set(carrier, key, value)

    def extract(self, carrier: CarrierT, context: otel_context.Context | None = None,
                getter: Getter[CarrierT] = default_getter) -> otel_context.Context:
        return self.inner.extract(carrier, context, getter)

    @property
    def fields(self) -> set[str]:
        return set(self.inner.fields) | {"traceparent", "baggage"}


@dataclass
class AgentHook:
    """What `install` changed, so it can be undone (`uninstall`, for tests and embedding)."""

    settings: AgentSettings
    propagator: RagtollPropagator
    previous_propagator: TextMapPropagator
    root_span: Any = None
    token: Any = None
    swapped_var: Any = None
    _ended: bool = field(default=False, repr=False)

    @property
    def task_id(self) -> str | None:
        return dict(self.propagator.members).get(BAGGAGE_TASK_ID)

    def end_root(self) -> None:
        if self.root_span is not None and not self._ended:
            self._ended = True
            self.root_span.end()

    def uninstall(self) -> None:
        self.end_root()
        atexit.unregister(self.end_root)
        if self.swapped_var is not None:
            otel_context._RUNTIME_CONTEXT._current_context = self.swapped_var  # type: ignore[attr-defined]
        elif self.token is not None:
            otel_context.detach(self.token)
        propagate.set_global_textmap(self.previous_propagator)


def install(
    env: Mapping[str, str] | None = None, tracer_provider: trace.TracerProvider | None = None
) -> AgentHook:
    """Makes every later inject carry ragtoll's task context read from `env` (default os.environ).

    When the environment names a task (RAGTOLL_TASK_ID, TRACEPARENT, BAGGAGE ragtoll.task.id or
    RAGTOLL_TASK_ROOT=process) the process gets one span context that every thread and task starts
    from: the TRACEPARENT parent, else the task's virtual root (the span id the proxy derives from
    the task id, so the agent's spans hang under the proxy's `ragtoll.task` span, the trace's one
    root); and the task id is pinned in baggage (RAGTOLL_TASK_ID, else the trace id, which is the
    id the proxy would derive from the traceparent). RAGTOLL_TASK_ROOT=process with neither names a
    new task by a fresh trace id, and records the process as a `task <script>` span under the root.
    """
    env = os.environ if env is None else env
    settings = settings_from_env(env)
    for warning in settings.warnings:
        _log.warning("ragtoll: %s", warning)
    members = dict(settings.members)
    ctx = otel_context.get_current()
    root_span = None
    process_span: SpanContext | None = settings.parent
    if process_span is None and BAGGAGE_TASK_ID in members:
        process_span = _virtual_root(members[BAGGAGE_TASK_ID])
    if process_span is None and settings.task_root:
        # A new task, named by its trace id (as the proxy names a traceparent task). The proxy
        # records its `ragtoll.task` span under the id it derives for that name and with no parent,
        # so the process span below must hang under it: a process span of its own as the root would
        # make the trace two-rooted (the task's calls arrive as baggage-named, not as children).
        trace_id = int.from_bytes(secrets.token_bytes(16), "big") or 1
        members[BAGGAGE_TASK_ID] = f"{trace_id:032x}"
        process_span = _virtual_root(members[BAGGAGE_TASK_ID], trace_id)
    if process_span is not None:
        ctx = trace.set_span_in_context(NonRecordingSpan(process_span), ctx)
    if settings.task_root:
        tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(TRACER_NAME)
        root_span = tracer.start_span(_root_name(), context=ctx, kind=trace.SpanKind.INTERNAL)
        if root_span.get_span_context().is_valid:
            process_span = root_span.get_span_context()
            ctx = trace.set_span_in_context(root_span, ctx)
        else:  # no SDK configured: the calls still carry the task's root
            root_span = None
    if process_span is not None:
        members.setdefault(BAGGAGE_TASK_ID, f"{process_span.trace_id:032x}")
        if root_span is not None:
            root_span.set_attribute(sc.TASK_ID, members[BAGGAGE_TASK_ID])
    for key, value in (*settings.carried_baggage, *members.items()):
        ctx = otel_baggage.set_baggage(key, value, ctx)
    propagator = RagtollPropagator(propagate.get_global_textmap(), tuple(members.items()), process_span)
    hook = AgentHook(settings, propagator, propagate.get_global_textmap(), root_span)
    propagate.set_global_textmap(propagator)
    if process_span is not None or settings.carried_baggage:
        hook.swapped_var = _set_process_default(ctx)
        if hook.swapped_var is None:
            hook.token = otel_context.attach(ctx)  # this thread and the tasks it starts only
    if settings.task_root:
        # child processes (also run under opentelemetry-instrument) join this task
        os.environ["TRACEPARENT"] = _traceparent(process_span)  # type: ignore[arg-type]
        os.environ["BAGGAGE"] = merge_baggage(None, (*settings.carried_baggage, *members.items()))
        os.environ.pop(ENV_TASK_ROOT, None)
        atexit.register(hook.end_root)  # registered after the SDK's shutdown hook, so it runs first
    return hook


def post_instrument() -> None:
    """The `opentelemetry_post_instrument` entry point. Never raises: a failing hook must not stop
    the agent (the loader would skip the remaining hooks)."""
    disabled = {x.strip() for x in os.environ.get(ENV_DISABLED, "").split(",")}
    if "ragtoll" in disabled or "*" in disabled:
        return
    try:
        agent_exit.register()  # before install(): its task root span must end before the last export
        install()
    # failsafe: the agent runs without ragtoll's context rather than not at all
    except Exception:  # noqa: BLE001
        _log.exception("ragtoll: agent hook failed; calls go out without ragtoll task context")


def _set_process_default(ctx: otel_context.Context) -> contextvars.ContextVar[Any] | None:
    """Makes `ctx` what every thread sees until it attaches its own context.

    contextvars start empty in each new thread, so an attach() here would reach only this thread
    and the asyncio tasks it creates. OTel keeps the current context in one ContextVar; giving it
    a new one whose *default* is `ctx` reaches every thread. Done only while nothing is attached
    (no outstanding token can be orphaned); returns the old var, or None when the runtime context
    is not the stock contextvars one (then the caller falls back to attach()).
    """
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    old = getattr(runtime, "_current_context", None)
    if not isinstance(old, contextvars.ContextVar):
        return None
    try:
        default = old.get()
    except LookupError:
        return None
    if old.get(None) is not None or len(default) != 0:  # something already attached: leave it
        return None
    runtime._current_context = contextvars.ContextVar("current_context", default=ctx)  # type: ignore[union-attr]
    return old


def _root_name() -> str:
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c", "-m") else "python"
    return f"task {script}"


def _virtual_root(task_id: str, trace_id: int | None = None) -> SpanContext:
    """The ids proxy/request/pipeline.py parents a named task's calls on, and the proxy's `ragtoll.task`
    span takes (proxy/request/identify.py `derived_trace_id`/`derived_span_id`;
    tests/instrumentation/test_agent.py keeps them equal). `trace_id`: the trace the calls carry,
    when not the one derived from the name. Spelled out here so the agent side imports nothing of
    the proxy."""
    data = task_id.encode()
    if trace_id is None:
        trace_id = xxhash.xxh3_128_intdigest(b"ragtoll.task:" + data) or 1
    span_id = xxhash.xxh3_64_intdigest(b"ragtoll.task.root:" + data) or 1
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _traceparent(span: SpanContext) -> str:
    return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"
