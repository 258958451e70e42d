"""How fast `/healthz` answers while the front door is attacked (the timings the tests only bound).

    python bench/bench_front_door.py

Runs the real `ragtoll serve` (header and body timeouts of 1 s) in front of a hostile upstream and,
for each attack of tests/proxy/test_front_door.py, probes `/healthz` on a new connection every
50 ms; prints the probes' p50, p99 and worst time per attack, and the proxy's CPU and peak RSS.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "tests"))
from support.hostile import HostileUpstream, gzip_bomb, normal_stream  # noqa: E402
from support.process import RagtollProcess  # noqa: E402
from support.servers import serve_in_thread  # noqa: E402

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": True}


def probe(port: int, stop: threading.Event, out: list[float]) -> None:
    import socket

    while not stop.is_set():
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            while s.recv(4096):
                pass
        out.append((time.perf_counter() - t0) * 1000)
        stop.wait(0.05)


async def trickle_heads(port: int, n: int, seconds: float) -> None:
    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.3)
            writer.close()
        except ConnectionError:
            pass

    await asyncio.gather(*(one() for _ in range(n)))


def stream(base: str, kind: str) -> None:
    with httpx.stream("POST", f"{base}/openai/v1/chat/completions", json=CHAT, headers={"x-hostile": kind},
                      timeout=120) as r:
        for _ in r.iter_raw():
            pass


def main() -> None:
    gzip_bomb(), normal_stream()
    attacks = {
        "idle (no attack)": lambda base, port: time.sleep(3),
        "300 connections trickling header bytes": lambda base, port: asyncio.run(trickle_heads(port, 300, 3)),
        "gzip bomb, buffered retrieval": lambda base, port: httpx.post(
            f"{base}/docs/search", json={"query": "q"}, headers={"x-hostile": "bomb"}, timeout=60),
        "gzip bomb, streamed": lambda base, port: stream(base, "bomb"),
        "one 20 MB SSE event": lambda base, port: stream(base, "endless"),
        "20 MB normal stream": lambda base, port: stream(base, "normal"),
    }
    tmp = Path(tempfile.mkdtemp())
    with serve_in_thread(HostileUpstream()) as hostile:
        config = {"server": {"header_timeout_s": 1.0, "body_timeout_s": 1.0}, "tasks": {"untracked": "per-call"},
                  "budgets": {"records_file": str(tmp / "r.jsonl")},
                  "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": hostile, "prefix": "/openai"},
                                {"name": "docs", "kind": "retrieval", "api": "json", "url": hostile,
                                 "prefix": "/docs"}]}
        with RagtollProcess(tmp, config) as rt:
            print(f"{'attack':<42}{'probes':>7}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'CPU s':>7}{'peak RSS MB':>12}")
            for name, attack in attacks.items():
                times: list[float] = []
                stop = threading.Event()
                prober = threading.Thread(target=probe, args=(rt.port, stop, times))
                cpu0 = rt.cpu_seconds()
                prober.start()
                attack(rt.base, rt.port)
                stop.set()
                prober.join()
                times.sort()
                print(f"{name:<42}{len(times):>7}{statistics.median(times):>8.2f}"
                      f"{times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]:>8.2f}{times[-1]:>8.2f}"
                      f"{rt.cpu_seconds() - cpu0:>7.2f}{rt.status('VmHWM') / 1024:>12.0f}")


if __name__ == "__main__":
    main()
