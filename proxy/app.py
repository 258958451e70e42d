"""The ASGI application: proxied prefixes go to the pipeline, everything else to Starlette.

Pure ASGI on the hot path (no BaseHTTPMiddleware, which breaks contextvars and so OTel context).
Clients and stores are made in the lifespan and passed down; `build_app` reads no environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any

from opentelemetry import metrics, trace
from ragtoll.instrumentation import semconv as sc
from ragtoll.instrumentation.metrics import Metrics, PrometheusReader, render_prometheus
from ragtoll.instrumentation.task_span import emit_task_span, root_sampled
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from . import __version__
from .config import Settings
from .core import tokens
from .errors import NotFound, ShuttingDown, render
from .request.caller import CallerResolver
from .request.conversation import Conversations
from .request.exchange import Exchange, Stage
from .request.identify import Identifier, derived_span_id
from .request.pipeline import Pipeline, Receive, RefusalSpans, Scope, Send
from .request.routing import Router
from .request.upstream import UpstreamClient
from .secrets import budget_hmac_key, environment
from .stages.budget import BudgetStage, breaker_for
from .stages.cache import CacheStage, evidence_cache
from .stages.context import ContextStage
from .stages.evidence import EvidenceStage
from .stages.outcome import OutcomeStage
from .stages.principal import PrincipalStage
from .stages.span import SpanStage
from .stores import Stores, open_stores
from .stores.conversations import open_conversation_store
from .stores.principals import local_principal_store, open_principal_store
from .tasks.admin import AdminApi
from .tasks.records import END_CALL, TaskEnder, open_sink

TRACER_NAME = "ragtoll.proxy"
log = logging.getLogger("ragtoll")


def build_stages(settings: Settings, *, stores: Stores, cache: CacheStage | None, env: Mapping[str, str],
                 ender: TaskEnder, principal: Stage | None = None) -> list[Stage]:
    """The ordered stage list (DESIGN.md), each stage's one-line contract (its `contract` names the
    exchange fields; `Pipeline` checks the order serves them):

    cache      reads the caller and the parsed call; proposes a hit, files a miss's evidence
    context    rewrites an LLM call's body to cost less (prompt cache key or breakpoints, evidence once)
    principal  reads the caller; refuses a principal past its limits; charges it the call's settlement
    budget     reads the task, the call and the proposal; reserves (or refuses), holds a stream, settles
    evidence   reads the budget's new-chunk count and the answer; x-ragtoll-evidence, the landfill
    span       reads the call and the answer; writes what the call really was on its span
    outcome    reads the task's baggage; records a signed verdict

    `on_end` runs in reverse order, so the principal charges what the budget settled."""
    stages: list[Stage] = [cache] if cache is not None else []
    if settings.context.enabled:
        stages.append(ContextStage(settings))
    if settings.budgets.enabled and principal is not None:
        stages.append(principal)
    if settings.budgets.enabled:
        stages.append(BudgetStage(settings, breaker_for(settings, stores.budget), hmac_key=budget_hmac_key(settings, env)))
    stages.append(EvidenceStage())
    stages.append(SpanStage(settings))
    stages.append(OutcomeStage(ender.record_outcome, settings.store_timeout_ms / 1000,
                               hmac_key=budget_hmac_key(settings, env)))
    return stages


class RagtollApp:
    def __init__(
        self,
        settings: Settings,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        prometheus: PrometheusReader | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.env = environment(env)
        self.prometheus = prometheus
        self.tracer_provider = tracer_provider or trace.get_tracer_provider()
        self.meter_provider = meter_provider or metrics.get_meter_provider()
        self.tracer = self.tracer_provider.get_tracer(TRACER_NAME, __version__)
        self.refusals = RefusalSpans(self.tracer)  # one bound for the pipeline's refusals and the 404s
        self.router = Router(settings.upstreams)
        self.identifier = Identifier(settings.tasks)
        # identity config (a JWT secret, a JWKS file) is checked here: a bad one stops start-up
        self.callers = CallerResolver(settings.identity, self.env, anonymous=settings.principals.anonymous)
        budget_hmac_key(settings, self.env)  # a weak or unreadable key stops start-up too
        self.pipeline: Pipeline | None = None
        self.stores: Stores | None = None
        self.on_started: Callable[[], None] | None = None  # called once the lifespan has started
        self.draining = False  # set on SIGTERM: new calls are refused while the ones in flight finish
        self.in_flight = 0
        self._idle = asyncio.Event()  # set while no call is in flight
        self._idle.set()
        self.admin = AdminApi(settings, env=self.env)
        self.metrics = Metrics(self.meter_provider, upstreams=[u.name for u in settings.upstreams],
                               profiles=list(settings.budgets.profiles), version=__version__)
        self.cache: CacheStage | None = None  # the cache stage while serving (its lifespan)
        self.warmed = False  # the store answered and its scripts are loaded (`/readyz` waits for it)
        self.ender: TaskEnder | None = None  # ends tasks while serving (its lifespan)
        self.starlette = Starlette(
            routes=[
                HttpRoute("/healthz", self.healthz, methods=["GET", "HEAD"]),
                HttpRoute("/readyz", self.readyz, methods=["GET", "HEAD"]),
                HttpRoute("/metrics", self.metrics_text, methods=["GET"]),
                *self.admin.routes(),
                HttpRoute("/{path:path}", self.not_found,
                          methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
            ],
            lifespan=self.lifespan,
            # paths the catch-all cannot match (raw control characters) still get a JSON 404
            exception_handlers={404: self.not_found, 405: self.not_found},
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        """Every resource is made here, once, and passed down: the upstream client (the forwarder's
        and the cache's), the stores (one store client for budgets, cache and audit), the stages."""
        client = UpstreamClient(self.settings.upstreams)
        stores = self.stores = open_stores(self.settings)
        self.warmed = False
        # Build the token encodings now, not on the first LLM call (about 0.3 s).
        await asyncio.get_running_loop().run_in_executor(None, tokens.warm)
        budgets = self.settings.budgets
        ender = TaskEnder(stores.budget, open_sink(stores.budget, budgets.records_file,
                                                   max_bytes=budgets.records_max_bytes, keep=budgets.records_keep),
                          self.settings.tasks.idle_timeout_s)
        self.cache = CacheStage(self.settings, evidence_cache(self.settings, stores.evidence, client), client,
                                tracer_provider=self.tracer_provider, meter_provider=self.meter_provider) \
            if self.settings.cache.enabled else None
        principals = open_principal_store(self.settings, stores.budget)
        principal = PrincipalStage(self.settings, principals, fallback=local_principal_store(self.settings)) \
            if principals is not None else None
        stages = build_stages(self.settings, stores=stores, cache=self.cache, env=self.env, ender=ender,
                              principal=principal)
        conversations = None
        if self.settings.tasks.untracked == "conversation":
            # a link outlives its task's idle timeout a little: a slow agent's next call still finds it
            store = open_conversation_store(self.settings.store, stores.budget, self.settings.tasks.idle_timeout_s * 2)
            conversations = Conversations(store, self.settings.store_timeout_ms / 1000)
        budget = next((s for s in stages if isinstance(s, BudgetStage)), None)
        if self.cache is not None and budget is not None:
            self.cache.wait_allowance = budget.wait_allowance  # a duplicate never waits past its deadline
        self.pipeline = Pipeline(self.settings, self.router, client, stages, self.identifier, self.callers,
                                 self.tracer, on_end=self._record_call, root_sampled=root_sampled(self.tracer_provider),
                                 conversations=conversations, refusals=self.refusals,
                                 end_task=self._end_per_call_task)
        ender.listeners.extend(s.annotate for s in stages if isinstance(s, (ContextStage, EvidenceStage)))  # before the span
        ender.listeners.append(self._task_ended)
        ender.on_lost = self.metrics.record_records_lost
        task_stages = [s for s in stages if type(s).on_task_end is not Stage.on_task_end]
        ender.listeners.append(lambda record: _forget(task_stages, str(record.get("task_id"))))
        self.admin.ender = self.ender = ender
        if self.cache is not None:
            self.admin.set_source_version = self.cache.set_source_version
        # Everything made so far (modules, encodings, config) lives as long as the process: keep it
        # out of the garbage collector's full passes, which otherwise grow with it.
        gc.freeze()
        sweeper = asyncio.get_running_loop().create_task(_sweep(ender, self.settings.tasks.idle_timeout_s))
        warmer = asyncio.get_running_loop().create_task(self._warm(stores))
        if self.on_started is not None:
            self.on_started()
        try:
            yield
        finally:
            self.draining = True
            for background in (sweeper, warmer):
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
            # Calls in flight finish (up to the grace period) before their stores and client close;
            # then the tasks this process holds end (records, task spans) or are handed over.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.server.shutdown_grace_s):
                    await self._idle.wait()
            try:
                await ender.shutdown()
            except Exception:
                log.exception("tasks not ended at shutdown")
            if principal is not None:
                await principal.drain()  # the ended tasks' releases, before the store closes
            self.pipeline = None
            self.admin.ender = self.ender = None
            self.admin.set_source_version = None
            if self.cache is not None:
                await self.cache.aclose()
            self.cache = None
            await client.aclose()
            self.stores = None
            await stores.aclose()

    async def _warm(self, stores: Stores) -> None:
        """Warm the store (connections, scripts) until it answers; then this replica may say ready.
        In the background: a store that is away keeps `/readyz` at 503, never the process from starting."""
        delay = 0.05
        while True:
            try:
                async with asyncio.timeout(max(1.0, self.settings.store_timeout_ms / 1000 * 4)):
                    await stores.budget.warm()
            except Exception as exc:  # noqa: BLE001 - not ready yet: again, a little later
                log.info("store not ready yet: %s", type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            self.warmed = True
            return

    def drain(self) -> None:
        """SIGTERM: refuse new calls (503, `shutting_down`); the lifespan's end waits for the rest."""
        self.draining = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.pipeline is not None:
            if scope["method"] == "CONNECT":
                await _json(send, 405, render(NotFound("CONNECT is not supported: ragtoll is not an open proxy")))
                return
            route = self.router.match(scope["path"])
            if route is not None:
                if self.draining:
                    await _json(send, 503, render(ShuttingDown("ragtoll is shutting down; retry on another replica")),
                                [(b"connection", b"close")])
                    return
                self.in_flight += 1
                self._idle.clear()
                try:
                    await self.pipeline.handle(route, scope, receive, send)
                finally:
                    self.in_flight -= 1
                    if not self.in_flight:
                        self._idle.set()
                return
        await self.starlette(scope, receive, send)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    async def readyz(self, request: Request) -> Response:
        if self.pipeline is None or self.stores is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        if self.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        store = "memory" if self.settings.store == "memory" else self.settings.store.partition("://")[0]
        if not self.warmed:  # connections and scripts not ready: a burst now would time out on them
            return JSONResponse({"status": "warming", "store": store}, status_code=503)
        try:
            async with asyncio.timeout(self.settings.store_timeout_ms / 1000):
                await self.stores.budget.ping()
        except Exception as exc:  # noqa: BLE001 - any store failure means not ready
            return JSONResponse({"status": "store_unavailable", "store": store, "error": type(exc).__name__},
                                status_code=503)
        return JSONResponse({"status": "ready", "store": store})

    async def metrics_text(self, request: Request) -> Response:
        if self.prometheus is None:
            return Response(render(NotFound("Prometheus metrics are not enabled (ragtoll serve enables them)")),
                            status_code=404, media_type="application/json")
        body, content_type = render_prometheus(self.prometheus, request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    async def _end_per_call_task(self, ex: Exchange) -> None:
        """A per-call task's call is settled: the task ends now, and its summary goes on the call's
        span, the trace's root (the pipeline's `end_task` hook; only per-call tasks reach it)."""
        if self.ender is None or ex.task is None:
            return
        record = await self.ender.end_with_call(ex.task.id)
        if record is not None and ex.span.is_recording():
            ex.span.set_attributes(_task_attributes(record, on_call_span=getattr(ex.span, "attributes", None) or {}))

    def _record_call(self, ex: Exchange) -> None:
        """Metrics of one finished call (the pipeline's failsafe end hook)."""
        adm = ex.admission
        usage = ex.observation.usage
        cache = ex.cache
        hit = cache is not None and cache.result == "hit" and ex.proposal is not None
        self.metrics.record_call(
            operation=ex.call.operation, provider=ex.route.upstream.api, upstream=ex.route.upstream.name,
            kind=ex.route.upstream.kind, outcome="cache_hit" if hit and ex.outcome == "ok" else ex.outcome,
            duration_s=time.perf_counter() - ex.started, upstream_s=ex.upstream_seconds,
            request_model=ex.call.model, response_model=ex.observation.response_model,
            input_tokens=usage.input_tokens if usage else None, output_tokens=usage.output_tokens if usage else None,
            cost_usd=ex.settlement.cost_usd if ex.settlement else None,
            error_type=ex.error.code if ex.error is not None else None,
            rejected_dimension=adm.dimension if adm and (not adm.admitted or adm.shadow) else
            _principal_dimension(ex),
            budget_mode=("shadow" if adm.shadow else "enforce") if adm else None,
            cache_result=cache.result if cache else None, cache_tier=cache.tier if cache else None,
        )
        if ex.degraded_bound is not None:
            self.metrics.record_degraded_admission(ex.degraded_bound)

    def _task_ended(self, record: dict[str, Any]) -> None:
        """A task ended: its `ragtoll.task` summary span (in the task's trace) and task metrics."""
        evidence = record.get("evidence") or {}
        self.metrics.record_task_end(cost_usd=record["cost_usd"], calls=record["calls"], profile=record["profile"],
                                     exceeded=bool(record["exhausted"]), reason=record["end_reason"],
                                     groundedness=record.get("groundedness"),
                                     input_tokens=record["context_tokens"],  # the ledger's: every replica's calls
                                     cached_input_tokens=record["cached_input_tokens"],
                                     evidence_tokens=evidence.get("prompt_tokens"),
                                     evidence_resent_tokens=evidence.get("resent_tokens"))
        if not record.get("trace_id") or not record.get("started_at"):
            return
        if record.get("end_reason") == END_CALL:
            # a per-call task ended with its call: its summary is on that call's span
            # (`_end_per_call_task`); one whose end at its call failed (the store did not answer)
            # is ended later by the sweep, and gets its own span
            return
        task_id = record["task_id"]
        named_by_caller = record.get("task_source") == "traceparent"
        attrs = _task_attributes(record, on_call_span=None)
        emit_task_span(
            self.tracer_provider, task_id, int(record["trace_id"], 16),
            None if named_by_caller else derived_span_id(task_id),
            _epoch_ns(record["started_at"]), _epoch_ns(record["ended_at"]) if record.get("ended_at") else time.time_ns(),
            attrs, error=f"budget exceeded: {record['exhausted']}" if record["exhausted"] else None,
        )

    async def not_found(self, request: Request, _exc: Exception | None = None) -> Response:
        error = self.router.not_found(request.url.path)
        self.refusals.record(request.scope, None, error)  # no upstream: no call span
        return Response(render(error), status_code=error.status, media_type="application/json")


# a task total and the budget dimension whose `used` counts the same (on a one-call task's call span)
_TOTAL_DIMENSIONS = {"steps": "max_steps", "retrieval_calls": "max_retrieval_calls",
                     "unique_queries": "max_unique_queries", "rerank_calls": "max_rerank_calls",
                     "context_tokens": "max_context_tokens", "completion_tokens": "max_completion_tokens",
                     "stalled_retrievals": "max_stalled_retrievals"}


def _task_attributes(record: Mapping[str, Any], *, on_call_span: Mapping[str, Any] | None) -> dict[str, Any]:
    """The task summary's attributes, from its record. `on_call_span`: the attributes of the call span
    a per-call task's summary goes on; what that span already says is left out (the id, the source,
    the one call, and each total its budget's `ragtoll.budget.<dim>.used` already counts)."""
    span = on_call_span if on_call_span is not None else {}
    attrs: dict[str, Any] = {} if on_call_span is not None else {
        sc.TASK_SOURCE: record.get("task_source") or "", sc.TASK_CALLS: record["calls"]}
    attrs.update({sc.PROFILE: record["profile"] or "", sc.COST_USD: record["cost_usd"],
                  sc.BUDGET_EXCEEDED: bool(record["exhausted"]), sc.TASK_END_REASON: record["end_reason"]})
    for key in sc.TASK_TOTALS:
        dim = _TOTAL_DIMENSIONS.get(key)
        if isinstance(record.get(key), int) and (dim is None or span.get(sc.budget_used(dim)) != record[key]):
            attrs[sc.task_total(key)] = record[key]
    for key, value in ((sc.TASK_CLASS, record.get("class")), (sc.TASK_ROUTE, record.get("route"))):
        if value:
            attrs[key] = value
    correct = (record.get("outcome") or {}).get("correct")
    if isinstance(correct, bool):
        attrs[sc.TASK_CORRECT] = correct
    if record.get("groundedness") is not None:
        attrs[sc.TASK_GROUNDEDNESS] = record["groundedness"]
    if record["exhausted"]:
        attrs[sc.BUDGET_EXCEEDED_DIMENSION] = record["exhausted"]
    return attrs


def _principal_dimension(ex: Exchange) -> str | None:
    """The principal limit that refused a call before the task's budget saw it (stages/principal.py)."""
    details = ex.error.details if ex.error is not None and ex.error.code == "budget_exceeded" else {}
    dim = details.get("dimension")
    return dim if isinstance(dim, str) and details.get("scope") == "principal" else None


def _forget(stages: list[Stage], task_id: str) -> None:
    for stage in stages:
        stage.on_task_end(task_id)


async def _sweep(ender: TaskEnder, idle_timeout_s: float) -> None:
    """End idle tasks (and write their records) every few seconds; a failing store only skips a round."""
    interval = max(0.05, min(5.0, idle_timeout_s / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            await ender.sweep()
        except Exception:  # noqa: BLE001, S112 - the store is down or slow: try again next round
            continue


def _epoch_ns(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1e9)  # Python 3.11 reads a trailing Z


async def _json(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


def build_app(
    settings: Settings,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    prometheus: PrometheusReader | None = None,
    env: Mapping[str, str] | None = None,
) -> Any:
    """The ASGI app for `settings`.

    Providers default to the global ones (`instrumentation.setup`). `prometheus` is the reader
    `GET /metrics` renders (it must be one of `meter_provider`'s readers). `env` is where secrets
    named by config (admin token, JWT secret, HMAC key) are read; default `os.environ`.
    """
    return RagtollApp(settings, tracer_provider=tracer_provider, meter_provider=meter_provider,
                      prometheus=prometheus, env=env)
