"""Run `ragtoll serve` with probes that explain its tail, and write what they saw to a JSON file at exit:

    python bench/tail_probe.py OUT.json serve --config ragtoll.yaml
    TAIL_PROBE_GC=10000/10/10 python bench/tail_probe.py ...   # with these GC thresholds instead

  * event-loop lag: a task on ragtoll's loop sleeps 1 ms at a time and records how late it wakes;
  * GC: every collection's generation and pause (gc.callbacks), and which thread ran it;
  * span export: every OTLP export batch's size, wall time and the exporting thread's CPU time;
  * task sweeps: every sweep's wall time and the tasks it ended;
  * the path of one call, for calls with no other in flight (the sequential and stream phases): from the request reaching
    the pipeline to the upstream request (the body read, the parse, each stage's `on_request`),
    the upstream exchange, the answer to its first byte sent, the rest of the answer, and the work
    after the answer (settle, span, metrics, the task's end), in µs.
Each late wake-up over 2 ms is attributed to what overlapped it (a GC pause, an export batch, a sweep,
or none of them: request work or the server's threads). A diagnostic for bench/, never shipped: it wraps
functions of ragtoll and the OTel exporter in place, which nothing else may do.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

Interval = tuple[float, float]
LATE_MS = 2.0


class Probe:
    def __init__(self) -> None:
        self.lags: list[tuple[float, float]] = []  # (wake time, lag ms)
        self.gcs: list[tuple[float, float, int, str, float]] = []  # (start, end, generation, thread, CPU s)
        self.exports: list[tuple[float, float, int, float]] = []  # (start, end, spans, thread CPU s)
        self.sweeps: list[tuple[float, float, int]] = []
        self.calls = 0  # proxied calls handled
        self.paths: list[dict[str, float]] = []  # per sequential call: segment -> µs
        self._path: dict[str, float] | None = None  # the call in flight, when it is the only one
        self._in_flight = 0
        self._gc_start: dict[int, tuple[float, float]] = {}

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        tid = threading.get_ident()
        if phase == "start":
            self._gc_start[tid] = (now, cpu)
        elif tid in self._gc_start:
            start, cpu0 = self._gc_start.pop(tid)
            self.gcs.append((start, now, info["generation"], threading.current_thread().name, cpu - cpu0))

    async def watch_loop(self) -> None:
        await asyncio.sleep(5.0)  # start-up (the lifespan's work) is not the tail being looked for
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            t1 = time.perf_counter()
            self.lags.append((t1, (t1 - t0) * 1000 - 1.0))

    def summary(self) -> dict[str, Any]:
        def pcts(xs: list[float]) -> dict[str, float]:
            xs = sorted(xs)
            if not xs:
                return {}
            at = lambda p: xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]
            return {"n": len(xs), "p50": at(50), "p99": at(99), "p99.9": at(99.9), "max": xs[-1], "sum": sum(xs)}

        def overlaps(start: float, end: float, spans: list[Interval]) -> bool:
            return any(s < end and e > start for s, e in spans)

        gc_main = [(s, e) for s, e, _, th, _ in self.gcs if th == "MainThread"]
        gc_any = [(s, e) for s, e, *_ in self.gcs]
        exports = [(s, e) for s, e, _, _ in self.exports]
        sweeps = [(s, e) for s, e, _ in self.sweeps]
        causes = {"gc (main thread)": 0, "gc (another thread)": 0, "span export": 0, "task sweep": 0, "none of these": 0}
        late_ms = {k: 0.0 for k in causes}
        for woke, lag in self.lags:
            if lag < LATE_MS:
                continue
            window = (woke - lag / 1000, woke)
            cause = ("task sweep" if overlaps(*window, sweeps) else "gc (main thread)" if overlaps(*window, gc_main)
                     else "span export" if overlaps(*window, exports)
                     else "gc (another thread)" if overlaps(*window, gc_any) else "none of these")
            causes[cause] += 1
            late_ms[cause] += lag
        return {
            "calls": self.calls,
            "gc_collections": {f"gen{g}": sum(1 for _, _, gen, *_ in self.gcs if gen == g) for g in (0, 1, 2)},
            "loop_lag_ms": pcts([lag for _, lag in self.lags]),
            f"late_wakeups_over_{LATE_MS:g}ms": {k: {"count": causes[k], "lag_ms": round(late_ms[k], 1)} for k in causes},
            "gc_pause_ms": {f"gen{g}": pcts([(e - s) * 1000 for s, e, gen, *_ in self.gcs if gen == g]) for g in (0, 1, 2)},
            "gc_pause_cpu_ms": {f"gen{g}": pcts([c * 1000 for _, _, gen, _, c in self.gcs if gen == g]) for g in (0, 1, 2)},
            "gc_threads": sorted({th for _, _, _, th, _ in self.gcs}),
            "export_batches": {"spans": pcts([float(n) for _, _, n, _ in self.exports]),
                               "wall_ms": pcts([(e - s) * 1000 for s, e, _, _ in self.exports]),
                               "thread_cpu_ms": pcts([c * 1000 for *_, c in self.exports])},
            "sweeps": {"wall_ms": pcts([(e - s) * 1000 for s, e, _ in self.sweeps]),
                       "tasks": pcts([float(n) for *_, n in self.sweeps])},
            "call_path_us": {k: pcts([p[k] for p in self.paths if k in p])
                             for k in sorted({k for p in self.paths for k in p})},
        }

    def mark(self, name: str) -> None:
        """The time `name` was first reached by the call in flight (if it is alone)."""
        if self._path is not None:
            self._path.setdefault(name, time.perf_counter())

    def add(self, name: str, seconds: float) -> None:
        if self._path is not None:
            self._path[name] = self._path.get(name, 0.0) + seconds


def _segments(marks: dict[str, float]) -> dict[str, float]:
    """A call's marks and timed parts as µs per segment of its path."""
    out = {k[2:]: v * 1e6 for k, v in marks.items() if k.startswith("d:")}
    order = ["request", "upstream_start", "upstream_end", "answer_start", "answer_end", "done"]
    names = ["to the upstream request", "upstream exchange", "to the answer's first byte", "rest of the answer",
             "after the answer"]
    for (a, b), name in zip(itertools.pairwise(order), names, strict=True):
        if a in marks and b in marks:
            out[name] = (marks[b] - marks[a]) * 1e6
    return out


