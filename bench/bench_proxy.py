"""Proxy benchmark: ragtoll (tracing on, exported over OTLP; one task per call) against a direct call,
bare Starlette pass-through floors on each candidate HTTP client, and ragtoll on other engines and
servers, all in one run.

    python bench/bench_proxy.py                        # full run (several minutes)
    python bench/bench_proxy.py --quick                # smoke run
    python bench/bench_proxy.py --also before=/path/to/old/checkout/.venv/bin/python

Per target: added latency p50/p99 over direct, sequential on one connection (chat and retrieval
JSON, targets alternated request by request in a fresh random order each round); throughput and
the target process's CPU per request with 16 connections (wrk when installed, else the Python load
generator); a streamed call's time to its status line and first event; ragtoll's RSS after N more
calls. Every server runs in its own process with one worker.

Targets: `direct`; `floor-<client>`: Starlette + httpx / httpx2 / httpx+aiohttp / httpx2+aiohttp
under uvicorn (uvloop, httptools), tracing off, and two of them on granian (`@granian`); `ragtoll`: as shipped (granian, httpx2 over aiohttp
with its Python parser); `ragtoll-aiohttp-c`: aiohttp's C parser instead; `ragtoll-httpx2`:
`engine: httpx` (httpx2's own transport); `ragtoll-uvicorn`: the same app under uvicorn; `--also`
adds ragtoll run by another interpreter (an older checkout), with the same config.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from loadgen import Conn, count_requests, throughput

HERE = Path(__file__).parent
CHAT = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is the refund window?"}],
                   "max_tokens": 64}).encode()
STREAM = json.dumps({"model": "gpt-4o-mini", "stream": True, "stream_options": {"include_usage": True},
                     "messages": [{"role": "user", "content": "hi"}]}).encode()
SEARCH = json.dumps({"query": "refund window for annual plans", "top_k": 5}).encode()
FLOORS = ("httpx", "httpx2", "httpx+aiohttp", "httpx2+aiohttp")
REFERENCE_FLOOR = "floor-httpx"  # the targets: added latency <= 1.3x its, throughput >= 0.8x its


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.args}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not start: {proc.args}")


def uvicorn_cmd(target: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "uvicorn", target, "--host", "127.0.0.1", "--port", str(port), "--log-level",
            "warning", "--loop", "uvloop", "--http", "httptools", "--no-access-log", *extra]


class Target:
    def __init__(self, name: str, prefix: str, cmd: list[str] | None, env: dict[str, str] | None = None,
                 port: int | None = None, search_prefix: str | None = None) -> None:
        self.name, self.prefix, self.cmd, self.env = name, prefix, cmd, env or {}
        self.search_prefix = prefix if search_prefix is None else search_prefix
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.cmd is not None:
            self.proc = subprocess.Popen(self.cmd, cwd=HERE, env={**os.environ, **self.env})
            wait_port(self.port, self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def cpu_s(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


def ragtoll_config(tmp: Path, name: str, port: int, upstream: str, **upstream_options: object) -> Path:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(json.dumps({
        "server": {"host": "127.0.0.1", "port": port},
        # one task per call: every call opens a ledger; idle tasks end within a second, so each
        # task's end (record, summary span, task metrics) falls inside the phase that made it and
        # counts in its CPU per call, whether the task ends with its call or with the idle sweep
        "tasks": {"untracked": "per-call", "idle_timeout_s": 1},
        # every dimension limited (all are checked on every call), none reached by a one-call task
        "budgets": {"records_file": str(tmp / f"{name}-tasks.jsonl"), "default_profile": "bench", "profiles": {
            "bench": {"max_steps": 8, "max_calls": 8, "max_retrieval_calls": 8, "max_unique_queries": 8,
                      "max_rerank_calls": 8, "max_context_tokens": 100000, "max_prompt_tokens": 8000,
                      "max_completion_tokens": 20000, "max_cost_usd": 1.0, "max_latency_ms": 600000,
                      "max_stalled_retrievals": 8}}},
        "upstreams": [
            {"name": "openai", "kind": "llm", "api": "openai", "url": upstream, "prefix": "/openai", **upstream_options},
            {"name": "docs", "kind": "retrieval", "api": "passthrough", "url": upstream, "prefix": "/docs",
             **upstream_options},
        ],
    }))
    return cfg


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


_order = random.Random(20261201)  # seeded: a rerun sends the same sequence


async def latency(targets: list[Target], path: str, body: bytes, n: int, kind: str) -> dict[str, list[float]]:
    """Sequential requests on one keep-alive connection per target, alternated in a fresh random order."""
    conns = {t.name: Conn("127.0.0.1", t.port) for t in targets}
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    for i in range(n + 50):
        order = list(targets)
        _order.shuffle(order)
        for t in order:
            r = await conns[t.name].request("POST", (t.prefix if kind == "chat" else t.search_prefix) + path, body)
            assert r.status == 200, (t.name, r.status)
            if i >= 50:  # warm-up
                out[t.name].append(r.total_s * 1000)
    for c in conns.values():
        await c.close()
    return out


async def streaming(targets: list[Target], n: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per target: a streamed call's time to its status line and to its first event (ms)."""
    out: dict[str, tuple[list[float], list[float]]] = {t.name: ([], []) for t in targets}
    conns = {t.name: Conn("127.0.0.1", t.port) for t in targets}
    for i in range(n + 5):
        order = list(targets)
        _order.shuffle(order)
        for t in order:
            r = await conns[t.name].stream_first_byte(t.prefix + "/v1/chat/completions", STREAM)
            if i >= 5:
                out[t.name][0].append(r.head_s * 1000)
                out[t.name][1].append(r.first_byte_s * 1000)
    for c in conns.values():
        await c.close()
    return out


