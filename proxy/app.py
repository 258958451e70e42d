"""The ASGI application: proxied prefixes go to the pipeline, everything else to Starlette.

Pure ASGI on the hot path (no BaseHTTPMiddleware, which breaks contextvars and so OTel context).
Clients and stores are made in the lifespan and passed down; `build_app` reads no environment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from opentelemetry import metrics, trace
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from . import __version__
from .admin import AdminApi
from .config import Settings
from .errors import NotFound, render
from .pipeline import Pipeline, Receive, Scope, Send, Stage
from .records import TaskEnder, open_sink
from .routing import Router
from .stages.budget import BudgetStage
from .stages.identify import Identifier
from .stages.settle import SettleStage
from .stores import Store, open_store
from .upstream import UpstreamClient

TRACER_NAME = "ragtoll.proxy"


def build_stages(settings: Settings, store: Store | None = None, meter: Any = None) -> list[Stage]:
    """The ordered stage list (DESIGN.md): evidence cache, then budget, then settle."""
    stages: list[Stage] = []
    if store is not None and settings.budgets.enabled:
        stages.append(BudgetStage(settings, store, meter=meter))
    stages.append(SettleStage(settings))
    return stages


class RagtollApp:
    def __init__(
        self,
        settings: Settings,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider or trace.get_tracer_provider()
        self.meter_provider = meter_provider or metrics.get_meter_provider()
        self.tracer = self.tracer_provider.get_tracer(TRACER_NAME, __version__)
        self.router = Router(settings.upstreams)
        self.identifier = Identifier(settings.tasks)
        self.pipeline: Pipeline | None = None
        self.store: Store | None = None
        self.admin = AdminApi(settings)
        self.starlette = Starlette(
            routes=[
                HttpRoute("/healthz", self.healthz, methods=["GET", "HEAD"]),
                HttpRoute("/readyz", self.readyz, methods=["GET", "HEAD"]),
                *self.admin.routes(),
                HttpRoute("/{path:path}", self.not_found,
                          methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]),
            ],
            lifespan=self.lifespan,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        client = UpstreamClient(
            self.settings.upstreams, tracer_provider=self.tracer_provider, meter_provider=self.meter_provider
        )
        store = open_store(self.settings)
        self.store = store
        meter = self.meter_provider.get_meter(TRACER_NAME, __version__)
        self.pipeline = Pipeline(
            self.settings, self.router, client, build_stages(self.settings, store, meter), self.identifier, self.tracer
        )
        ender = TaskEnder(store, open_sink(store, self.settings.budgets.records_file),
                          self.settings.tasks.idle_timeout_s)
        self.admin.ender = ender
        sweeper = asyncio.get_running_loop().create_task(_sweep(ender, self.settings.tasks.idle_timeout_s))
        try:
            yield
        finally:
            self.pipeline = None
            self.admin.ender = None
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await client.aclose()
            self.store = None
            await store.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.pipeline is not None:
            if scope["method"] == "CONNECT":
                await _json(send, 405, render(NotFound("CONNECT is not supported: ragtoll is not an open proxy")))
                return
            route = self.router.match(scope["path"])
            if route is not None:
                await self.pipeline.handle(route, scope, receive, send)
                return
        await self.starlette(scope, receive, send)

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "version": __version__})

    async def readyz(self, request: Request) -> Response:
        if self.pipeline is None or self.store is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        store = "memory" if self.settings.store == "memory" else self.settings.store.partition("://")[0]
        try:
            async with asyncio.timeout(self.settings.store_timeout_ms / 1000):
                await self.store.ping()
        except Exception as exc:  # noqa: BLE001 - any store failure means not ready
            return JSONResponse({"status": "store_unavailable", "store": store, "error": type(exc).__name__},
                                status_code=503)
        return JSONResponse({"status": "ready", "store": store})

    async def not_found(self, request: Request) -> Response:
        error = self.router.not_found(request.url.path)
        return Response(render(error), status_code=error.status, media_type="application/json")


async def _sweep(ender: TaskEnder, idle_timeout_s: float) -> None:
    """End idle tasks (and write their records) every few seconds; a failing store only skips a round."""
    interval = max(0.05, min(5.0, idle_timeout_s / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            await ender.sweep()
        except Exception:  # noqa: BLE001, S112 - the store is down or slow: try again next round
            continue


async def _json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def build_app(
    settings: Settings,
    *,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> Any:
    """The ASGI app for `settings`. Providers default to the global ones (`instrumentation.setup`)."""
    return RagtollApp(settings, tracer_provider=tracer_provider, meter_provider=meter_provider)
