"""Tail benchmark: p50, p99 and p99.9 of the latency ragtoll adds, its streamed first event and its CPU
per call, against the bare floors, all in one run.

    python bench/bench_tail.py                      # full run (about 10 minutes)
    python bench/bench_tail.py --quick              # smoke run
    python bench/bench_tail.py --servers            # also ragtoll on uvicorn, hypercorn and granian's RSGI
                                                    # (bench/asgi_on_rsgi.py), floors on granian
    python bench/bench_tail.py --variant nootel:OTEL_SDK_DISABLED=true --also before=/old/checkout/.venv/bin/python
    python bench/bench_tail.py --probe              # ragtoll under bench/tail_probe.py: loop lag, GC, export

Targets: `direct` (the loopback upstream); `floor-httpx` (bare Starlette + httpx pass-through on uvicorn,
no tracing: the reference the targets are set against); `floor-httpx2+aiohttp` (the same on ragtoll's
client stack, the stretch floor); `ragtoll` as shipped (`ragtoll serve`: tracing exported over OTLP to a
loopback sink, budgets with every dimension limited, the evidence cache on, one task per call).

Phases, each alternating the targets:
  1. sequential: one keep-alive connection per target, one chat call each per round, the targets in a
     fresh random order every round; added latency = a target's percentile minus direct's. The CPU each
     process used over the phase, divided by its calls, is its CPU per call at low load.
  2. stream: a streamed chat call per target per round, its first event (the upstream paces events 2 ms
     apart here, so a round is short).
  3. load: 16 connections (wrk), each target for --load-seconds in a shuffled order, --load-rounds times:
     req/s, latency percentiles under load, CPU per call (the process and its children).
Ratios are to `floor-httpx`; the targets: added p50 <= 1.3x, p99 <= 1.5x, CPU per call <= 1.3x, streamed
first event <= 1.3x, req/s >= 1.0x. Results also go to bench/results/tail.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_proxy import CHAT, STREAM, Target, free_port, pct, ragtoll_config, uvicorn_cmd
from loadgen import Conn

HERE = Path(__file__).parent
REFERENCE = "floor-httpx"
STREAM_GAP_S = "0.002"
_order = random.Random(20261202)  # seeded: a rerun sends the same sequence
# wrk reports its own percentiles (microseconds) after the run
_WRK_DONE = """
done = function(summary, latency, requests)
  io.write(string.format("TAIL %d %.1f %.1f %.1f %.1f\\n", summary.requests, latency:percentile(50),
    latency:percentile(99), latency:percentile(99.9), latency.max))
