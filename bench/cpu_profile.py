"""Where ragtoll's CPU per call goes: the bench configuration (tracing exported over OTLP, budgets with
every dimension limited, the evidence cache on, one task per call) under cProfile, sequential calls.

    python bench/cpu_profile.py                      # 3,000 calls, the table by package
    python bench/cpu_profile.py --calls 5000 --top 40 --out /tmp/ragtoll.prof

Prints ragtoll's CPU per call without a profiler, with spans exported and with `OTEL_TRACES_EXPORTER=none`
(the gap is the span export thread's share, which cProfile does not see: it profiles the main thread
only); then, from a run under cProfile (timed by the thread's CPU clock), the event-loop thread's own CPU time by package (cProfile's tottime;
C built-ins are charged to the package that called them) and the functions with the most cumulative
time, all in µs per call. cProfile roughly doubles the time of Python code: compare its packages with
each other, not with the first line. A diagnostic for bench/, never run by the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_proxy import CHAT, Target, free_port, ragtoll_config, uvicorn_cmd
from bench_tail import tree_cpu_s
from loadgen import Conn

# package of a profiled function, by the path of its file (first match wins)
PACKAGES = (("opentelemetry/sdk/trace", "otel: spans"), ("opentelemetry/attributes", "otel: spans"),
            ("opentelemetry/sdk/metrics", "otel: metrics"), ("opentelemetry", "otel: other"),
            ("/instrumentation/", "ragtoll: instrumentation"), ("aiohttp", "client: aiohttp"),
            ("httpx", "client: httpx2 + transport"), ("granian", "server: granian"),
            ("/proxy/", "ragtoll: proxy"), ("asyncio", "asyncio"), ("orjson", "json"), ("json", "json"))


async def calls(port: int, n: int) -> None:
    conn = Conn("127.0.0.1", port)
    for _ in range(n):
        r = await conn.request("POST", "/openai/v1/chat/completions", CHAT)
        assert r.status == 200, r.status
    await conn.close()


def cpu_per_call_us(target: Target, n: int, warmup: int) -> float:
    asyncio.run(calls(target.port, warmup))
    assert target.proc is not None
    before = tree_cpu_s(target.proc.pid)[0]
    asyncio.run(calls(target.port, n))
    return (tree_cpu_s(target.proc.pid)[0] - before) * 1e6 / n


def package(filename: str, function: str) -> str:
    if filename == "~":  # a C function or method: cProfile names its type in the function's name
        return "server: granian (send, receive)" if "granian" in function else \
            "sockets, loop callbacks" if "socket" in function or "uvloop" in function else "built-ins"
    for needle, name in PACKAGES:
        if needle in filename:
            return name
    if "importlib" in filename or function == "<module>":
        return "start-up: imports"
    return "standard library" if "python3" in filename or filename.startswith("<") else filename


def profiled_serve(out: str, argv: list[str]) -> int:
    """`ragtoll <argv>` under cProfile timed by this thread's CPU clock (the event loop's thread), not
    the wall clock: waiting for the GIL or a socket costs nothing; the profile is written at exit."""
    from ragtoll.proxy.cli import main as cli

    profile = cProfile.Profile(time.thread_time)
    profile.enable()
    try:
        return cli(argv)
    finally:
        profile.disable()
        profile.dump_stats(out)


def main() -> None:
    if sys.argv[1:2] == ["--profile-to"]:
        sys.exit(profiled_serve(sys.argv[2], sys.argv[3:]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--out", default=None, help="keep the cProfile file here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    out = args.out or str(tmp / "ragtoll.prof")
    up_port = free_port()
    upstream = Target("direct", "", uvicorn_cmd("upstream_app:app", up_port), port=up_port)
    export = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{up_port}", "OTEL_METRICS_EXPORTER": "none"}

    def ragtoll(name: str, env: dict[str, str], profile: bool = False) -> Target:
        port = free_port()
        cfg = ragtoll_config(tmp, name, port, f"http://127.0.0.1:{up_port}")
        run = [sys.executable, __file__, "--profile-to", out] if profile else [sys.executable, "-m", "ragtoll.proxy"]
        return Target(name, "/openai", [*run, "serve", "--config", str(cfg)], {**export, **env}, port)

    upstream.start()
    plain: dict[str, float] = {}
    try:
        for name, env in (("exported", {}), ("not exported", {"OTEL_TRACES_EXPORTER": "none"})):
            t = ragtoll(name, env)
            t.start()
            try:
                plain[name] = cpu_per_call_us(t, args.calls, 300)
            finally:
                t.stop()
        profiled = ragtoll("profiled", {}, profile=True)
        profiled.start()
        try:
            asyncio.run(calls(profiled.port, 300 + args.calls))  # the profile covers start-up and warm-up too
        finally:
            profiled.stop()  # SIGTERM: ragtoll returns from main and cProfile writes its file
    finally:
        upstream.stop()
    report(pstats.Stats(out), 300 + args.calls, plain, args.top)


def report(stats: pstats.Stats, n: int, plain: dict[str, float], top: int) -> None:
    own: collections.Counter[str] = collections.Counter()
    rows = []
    for (filename, line, fn), (_, ncalls, tottime, cumtime, callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = package(filename, fn)
        if where == "built-ins":  # isinstance, dict.get, ...: charged to the package that called them
            for (caller_file, _, caller_fn), edge in callers.items():
                own[package(caller_file, caller_fn)] += edge[2]
        else:  # the frame that runs uvloop's C loop is charged with its C work (sockets, callbacks)
            own["event loop (uvloop's C code)" if "server.py" in filename and fn == "serve" else where] += tottime
        rows.append((cumtime, tottime, ncalls, f"{filename.split('site-packages/')[-1]}:{line}:{fn}"))
    us = lambda s: s * 1e6 / n
    print(f"ragtoll CPU per call without a profiler (load average {os.getloadavg()[0]:.2f}): "
          f"{plain['exported']:.0f} µs with spans exported, {plain['not exported']:.0f} µs without export "
          f"(export: {plain['exported'] - plain['not exported']:.0f} µs, on the batch thread)")
    print(f"\nevent-loop thread under cProfile, own CPU time by package (µs per call, {n} calls incl. warm-up):")
    for name, seconds in own.most_common():
        if us(seconds) >= 1:
            print(f"  {us(seconds):8.1f}  {name}")
    print(f"\ntop {top} by cumulative time (µs per call; own time; calls per call):")
    for cum, tot, ncalls, name in sorted(rows, reverse=True)[:top]:
        print(f"  {us(cum):8.1f} {us(tot):8.1f} {ncalls / n:6.1f}  {name[:110]}")


if __name__ == "__main__":
    main()
