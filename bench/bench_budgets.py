"""Budget benchmark: latency ragtoll adds with budgets on (memory store, Redis on loopback) over the
proxy core alone (`budgets.enabled: false`), measured alternately in one run; and the Redis round
trips per call, read from MONITOR (targets: +0.3 ms p50 memory, +0.8 ms p50 Redis; exactly one
round trip before forwarding and one after, plus one per extension of a stream's reservation).

    python bench/bench_budgets.py            # full run
    python bench/bench_budgets.py --quick    # smoke run

Every profile dimension is set (very high), so every check runs; calls rotate over 500 task ids.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_proxy import CHAT, SEARCH, STREAM, free_port, pct, uvicorn_cmd, wait_port
from loadgen import Conn

HERE = Path(__file__).parent
SCRIPTS = HERE.parent / "proxy" / "stores" / "scripts"
TASKS = 500
HUGE = {"max_steps": 10**9, "max_calls": 10**9, "max_retrieval_calls": 10**9, "max_unique_queries": 10**9,
        "max_rerank_calls": 10**9, "max_context_tokens": 10**12, "max_prompt_tokens": 10**9,
        "max_completion_tokens": 10**12, "max_cost_usd": 10**6, "max_latency_ms": 10**12,
        "max_stalled_retrievals": 10**9}


def uvicorn_proc(target: str, port: int) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(uvicorn_cmd(target, port), cwd=HERE)
    wait_port(port, p)
    return p


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()


def redis_server(port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    p = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", tempfile.mkdtemp()], stdout=subprocess.DEVNULL)
    wait_port(port, p)
    return p


def ragtoll(upstream: str, port: int, store: str, enabled: bool) -> subprocess.Popen[bytes]:
    cfg = Path(tempfile.mkdtemp()) / "ragtoll.yaml"
    cfg.write_text(json.dumps({
        "server": {"host": "127.0.0.1", "port": port},
        "store": store, "store_timeout_ms": 1000,
        "cache": {"enabled": False},
        "tasks": {"idle_timeout_s": 3600},
        "upstreams": [
            {"name": "openai", "kind": "llm", "api": "openai", "url": upstream, "prefix": "/openai"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream, "prefix": "/docs"},
        ],
        "pricing": {"docs": {"per_call": 0.0005}},
        # a stream without max_tokens holds 2 output tokens: its 5 need one extension (reserve -> extend -> settle)
        "budgets": {"enabled": enabled, "default_profile": "bench", "profiles": {"bench": HUGE},
                    "default_max_output_tokens": 2, "records_file": str(cfg.parent / "records.jsonl")},
    }))
    env = {**os.environ, "OTEL_SDK_DISABLED": "true"}
    p = subprocess.Popen([sys.executable, "-m", "ragtoll.proxy", "serve", "--config", str(cfg)], env=env)
    wait_port(port, p)
    return p


async def latency(targets: dict[str, tuple[int, str]], path: str, body: bytes, n: int) -> dict[str, list[float]]:
    conns = {name: Conn("127.0.0.1", port) for name, (port, _) in targets.items()}
    out: dict[str, list[float]] = {name: [] for name in targets}
    for i in range(n + 100):
        headers = {"x-ragtoll-task-id": f"bench-{i % TASKS}"}
        for name, (_port, prefix) in targets.items():  # alternate targets request by request
            t = await conns[name].request("POST", prefix + path, body, headers)
            assert t.status == 200, (name, t.status)
            if i >= 100:  # warm-up: connections, scripts loaded, tasks created
                out[name].append(t.total_s * 1000)
    for c in conns.values():
        await c.close()
    return out


def monitor(port: int, lines: list[str], stop: threading.Event) -> threading.Thread:
    """Collects MONITOR lines from Redis in a thread until `stop` is set."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"MONITOR\r\n")
    sock.settimeout(0.2)

    def run() -> None:
        buf = b""
        while not stop.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                break
            buf += data
            *done, buf = buf.split(b"\r\n")
            lines.extend(x.decode("utf-8", "replace") for x in done)
        sock.close()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


async def sequential(port: int, path: str, body: bytes, n: int) -> None:
    conn = Conn("127.0.0.1", port)
    for i in range(n):
        t = await conn.request("POST", path, body, {"x-ragtoll-task-id": f"rt-{i % 7}"})
        assert t.status == 200, t.status
    await conn.close()