def timed(probe: Probe, cls: Any, name: str, label: str, *, mark_first: bool = False) -> None:
    """Wrap the coroutine method `cls.name`: its time per call adds to the call's `label`; with
    `mark_first`, its start and end mark the path (`upstream_start`, `upstream_end`)."""
    inner = getattr(cls, name)

    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        path = probe._path
        start = time.perf_counter()
        if mark_first:
            probe.mark(f"{label}_start")
        try:
            return await inner(self, *args, **kwargs)
        finally:
            if path is not None and path is probe._path:
                if mark_first:
                    probe.mark(f"{label}_end")
                else:
                    probe.add(f"d:{label}", time.perf_counter() - start)

    setattr(cls, name, wrapper)


def install(probe: Probe) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from ragtoll.proxy import server
    from ragtoll.proxy.request.pipeline import Pipeline
    from ragtoll.proxy.request.upstream import UpstreamClient
    from ragtoll.proxy.stages.budget import BudgetStage
    from ragtoll.proxy.stages.cache import CacheStage
    from ragtoll.proxy.stages.context import ContextStage
    from ragtoll.proxy.stages.principal import PrincipalStage
    from ragtoll.proxy.tasks.records import TaskEnder

    stages = (BudgetStage, CacheStage, ContextStage, PrincipalStage)  # the stages whose on_request does work

    gc.callbacks.append(probe.on_gc)
    export = OTLPSpanExporter.export

    def timed_export(self: Any, spans: Any) -> Any:
        s, c = time.perf_counter(), time.thread_time()
        try:
            return export(self, spans)
        finally:
            probe.exports.append((s, time.perf_counter(), len(spans), time.thread_time() - c))

    OTLPSpanExporter.export = timed_export  # type: ignore[method-assign]
    sweep = TaskEnder.sweep

    async def timed_sweep(self: Any) -> int:
        s = time.perf_counter()
        n = await sweep(self)
        probe.sweeps.append((s, time.perf_counter(), n))
        return n

    TaskEnder.sweep = timed_sweep  # type: ignore[method-assign]
    handle = Pipeline.handle

    async def counted_handle(self: Any, route: Any, scope: Any, receive: Any, send: Any) -> None:
        probe.calls += 1
        probe._in_flight += 1
        alone = probe._in_flight == 1
        marks: dict[str, float] = {"request": time.perf_counter()}
        probe._path = marks if alone else None

        async def timed_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                probe.mark("answer_start")
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                probe.mark("answer_end")
            await send(message)

        try:
            await handle(self, route, scope, receive, timed_send)
        finally:
            probe._in_flight -= 1
            marks["done"] = time.perf_counter()
            if alone and probe._path is marks and probe.calls > 200:  # past the warm-up
                probe.paths.append(_segments(marks))
            probe._path = None

    Pipeline.handle = counted_handle  # type: ignore[method-assign]
    timed(probe, UpstreamClient, "send", "upstream", mark_first=True)
    for cls, name in ((Pipeline, "_read"), (Pipeline, "_parse"), *((stage, "on_request") for stage in stages)):
        timed(probe, cls, name, f"{getattr(cls, '__name__', cls)}.{name}")
    serve = server.serve

    async def watched_serve(*args: Any, **kwargs: Any) -> None:
        watcher = asyncio.get_running_loop().create_task(probe.watch_loop())
        try:
            await serve(*args, **kwargs)
        finally:
            watcher.cancel()

    server.serve = watched_serve  # type: ignore[assignment]


def main() -> int:
    out = Path(sys.argv[1])
    if os.environ.get("TAIL_PROBE_GC"):
        gc.set_threshold(*(int(x) for x in os.environ["TAIL_PROBE_GC"].split("/")))
    probe = Probe()
    install(probe)
    from ragtoll.proxy.cli import main as cli

    try:
        return cli(sys.argv[2:])
    finally:
        out.write_text(json.dumps(probe.summary(), indent=2))


if __name__ == "__main__":
    sys.exit(main())
