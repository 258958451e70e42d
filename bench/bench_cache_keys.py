"""What keying costs: an evidence-cache lookup on an exact hit and on a miss, and reading a request body.

    python bench/bench_cache_keys.py [--n 20000]

Lookup: `EvidenceCache.lookup` (memory store, embedder none: partition, normalisation, exact key,
store read, ACL and freshness on a hit), per call, median of 5 rounds, beside a bare
`MemoryEvidenceStore.get` of the same entry in the same run (the floor). Body: `adapters.base.json_body`
(JSON, and since issue 30 the duplicate-key check) beside a bare `orjson.loads` of the same bytes, for
a retrieval query, a 20 KB and a 130 KB chat request and an embeddings request of 3,000 floats.
Run it with another checkout's interpreter to compare before and after. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from ragtoll.proxy.adapters.base import json_body
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.model import Principal
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore

WHO = Principal("bench", frozenset({"staff"}))


def per_call_us(fn: Callable[[], Any], n: int) -> float:
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds)


async def per_call_async_us(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            await fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(rounds)


async def lookups(n: int) -> dict[str, float]:
    store = MemoryEvidenceStore()
    cache = EvidenceCache(store)
    text = "What is the refund window for annual Pro plans?"
    lk = await cache.lookup(Query("docs", text, {"plan": "pro"}, 5, WHO))
    await cache.store_evidence(lk, chunk_ids=["a", "b"], acls=[("staff",), ("staff",)], body=b'{"results": []}')
    assert (await cache.lookup(Query("docs", text, {"plan": "pro"}, 5, WHO))).hit
    misses = iter(range(10**9))
    return {
        "store_get_us": await per_call_async_us(lambda: store.get(lk.partition.key, lk.key), n),
        "lookup_hit_us": await per_call_async_us(lambda: cache.lookup(Query("docs", text, {"plan": "pro"}, 5, WHO)), n),
        "lookup_miss_us": await per_call_async_us(
            lambda: cache.lookup(Query("docs", f"another question {next(misses)}", {"plan": "pro"}, 5, WHO)), n),
    }


def bodies() -> dict[str, bytes]:
    rnd = random.Random(1)

    def chat(messages: int, size: int) -> bytes:
        msgs = [{"role": "user" if i % 2 else "assistant",
                 "content": "".join(rnd.choices(string.ascii_letters + " :", k=size)),
                 "tool_calls": [{"id": f"c{i}", "type": "function",
                                 "function": {"name": "search", "arguments": json.dumps({"q": "a: b", "k": 3})}}]}
                for i in range(messages)]
        return orjson.dumps({"model": "gpt-4o", "messages": msgs, "max_tokens": 100})

    return {
        "retrieval_56B": orjson.dumps({"query": "cats and dogs", "top_k": 5, "filter": {"a": 1}}),
        "chat_20KB": chat(10, 2000),
        "chat_130KB": chat(200, 500),
        "embeddings_58KB": orjson.dumps({"input": [rnd.random() for _ in range(3000)], "model": "e"}),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    args = parser.parse_args()
    out: dict[str, Any] = {"lookup": asyncio.run(lookups(args.n))}
    for name, raw in bodies().items():
        n = max(100, args.n * 1000 // len(raw))
        out[name] = {"orjson_loads_us": round(per_call_us(lambda r=raw: orjson.loads(r), n), 2),
                     "json_body_us": round(per_call_us(lambda r=raw: json_body(r), n), 2)}
    out["lookup"] = {k: round(v, 2) for k, v in out["lookup"].items()}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
