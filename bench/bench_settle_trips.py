"""Store round trips and Redis server time per call: does settling a call's context-economy
counts with it cost a store command? One ragtoll on a fresh redis-server (spawned on loopback)
serves tasks of a search (adaptive depth trims it) and three LLM calls whose prompts carry its
first chunk; Redis's own INFO commandstats says which commands ran, how often and how long
(the commands a script runs are counted too, each under its own name).

    python bench/bench_settle_trips.py [--tasks 200]

Run it with main's python and this branch's to compare (the script imports whichever ragtoll
the interpreter has; the test support modules come from this checkout's tests/).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from support.redis_server import start_redis
from support.servers import serve_in_thread
from support.upstream import UpstreamApp

QUERY = "refund policy for annual plans in the enterprise tier"


def _stats(client: redis.Redis) -> dict[str, dict[str, float]]:
    return {k: v for k, v in client.info("commandstats").items() if k not in ("cmdstat_info",)}


def run(tasks: int) -> None:
    server = start_redis()
    try:
        with serve_in_thread(UpstreamApp()) as up:
            raw: dict[str, Any] = {
                "store": server.url, "budgets": {"records_stream": "ragtoll:records:bench"},
                "context": {"prompt_cache_key": "task", "depth_gap": 0, "depth_floor": 0.85},
                "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": up, "prefix": "/openai"},
                              {"name": "docs", "kind": "retrieval", "api": "json", "url": up, "prefix": "/docs"}]}
            with serve_in_thread(build_app(config.parse(raw))) as base, httpx.Client(timeout=10) as http:
                client = redis.Redis.from_url(server.url)
                before = _stats(client)
                chat = {"model": "gpt-4o-mini", "messages": [
                    {"role": "user", "content": f"Context:\nchunk 0 about {QUERY}\nCan I get a refund?"}]}
                for _ in range(tasks):
                    tid = {"x-ragtoll-task-id": f"bench-{uuid.uuid4().hex}"}
                    http.post(f"{base}/docs/search", json={"query": QUERY, "top_k": 5}, headers=tid)
                    for _ in range(3):
                        http.post(f"{base}/openai/v1/chat/completions", json=chat, headers=tid)
                after = _stats(client)
    finally:
        server.stop()
    calls = tasks * 4
    print(f"{tasks} tasks, {calls} calls (1 search + 3 LLM calls each)")
    total = 0.0
    for name in sorted(after):
        n = after[name]["calls"] - before.get(name, {}).get("calls", 0)
        usec = after[name]["usec"] - before.get(name, {}).get("usec", 0)
        if n:
            total += n
            print(f"  {name[8:]:<10} {n / calls:6.2f} per call, {usec / n:7.1f} us each on the server")
    print(f"  all        {total / calls:6.2f} commands per call (a script's own commands included: one")
    print("  round trip is one evalsha, or one plain command the scripts do not run: mget, set)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=200)
    run(ap.parse_args().tasks)


if __name__ == "__main__":
    main()