def round_trips(redis_port: int, rt_port: int, n: int) -> dict[str, object]:
    """Client commands Redis saw per proxied call (Lua-internal commands excluded), and their order."""
    sha = {hashlib.sha1((SCRIPTS / f"{name}.lua").read_text("utf-8").encode()).hexdigest(): name
           for name in ("reserve", "extend", "cancel", "settle", "end")}
    asyncio.run(sequential(rt_port, "/openai/v1/chat/completions", CHAT, 5))  # warm: connections, scripts
    asyncio.run(sequential(rt_port, "/openai/v1/chat/completions", STREAM, 2))
    lines: list[str] = []
    stop = threading.Event()
    th = monitor(redis_port, lines, stop)
    time.sleep(0.3)
    asyncio.run(sequential(rt_port, "/openai/v1/chat/completions", CHAT, n))
    asyncio.run(sequential(rt_port, "/docs/search", SEARCH, n))
    asyncio.run(sequential(rt_port, "/openai/v1/chat/completions", STREAM, n))
    time.sleep(0.5)
    stop.set()
    th.join(timeout=5)
    # MONITOR lines are RESP simple strings: +<time> [<db> <client address>|lua] "cmd" "arg" ...
    client = [x for x in (y.removeprefix("+") for y in lines)
              if "[" in x and " lua]" not in x and x[:1].isdigit() and '"monitor"' not in x.lower()]
    names = []
    for line in client:
        parts = line.split('"')
        cmd = parts[1].lower() if len(parts) > 1 else "?"
        names.append(sha.get(parts[3], cmd) if cmd == "evalsha" and len(parts) > 3 else cmd)
    # a pooled connection opened mid-run says HELLO / CLIENT SETINFO / SELECT once: setup, not per call
    setup = [x for x in names if x in ("hello", "client", "select", "auth")]
    per_call = [x for x in names if x not in setup]
    return {"calls": 3 * n, "client_commands": len(per_call), "per_call": len(per_call) / (3 * n),
            # settle runs after the response is sent, so call i's settle may land after call i+1's reserve
            "reserves": per_call.count("reserve"), "settles": per_call.count("settle"),
            "extends": per_call.count("extend"), "streams": n,
            "connection_setup_commands": len(setup), "kinds": sorted(set(names))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--requests", type=int, default=3000, help="latency samples per target and kind")
    args = ap.parse_args()
    if args.quick:
        args.requests = 300
    procs: list[subprocess.Popen[bytes]] = []
    try:
        up_port, redis_port = free_port(), free_port()
        procs.append(uvicorn_proc("upstream_app:app", up_port))
        procs.append(redis_server(redis_port))
        upstream = f"http://127.0.0.1:{up_port}"
        ports = {"core": free_port(), "memory": free_port(), "redis": free_port()}
        procs.append(ragtoll(upstream, ports["core"], "memory", False))
        procs.append(ragtoll(upstream, ports["memory"], "memory", True))
        procs.append(ragtoll(upstream, ports["redis"], f"redis://127.0.0.1:{redis_port}/0", True))
        results: dict[str, object] = {}
        for kind, path, body, prefix in (("chat", "/v1/chat/completions", CHAT, "/openai"),
                                         ("search", "/search", SEARCH, "/docs")):
            targets = {"direct": (up_port, ""), **{k: (p, prefix) for k, p in ports.items()}}
            lat = asyncio.run(latency(targets, path, body, args.requests))
            base = statistics.median(lat["core"])
            results[kind] = {name: {"p50_ms": statistics.median(xs), "p99_ms": pct(xs, 99),
                                    "added_over_core_p50_ms": statistics.median(xs) - base,
                                    "added_over_core_p99_ms": pct(xs, 99) - pct(lat["core"], 99)}
                             for name, xs in lat.items()}
        trips = round_trips(redis_port, ports["redis"], max(50, args.requests // 20))
        results["redis_round_trips"] = trips
        print(f"\nragtoll budget benchmark ({'quick' if args.quick else 'full'}; {args.requests} samples/kind)")
        print(f"{'kind':<8}{'target':<8}{'p50 ms':>9}{'p99 ms':>9}{'+p50 vs core':>14}{'+p99 vs core':>14}")
        for kind in ("chat", "search"):
            for name, r in results[kind].items():  # type: ignore[attr-defined]
                print(f"{kind:<8}{name:<8}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
                      f"{r['added_over_core_p50_ms']:>14.3f}{r['added_over_core_p99_ms']:>14.3f}")
        print(f"Redis round trips per call: {trips['per_call']:.2f} ({trips['client_commands']} client commands "
              f"for {trips['calls']} calls ({trips['streams']} of them streams): {trips['reserves']} reserve, "
              f"{trips['extends']} extend, {trips['settles']} settle; "
              f"connection setup {trips['connection_setup_commands']})")
        out = HERE / "results"
        out.mkdir(exist_ok=True)
        (out / "budgets.json").write_text(json.dumps(results, indent=2))
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