def load(target: Target, seconds: float, conns: int) -> tuple[float, float]:
    """(requests per second, target CPU ms per request) with `conns` connections for `seconds`."""
    url = f"http://127.0.0.1:{target.port}{target.prefix}/v1/chat/completions"
    cpu0 = target.cpu_s() if target.proc else 0.0
    if shutil.which("wrk"):
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
            fh.write(f'wrk.method = "POST"\nwrk.body = {json.dumps(CHAT.decode())}\n'
                     'wrk.headers["Content-Type"] = "application/json"\n')
        out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "-s", fh.name, url],
                             capture_output=True, text=True, check=True).stdout
        os.unlink(fh.name)
        if "Non-2xx" in out:
            raise RuntimeError(f"{target.name}: errors under load\n{out}")
        done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    else:
        done, errors = asyncio.run(throughput("127.0.0.1", target.port, target.prefix + "/v1/chat/completions",
                                              CHAT, seconds, conns, tasks=False))
        assert errors == 0, (target.name, errors)
    cpu = (target.cpu_s() - cpu0) if target.proc else float("nan")
    return done / seconds, cpu * 1000 / max(done, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=2000, help="latency samples per target and kind")
    ap.add_argument("--seconds", type=float, default=8.0, help="throughput window per target")
    ap.add_argument("--conns", type=int, default=16, help="connections in the throughput phase")
    ap.add_argument("--stream-samples", type=int, default=100)
    ap.add_argument("--rss-requests", type=int, default=100_000)
    ap.add_argument("--only", help="comma-separated target names (direct and the reference floor always run)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PYTHON",
                    help="also run ragtoll with this interpreter (an older checkout's venv)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE,...",
                    help="also run ragtoll with these environment variables (RAGTOLL_* config, OTEL_*)")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.seconds, args.stream_samples, args.rss_requests = 300, 2.0, 20, 5000
    tmp = Path(tempfile.mkdtemp())
    up = Target("direct", "", uvicorn_cmd("upstream_app:app", free_port()))
    up.port = int(up.cmd[up.cmd.index("--port") + 1])  # type: ignore[union-attr]
    upstream = f"http://127.0.0.1:{up.port}"
    export = {"OTEL_EXPORTER_OTLP_ENDPOINT": upstream, "OTEL_METRICS_EXPORTER": "none"}
    targets = [up]
    for client in FLOORS:
        port = free_port()
        targets.append(Target(f"floor-{client}", "/p", uvicorn_cmd("floor_app:app", port),
                              {"FLOOR_CLIENT": client, "FLOOR_UPSTREAM": upstream}, port))
    for client in ("httpx", "httpx2+aiohttp"):  # the same floors on the server ragtoll ships with
        port = free_port()
        targets.append(Target(f"floor-{client}@granian", "/p",
                              [sys.executable, "granian_app.py", "floor_app:app", str(port)],
                              {"FLOOR_CLIENT": client, "FLOOR_UPSTREAM": upstream}, port))

    def ragtoll(name: str, python: str = sys.executable, env: dict[str, str] | None = None,
                **options: object) -> Target:
        port = free_port()
        cfg = ragtoll_config(tmp, name, port, upstream, **options)
        return Target(name, "/openai", [python, "-m", "ragtoll.proxy", "serve", "--config", str(cfg)],
                      {**export, **(env or {})}, port, "/docs")

    targets.append(ragtoll("ragtoll"))
    targets.append(ragtoll("ragtoll-aiohttp-c", env={"AIOHTTP_NO_EXTENSIONS": ""}))
    targets.append(ragtoll("ragtoll-httpx2", engine="httpx"))
    port = free_port()
    cfg = ragtoll_config(tmp, "ragtoll-uvicorn", port, upstream)
    targets.append(Target("ragtoll-uvicorn", "/openai", uvicorn_cmd("ragtoll_uvicorn:app", port, "--factory"),
                          {**export, "RAGTOLL_CONFIG": str(cfg)}, port, "/docs"))
    for spec in args.also:
        name, _, python = spec.partition("=")
        targets.append(ragtoll(name, python))
    for spec in args.variant:
        name, _, assignments = spec.partition(":")
        targets.append(ragtoll(name, env=dict(a.split("=", 1) for a in assignments.split(","))))
    if args.only:
        keep = {"direct", REFERENCE_FLOOR, *args.only.split(",")}
        targets = [t for t in targets if t.name in keep]
    try:
        for t in targets:
            t.start()
        chat = asyncio.run(latency(targets, "/v1/chat/completions", CHAT, args.requests, "chat"))
        search = asyncio.run(latency(targets, "/search", SEARCH, args.requests, "search"))
        stream = asyncio.run(streaming(targets, args.stream_samples))
        rps: dict[str, tuple[float, float]] = {}
        for t in targets:
            rps[t.name] = load(t, args.seconds, args.conns)
        main_rt = next(t for t in targets if t.name == "ragtoll")
        rss_before = main_rt.rss_mb()
        errors = asyncio.run(count_requests("127.0.0.1", main_rt.port, "/openai/v1/chat/completions", CHAT,
                                            args.rss_requests, 32, tasks=False))
        rss_after = main_rt.rss_mb()
    finally:
        for t in reversed(targets):  # the proxies first: they flush their spans to the upstream's sink
            t.stop()
    report(targets, chat, search, stream, rps, rss_before, rss_after, errors, args)


