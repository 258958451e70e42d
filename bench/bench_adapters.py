"""Adapter benchmark: parse + prompt-token count per chat call (4 KB and 64 KB prompts), and the
per-chunk cost of reading usage from an SSE stream (what the pipeline adds before each chunk,
the first one included, is sent on to the client).

    python bench/bench_adapters.py           # full run (~20 s)
    python bench/bench_adapters.py --quick   # smoke run

"cold": every prompt text is new (nothing memoised); "warm": the agent re-sends a conversation
whose earlier messages were counted in a previous step (the common agent loop). Targets:
parse + count <= 100 us (4 KB) and <= 1 ms (64 KB); SSE reading adds no measurable TTFB.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from ragtoll.proxy.adapters.openai import OpenAIAdapter
from ragtoll.proxy.config import UpstreamConfig
from ragtoll.proxy.core import tokens

HERE = Path(__file__).parent
UPSTREAM = UpstreamConfig(name="openai", kind="llm", url="http://127.0.0.1:1", api="openai")
HEADERS = {"content-type": "application/json"}
WORDS = ("refund window annual plan invoice customer policy the of and to in for is on that by with "  # noqa: SIM905
         "retrieval evidence chunk context budget token agent step query answer 2024 v3.1 C++ 42%").split()


def text(n_bytes: int, seed: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_bytes:
        out.append(rng.choice(WORDS))
        size += len(out[-1]) + 1
    return " ".join(out)[:n_bytes]


def chat_body(size: int, seed: int, messages: int = 8) -> bytes:
    per = size // messages
    msgs: list[dict[str, Any]] = [{"role": "system", "content": text(per, seed)}]
    for i in range(1, messages):
        msgs.append({"role": "user" if i % 2 else "assistant", "content": text(per, seed * 31 + i)})
    return orjson.dumps({"model": "gpt-4o-mini", "messages": msgs, "max_tokens": 256})


def time_parse(bodies: list[bytes], repeat_each: int) -> list[float]:
    ad = OpenAIAdapter(UPSTREAM)
    samples = []
    for body in bodies:
        for _ in range(repeat_each):
            t0 = time.perf_counter()
            ad.parse_request("POST", "/v1/chat/completions", HEADERS, body)
            samples.append(time.perf_counter() - t0)
    return samples


def sse_events(n: int) -> list[bytes]:
    events = []
    for i in range(n):
        doc = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
               "choices": [{"index": 0, "delta": {"content": f" tok{i % 50}"}, "finish_reason": None}]}
        events.append(b"data: " + orjson.dumps(doc) + b"\n\n")
    events.append(b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini",'
                  b'"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":%d,"total_tokens":9}}\n\n' % n)
    return events + [b"data: [DONE]\n\n"]


def time_stream(streams: int, events: int) -> tuple[list[float], list[float]]:
    ad = OpenAIAdapter(UPSTREAM)
    call = ad.parse_request("POST", "/v1/chat/completions", HEADERS,
                            b'{"model":"gpt-4o-mini","stream":true,"messages":[]}')
    firsts, per_event = [], []
    body = sse_events(events)
    for _ in range(streams):
        obs = ad.observer(call, 200, {"content-type": "text/event-stream"})
        for i, chunk in enumerate(body):
            t0 = time.perf_counter()
            obs.feed(chunk, False)
            dt = time.perf_counter() - t0
            (firsts if i == 0 else per_event).append(dt)
        obs.feed(b"", True)
        assert obs.observation.usage is not None
    return firsts, per_event


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 20 if args.quick else 200
    t0 = time.perf_counter()
    tokens.warm()
    warm_s = time.perf_counter() - t0
    results: dict[str, Any] = {"encodings_build_s": round(warm_s, 3)}
    for label, size in (("4KB", 4096), ("64KB", 65536)):
        cold = time_parse([chat_body(size, seed) for seed in range(n)], 1)
        warm_body = chat_body(size, 10_000)
        time_parse([warm_body], 1)  # the previous step counted these messages
        warm = time_parse([warm_body], n)
        results[label] = {
            "cold_p50_us": round(pct(cold, 0.5), 1), "cold_p99_us": round(pct(cold, 0.99), 1),
            "warm_p50_us": round(pct(warm, 0.5), 1), "warm_p99_us": round(pct(warm, 0.99), 1),
        }
    firsts, per_event = time_stream(n, 200)
    results["sse"] = {"first_chunk_p50_us": round(pct(firsts, 0.5), 1),
                      "first_chunk_p99_us": round(pct(firsts, 0.99), 1),
                      "per_event_p50_us": round(pct(per_event, 0.5), 1),
                      "per_event_p99_us": round(pct(per_event, 0.99), 1),
                      "mean_us": round(statistics.fmean(per_event) * 1e6, 1)}
    print(json.dumps(results, indent=2))
    if not args.quick:
        out = HERE / "results" / "adapters.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"written to {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