end
"""


def tree_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of `pid` with every live descendant (an export process), and of `pid` alone."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, own, todo = 0.0, 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        total += used
        own = used if p == pid else own
        todo.extend(children.get(p, []))
    return total, own


def cpu(t: Target) -> tuple[float, float]:
    return tree_cpu_s(t.proc.pid) if t.proc is not None else (float("nan"), float("nan"))


async def sequential(targets: list[Target], rounds: int, warmup: int
                     ) -> tuple[dict[str, list[float]], dict[str, tuple[float, float]]]:
    """Chat calls on one connection per target, alternated; (latencies in ms, CPU ms per call of the
    process tree and of the process alone)."""
    conns = {t.name: Conn("127.0.0.1", t.port) for t in targets}
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    cpu0: dict[str, tuple[float, float]] = {}
    for i in range(rounds + warmup):
        if i == warmup:
            cpu0 = {t.name: cpu(t) for t in targets}
        order = list(targets)
        _order.shuffle(order)
        for t in order:
            r = await conns[t.name].request("POST", t.prefix + "/v1/chat/completions", CHAT)
            assert r.status == 200, (t.name, r.status)
            if i >= warmup:
                out[t.name].append(r.total_s * 1000)
    cpu_ms = {t.name: tuple((b - a) * 1000 / rounds for a, b in zip(cpu0[t.name], cpu(t), strict=True))
              for t in targets}
    for c in conns.values():
        await c.close()
    return out, cpu_ms


async def streaming(targets: list[Target], rounds: int, warmup: int) -> dict[str, list[float]]:
    """A streamed call per target per round, alternated: the time to its first event (ms)."""
    conns = {t.name: Conn("127.0.0.1", t.port) for t in targets}
    out: dict[str, list[float]] = {t.name: [] for t in targets}
    for i in range(rounds + warmup):
        order = list(targets)
        _order.shuffle(order)
        for t in order:
            r = await conns[t.name].stream_first_byte(t.prefix + "/v1/chat/completions", STREAM)
            assert r.status == 200, (t.name, r.status)
            if i >= warmup:
                out[t.name].append(r.first_byte_s * 1000)
    for c in conns.values():
        await c.close()
    return out


def wrk_window(t: Target, seconds: float, conns: int, script: str
               ) -> tuple[int, tuple[float, float], list[float], int]:
    """(calls, CPU seconds of the target's process tree and of the process alone, [p50, p99, p99.9, max]
    in ms, failed calls) of one wrk window."""
    url = f"http://127.0.0.1:{t.port}{t.prefix}/v1/chat/completions"
    cpu0 = cpu(t)
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{seconds:g}s", "-s", script, url],
                         capture_output=True, text=True, check=True).stdout
    cpu1 = cpu(t)
    used = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1])
    failed = sum(int(n) for n in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    failed += sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))  # socket errors
    m = re.search(r"^TAIL (\d+) ([\d.]+) ([\d.]+) ([\d.]+) ([\d.]+)$", out, re.MULTILINE)
    assert m is not None, out
    return int(m.group(1)), used, [float(x) / 1000 for x in m.groups()[1:]], failed


def load(targets: list[Target], seconds: float, rounds: int, conns: int) -> dict[str, dict[str, float]]:
    """Windows of `conns` connections, each target in a shuffled order per round."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        fh.write(f'wrk.method = "POST"\nwrk.body = {json.dumps(CHAT.decode())}\n'
                 f'wrk.headers["Content-Type"] = "application/json"\n{_WRK_DONE}')
    calls = {t.name: 0 for t in targets}
    failed = {t.name: 0 for t in targets}
    used = {t.name: [0.0, 0.0] for t in targets}
    tails: dict[str, list[list[float]]] = {t.name: [] for t in targets}
    try:
        for _ in range(rounds):
            order = [t for t in targets if t.name != "direct"]
            _order.shuffle(order)
            for t in order:
                n, c, q, f = wrk_window(t, seconds, conns, fh.name)
                calls[t.name] += n
                failed[t.name] += f
                used[t.name][0] += c[0]
                used[t.name][1] += c[1]
                tails[t.name].append(q)
    finally:
        os.unlink(fh.name)
    out = {}
    for t in targets:
        if t.name == "direct":
            continue
        windows = tails[t.name]
        n = max(1, calls[t.name])
        out[t.name] = {"rps": calls[t.name] / (seconds * rounds), "cpu_ms": used[t.name][0] * 1000 / n,
                       "cpu_own_ms": used[t.name][1] * 1000 / n, "failed": failed[t.name],
                       **{k: statistics.median(w[i] for w in windows)
                          for i, k in enumerate(("p50", "p99", "p999", "max"))}}
    return out