def report(targets: list[Target], chat: dict[str, list[float]], search: dict[str, list[float]],
           stream: dict[str, tuple[list[float], list[float]]], rps: dict[str, tuple[float, float]],
           rss_before: float, rss_after: float, errors: int, args: argparse.Namespace) -> None:
    d_chat, d_search = chat["direct"], search["direct"]
    rows: dict[str, dict[str, float]] = {}
    for t in targets:
        rows[t.name] = {
            "chat_p50": statistics.median(chat[t.name]) - statistics.median(d_chat),
            "chat_p99": pct(chat[t.name], 99) - pct(d_chat, 99),
            "search_p50": statistics.median(search[t.name]) - statistics.median(d_search),
            "search_p99": pct(search[t.name], 99) - pct(d_search, 99),
            "rps": rps[t.name][0], "cpu_ms": rps[t.name][1],
            "head_p50": statistics.median(stream[t.name][0]), "event_p50": statistics.median(stream[t.name][1]),
        }
    ref = rows[REFERENCE_FLOOR]
    print(f"\nragtoll proxy benchmark ({'quick' if args.quick else 'full'}; {args.requests} samples/kind, "
          f"{args.conns} connections, {'wrk' if shutil.which('wrk') else 'Python load generator'})")
    print(f"{'target':<22}{'chat +p50':>10}{'chat +p99':>10}{'srch +p50':>10}{'srch +p99':>10}{'req/s':>8}"
          f"{'CPU ms/req':>11}{'head p50':>9}{'event p50':>10}{'p50 x':>7}{'p99 x':>7}{'rps x':>7}")
    for name, r in rows.items():
        ratios = ("" if name == "direct" else
                  f"{r['chat_p50'] / ref['chat_p50']:>7.2f}{r['chat_p99'] / ref['chat_p99']:>7.2f}"
                  f"{r['rps'] / ref['rps']:>7.2f}")
        print(f"{name:<22}{r['chat_p50']:>10.3f}{r['chat_p99']:>10.3f}{r['search_p50']:>10.3f}"
              f"{r['search_p99']:>10.3f}{r['rps']:>8.0f}{r['cpu_ms']:>11.3f}{r['head_p50']:>9.3f}"
              f"{r['event_p50']:>10.3f}{ratios}")
    print(f"(ms; chat/srch = added over direct, direct chat p50 {statistics.median(d_chat):.3f} ms; head/event = a "
          f"streamed call's whole time to its status line / first event; x = ratio to {REFERENCE_FLOOR}: "
          "targets p50 and p99 <= 1.3, req/s >= 0.8)")
    print(f"ragtoll RSS: {rss_before:.1f} MB before, {rss_after:.1f} MB after {args.rss_requests} more calls "
          f"({errors} errors)")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "proxy.json").write_text(json.dumps({**rows, "rss_mb": [rss_before, rss_after]}, indent=2))


if __name__ == "__main__":
    main()
