"""Exchanges without a server: one call as the stages see it, for unit tests of one stage.

`Exchanges(**config)` parses a config as `ragtoll serve` would (`config.parse`) and routes it
(`Router`); calling it makes an `Exchange` with a task, its caller resolved as the pipeline does
(`CallerResolver`, from the headers and their repeats), the route adapter's parse of the body and
a recording span (an SDK span exported to memory once it ends: `finished(ex)`). `answer(ex, ...)`
plays the upstream's part: the adapter's own observer reads the body, as the forwarder's would.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ragtoll.proxy import config
from ragtoll.proxy.model import SOURCE_HEADER, TaskRef
from ragtoll.proxy.request.caller import CallerResolver
from ragtoll.proxy.request.exchange import Exchange
from ragtoll.proxy.request.identify import derived_trace_id
from ragtoll.proxy.request.pipeline import read_headers
from ragtoll.proxy.request.routing import Route, Router

UNUSED = "http://127.0.0.1:9"  # the discard port: nothing listens, nothing is sent there
UPSTREAMS: list[dict[str, Any]] = [
    {"name": "openai", "kind": "llm", "api": "openai", "url": UNUSED, "prefix": "/openai"},
    {"name": "docs", "kind": "retrieval", "api": "json", "url": UNUSED, "prefix": "/docs"},
]
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}


class Exchanges:
    """A factory of exchanges over one parsed config (`raw`: config keys; `upstreams` defaults
    to UPSTREAMS), with one in-memory span exporter for all of them. `env`: where secrets named
    by the config are read (the JWT secret)."""

    def __init__(self, *, env: Mapping[str, str] | None = None, **raw: Any) -> None:
        self.settings = config.parse({"upstreams": UPSTREAMS, **raw})
        self.router = Router(self.settings.upstreams)
        self.callers = CallerResolver(self.settings.identity, env or {}, anonymous=self.settings.principals.anonymous)
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self._tracer = self.tracer_provider.get_tracer("tests.support.exchanges")

    def route(self, name: str) -> Route:
        return next(r for r in self.router.routes if r.upstream.name == name)

    def __call__(self, route: str = "openai", body: Any = CHAT, *, path: str | None = None,
                 task: str | None = "task-1", baggage: Mapping[str, str] | None = None,
                 headers: Mapping[str, str] | None = None, method: str = "POST",
                 repeated: Sequence[tuple[str, str]] = (), client: str = "127.0.0.1") -> Exchange:
        """An exchange on `route` (by upstream name): `body` as JSON (bytes as they are, None for
        none) parsed by the route's adapter; a header-named task unless `task` is None. `repeated`:
        header lines sent after `headers` (a name sent twice)."""
        r = self.route(route)
        path = path or ("/v1/chat/completions" if r.upstream.api == "openai" else "/search")
        raw = body if body is None or isinstance(body, bytes) else orjson.dumps(body)
        hdrs = {k.lower(): v for k, v in (headers or {}).items()}
        if raw is not None:
            hdrs.setdefault("content-type", "application/json")
        ref = None
        if task is not None:
            ref = TaskRef(task, SOURCE_HEADER, derived_trace_id(task), tuple((baggage or {}).items()))
        raw_headers = [(k.encode(), v.encode()) for k, v in [*hdrs.items(), *repeated]]
        merged, duplicated = read_headers(raw_headers)
        ex = Exchange(r, method, path, merged, raw_headers, client, time.perf_counter(), task=ref, body=raw,
                      caller=self.callers.resolve(merged, duplicated, client, r.adapter.credential_headers),
                      timeouts=r.upstream.timeouts)
        if raw is not None and r.adapter.reads_body:
            ex.call = r.adapter.parse_request(method, path, merged, raw)
        ex.span = self._tracer.start_span(f"{ex.call.operation} {r.upstream.name}")
        return ex

    def finished(self, ex: Exchange) -> ReadableSpan:
        """End the exchange's span; what the exporter received."""
        ex.span.end()
        return next(s for s in reversed(self.exporter.get_finished_spans())
                    if s.context.span_id == ex.span.get_span_context().span_id)


def answer(ex: Exchange, body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None,
           complete: bool = True) -> bytes:
    """The upstream's answer, as the forwarder records it: status, the route adapter's observation
    of `body` (JSON, or bytes as they are), headers sent, body complete. Returns the raw body."""
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    observer = ex.route.adapter.observer(ex.call, status, {"content-type": "application/json", **(headers or {})})
    observer.feed(raw, True)
    ex.status, ex.observation = status, observer.observation
    ex.headers_sent, ex.complete, ex.bytes_out = True, complete, len(raw)
    return raw


def results(ids: Sequence[str], text: str = "chunk {id} about refunds", **extra: Any) -> dict[str, Any]:
    """A `json` retrieval answer with these chunk ids, scores falling from 0.9."""
    return {"results": [{"id": i, "text": text.format(id=i), "score": round(0.9 - n / 10, 2), **extra}
                        for n, i in enumerate(ids)]}
