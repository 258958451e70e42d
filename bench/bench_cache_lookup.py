"""What an evidence-cache lookup adds on a miss and on a served hit, per embedder: p50/p95 over the eval stream.

    python bench/bench_cache_lookup.py [--runs 7] [--out bench/results/cache_lookup.json]

Replays the labelled queries of bench/data/cache_eval.json (shuffled, one order per run) through
EvidenceCache (memory store, the vetoes and the shipped model at the configured threshold and
`max_error`); a miss files live retrieval's evidence and scores, as the proxy does after the upstream
answers; a semantic hit is timed apart (`hit p50/p95`). Lookup time is measured inside
`EvidenceCache.lookup` (partition, exact tier, lexical prefilter, embedding, similarity scan,
verification, ACL). Each run replays every variant once, in rotated order, so machine noise (the
2-core machine is shared) falls on all of them; the report gives the median over runs of each
run's percentiles. A ticker coroutine runs beside the lookups and records how late the event loop
wakes it (what an inline embedding costs every other in-flight request). A benchmark, not a test.

Variants: `none`; `local` as the proxy runs it (int8 products, one worker thread); `local-inline`
(int8, on the event loop); `local-float-inline` (the shipped float graph on the event loop: the
state before the int8 rewrite); `local-prewarmed` (every vector already in the embedder's exact
cache: what the rest of the lookup costs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from eval_cache import DATA, K, Retriever, metadata_vocab
from ragtoll.proxy.cache import calibration
from ragtoll.proxy.cache.audit import Auditor
from ragtoll.proxy.cache.embedders import CachedEmbedder, Embedder, LocalEmbedder, LocalModel, NoEmbedder
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.cache.partition import normalize_query
from ragtoll.proxy.config import CacheConfig
from ragtoll.proxy.model import Principal
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore

TICK_S = 0.001


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else 0.0


async def replay(queries: list[dict[str, Any]], live: dict[str, Any], docs_by_id: dict[str, Any],
                 embedder: Embedder, threshold: float) -> dict[str, Any]:
    cfg = CacheConfig()
    cache = EvidenceCache(MemoryEvidenceStore(), embedder=embedder, similarity=threshold,
                          calibration=calibration.shipped() if cfg.max_error < 1 else None,
                          auditor=Auditor(0.0, threshold, max_error=cfg.max_error))
    principal = Principal("bench", frozenset({"staff"}))
    lags: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            t0 = time.perf_counter()
            await asyncio.sleep(TICK_S)
            lags.append((time.perf_counter() - t0 - TICK_S) * 1000)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    miss_ms: list[float] = []
    embedded_ms: list[float] = []
    hit_ms: list[float] = []
    for q in queries:
        lk = await cache.lookup(Query(q["domain"], q["text"], q["filters"], K, principal))
        if lk.entry is not None:
            if lk.tier == "semantic":
                hit_ms.append(lk.seconds * 1000)
            continue
        miss_ms.append(lk.seconds * 1000)
        if lk.vector is not None:
            embedded_ms.append(lk.seconds * 1000)
        ids, scores = live[q["text"]]
        body = json.dumps({"results": [{"id": i} for i in ids]}).encode()
        await cache.store_evidence(lk, chunk_ids=ids, acls=[("public",)] * K, body=body,
                                   vocab=metadata_vocab(docs_by_id, ids), scores=scores)
        await asyncio.sleep(0)  # one request's work ends here: other tasks may run (the memory store never yields)
    done = True
    await tick
    return {"misses": len(miss_ms), "embedded": len(embedded_ms),
            "miss_p50": pct(miss_ms, 50), "miss_p95": pct(miss_ms, 95), "miss_p99": pct(miss_ms, 99),
            "embedded_p50": pct(embedded_ms, 50), "embedded_p95": pct(embedded_ms, 95),
            "hits": len(hit_ms), "hit_p50": pct(hit_ms, 50), "hit_p95": pct(hit_ms, 95),
            "loop_lag_p99": pct(lags, 99), "loop_lag_max": max(lags) if lags else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threshold", type=float, default=CacheConfig().similarity)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "cache_lookup.json"))
    args = ap.parse_args(argv)
    data = json.loads(DATA.read_text())
    docs_by_id = {d["id"]: d for d in data["docs"]}
    float_model = LocalModel.shared(int8=False)
    int8_model = LocalModel.shared(int8=True)
    retriever = Retriever(data["docs"], float_model)
    live = {q["text"]: retriever.search_scored(q["text"], q["domain"], q["filters"]) for q in data["queries"]}
    variants: dict[str, Any] = {
        "none": lambda: NoEmbedder(),
        "local": lambda: CachedEmbedder(LocalEmbedder(int8_model)),
        "local-inline": lambda: CachedEmbedder(LocalEmbedder(int8_model, offload=False)),
        "local-float-inline": lambda: CachedEmbedder(LocalEmbedder(float_model, offload=False)),
        "local-prewarmed": lambda: warm,
    }
    # every query's vector already in the embedder's exact cache: what a lookup costs besides the model
    warm = CachedEmbedder(LocalEmbedder(int8_model, offload=False))
    for q in data["queries"]:
        asyncio.run(warm.embed(normalize_query(q["text"])))
    names = list(variants)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.runs):
        qs = list(data["queries"])
        random.Random(r).shuffle(qs)
        for n in names[r % len(names):] + names[: r % len(names)]:
            runs[n].append(asyncio.run(replay(qs, live, docs_by_id, variants[n](), args.threshold)))
    report: dict[str, Any] = {"queries": len(data["queries"]), "runs": args.runs, "threshold": args.threshold,
                              "variants": {}}
    print(f"{len(data['queries'])} queries, {args.runs} runs; medians over runs of each run's percentile (ms)")
    print(f"{'variant':<20}{'miss p50':>9}{'miss p95':>9}{'p95 range':>14}{'embedded':>9}{'emb p50':>9}"
          f"{'emb p95':>9}{'hits':>6}{'hit p50':>9}{'hit p95':>9}{'loop lag p99':>13}")
    for n in names:
        rs = runs[n]
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0]}
        med["miss_p95_runs"] = [round(x["miss_p95"], 3) for x in rs]
        report["variants"][n] = med
        lo, hi = min(med["miss_p95_runs"]), max(med["miss_p95_runs"])
        share = med["embedded"] / max(1, med["misses"])
        print(f"{n:<20}{med['miss_p50']:>9.3f}{med['miss_p95']:>9.3f}{f'{lo:.2f}-{hi:.2f}':>14}{share:>9.0%}"
              f"{med['embedded_p50']:>9.3f}{med['embedded_p95']:>9.3f}{med['hits']:>6.0f}{med['hit_p50']:>9.3f}"
              f"{med['hit_p95']:>9.3f}{med['loop_lag_p99']:>13.3f}")
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