def added(xs: list[float], base: list[float]) -> dict[str, float]:
    return {"p50": statistics.median(xs) - statistics.median(base), "p99": pct(xs, 99) - pct(base, 99),
            "p999": pct(xs, 99.9) - pct(base, 99.9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5000, help="sequential chat calls per target")
    ap.add_argument("--stream-rounds", type=int, default=1000, help="streamed calls per target")
    ap.add_argument("--load-seconds", type=float, default=5.0, help="one wrk window")
    ap.add_argument("--load-rounds", type=int, default=3, help="wrk windows per target")
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--servers", action="store_true",
                    help="also ragtoll on uvicorn and hypercorn, and the floors on granian (ASGI and RSGI)")
    ap.add_argument("--probe", action="store_true", help="run ragtoll under tail_probe.py (writes results/probe-*.json)")
    ap.add_argument("--only", help="comma-separated target names (direct and the reference floor always run)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PYTHON",
                    help="also run ragtoll with this interpreter (an older checkout's venv)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE,...",
                    help="also run ragtoll with these environment variables (RAGTOLL_* config, OTEL_*)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.stream_rounds, args.load_seconds, args.load_rounds = 500, 100, 2.0, 1
    if not shutil.which("wrk"):
        sys.exit("bench_tail needs wrk (apt-get install wrk)")
    tmp = Path(tempfile.mkdtemp())
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    up_port = free_port()
    up = Target("direct", "", uvicorn_cmd("upstream_app:app", up_port), {"UPSTREAM_STREAM_GAP_S": STREAM_GAP_S},
                up_port)
    upstream = f"http://127.0.0.1:{up_port}"
    # ragtoll exports every span over OTLP/HTTP to the upstream process, which accepts and drops them
    export = {"OTEL_EXPORTER_OTLP_ENDPOINT": upstream, "OTEL_METRICS_EXPORTER": "none"}
    floor_env = {"FLOOR_UPSTREAM": upstream}
    targets = [up]
    for client in ("httpx", "httpx2+aiohttp"):
        port = free_port()
        targets.append(Target(f"floor-{client}", "/p", uvicorn_cmd("floor_app:app", port),
                              {**floor_env, "FLOOR_CLIENT": client}, port))

    def ragtoll(name: str, python: str = sys.executable, env: dict[str, str] | None = None) -> Target:
        port = free_port()
        cfg = ragtoll_config(tmp, name, port, upstream)
        run = [python, str(HERE / "tail_probe.py"), str(results / f"probe-{name}.json")] if args.probe else \
            [python, "-m", "ragtoll.proxy"]
        return Target(name, "/openai", [*run, "serve", "--config", str(cfg)], {**export, **(env or {})}, port)

    targets.append(ragtoll("ragtoll"))
    if args.servers:
        for client in ("httpx", "httpx2+aiohttp"):
            for interface in ("asgi", "rsgi"):
                port = free_port()
                app = "floor_app:app" if interface == "asgi" else "floor_rsgi:app"
                targets.append(Target(f"floor-{client}@granian-{interface}", "/p",
                                      [sys.executable, "granian_app.py", app, str(port), interface],
                                      {**floor_env, "FLOOR_CLIENT": client}, port))
        for server in ("uvicorn", "hypercorn", "granian-rsgi-adapter"):
            port = free_port()
            cfg = ragtoll_config(tmp, f"ragtoll-{server}", port, upstream)
            cmd = {"uvicorn": uvicorn_cmd("ragtoll_uvicorn:app", port, "--factory"),
                   "hypercorn": [sys.executable, "-m", "hypercorn", "ragtoll_uvicorn:app()", "--bind",
                                 f"127.0.0.1:{port}", "--worker-class", "uvloop", "--log-level", "warning"],
                   # the experiment of asgi_on_rsgi.py: not shippable (no raw path), measured for the record
                   "granian-rsgi-adapter": [sys.executable, "granian_app.py", "ragtoll_uvicorn:app()", str(port),
                                            "rsgi-adapter"]}[server]
            targets.append(Target(f"ragtoll@{server}", "/openai", cmd, {**export, "RAGTOLL_CONFIG": str(cfg)}, port))
    for spec in args.also:
        name, _, python = spec.partition("=")
        targets.append(ragtoll(name, python))
    for spec in args.variant:
        name, _, assignments = spec.partition(":")
        targets.append(ragtoll(name, env=dict(a.split("=", 1) for a in assignments.split(",") if a)))
    if args.only:
        keep = {"direct", REFERENCE, *args.only.split(",")}
        targets = [t for t in targets if t.name in keep]
    load_before = os.getloadavg()
    started = time.monotonic()
    try:
        for t in targets:
            t.start()
        seq, seq_cpu = asyncio.run(sequential(targets, args.rounds, warmup=200))
        stream = asyncio.run(streaming(targets, args.stream_rounds, warmup=20))
        loaded = load(targets, args.load_seconds, args.load_rounds, args.conns)
    finally:
        for t in reversed(targets):  # the proxies first: they flush their spans to the upstream's sink
            t.stop()
    report(targets, seq, seq_cpu, stream, loaded, args, load_before, time.monotonic() - started, results)


def report(targets: list[Target], seq: dict[str, list[float]], seq_cpu: dict[str, tuple[float, float]],
           stream: dict[str, list[float]], loaded: dict[str, dict[str, float]], args: argparse.Namespace,
           load_before: tuple[float, float, float], took_s: float, results: Path) -> None:
    rows: dict[str, dict[str, float]] = {}
    for t in targets:
        if t.name == "direct":
            continue
        a, s = added(seq[t.name], seq["direct"]), added(stream[t.name], stream["direct"])
        rows[t.name] = {**{f"add_{k}": v for k, v in a.items()}, **{f"event_{k}": v for k, v in s.items()},
                        "cpu_seq_ms": seq_cpu[t.name][0], "cpu_seq_own_ms": seq_cpu[t.name][1],
                        **{f"load_{k}": v for k, v in loaded[t.name].items()}}
    ref = rows[REFERENCE]

    def x(name: str, key: str) -> str:
        return f"{rows[name][key] / ref[key]:.2f}" if ref[key] > 0 else "-"

    print(f"\nragtoll tail benchmark ({'quick' if args.quick else 'full'}: {args.rounds} sequential calls, "
          f"{args.stream_rounds} streams per target, {args.load_rounds}x{args.load_seconds:g} s at {args.conns} "
          f"connections; load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; {took_s:.0f} s)")
    print(f"direct: p50 {statistics.median(seq['direct']):.3f} p99 {pct(seq['direct'], 99):.3f} p99.9 "
          f"{pct(seq['direct'], 99.9):.3f} ms; first event p50 {statistics.median(stream['direct']):.3f} ms")
    head = (f"{'target':<30}{'+p50':>7}{'+p99':>7}{'+p99.9':>8}{'event+p50':>10}{'+p99':>7}{'+p99.9':>8}"
            f"{'CPU seq':>8}{'(own)':>7}{'req/s':>7}{'CPU@16':>7}{'(own)':>7}{'p50@16':>7}{'p99@16':>7}{'p99.9@16':>9}")
    print(head)
    for name, r in rows.items():
        print(f"{name:<30}{r['add_p50']:>7.3f}{r['add_p99']:>7.3f}{r['add_p999']:>8.3f}{r['event_p50']:>10.3f}"
              f"{r['event_p99']:>7.3f}{r['event_p999']:>8.3f}{r['cpu_seq_ms']:>8.3f}{r['cpu_seq_own_ms']:>7.3f}"
              f"{r['load_rps']:>7.0f}{r['load_cpu_ms']:>7.3f}{r['load_cpu_own_ms']:>7.3f}{r['load_p50']:>7.2f}"
              f"{r['load_p99']:>7.2f}{r['load_p999']:>9.2f}"
              + (f"  ({r['load_failed']:.0f} failed under load)" if r["load_failed"] else ""))
    print(f"\nratios to {REFERENCE} (targets: p50 <= 1.3, p99 <= 1.5, CPU <= 1.3, event <= 1.3, req/s >= 1.0)")
    print(f"{'target':<30}{'+p50':>7}{'+p99':>7}{'+p99.9':>8}{'event':>7}{'CPU seq':>8}{'CPU@16':>7}{'req/s':>7}")
    for name in rows:
        if name != REFERENCE:
            print(f"{name:<30}{x(name, 'add_p50'):>7}{x(name, 'add_p99'):>7}{x(name, 'add_p999'):>8}"
                  f"{x(name, 'event_p50'):>7}{x(name, 'cpu_seq_ms'):>8}{x(name, 'load_cpu_ms'):>7}"
                  f"{x(name, 'load_rps'):>7}")
    print("(ms; +pNN = added over direct, sequential on one connection; event = a streamed call's first event, "
          "added over direct; CPU = ms of the target's process tree per call, sequential and at 16 connections "
          "((own): the target's process without its export process); "
          "@16 = wrk's latency percentiles under load, median of the windows)")
    (results / "tail.json").write_text(json.dumps(
        {"rows": rows, "load_average": load_before, "args": vars(args),
         "direct": {"p50": statistics.median(seq["direct"]), "p99": pct(seq["direct"], 99),
                    "p999": pct(seq["direct"], 99.9), "event_p50": statistics.median(stream["direct"])}}, indent=2))


if __name__ == "__main__":
    main()
