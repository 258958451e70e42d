"""Evidence-cache evaluation: verified semantic hits vs a plain cosine threshold, same model.

    python bench/eval_cache.py [--threshold 0.85] [--seeds 3] [--out bench/results/cache_eval.json]

Replays the labelled queries of bench/data/cache_eval.json (several domains, one route each) in a
shuffled stream through ragtoll's EvidenceCache (memory store, embedder `local`). A miss runs live
retrieval (a hybrid BM25 + MiniLM retriever over the corpus, top 5) and files its evidence; a hit
is scored twice: against live retrieval for the new query (correct only with the same top result
and >= 0.8 of the same top 5) and against the labels (a serve across intents is a near-miss serve).
Also measures lookup latency on a miss for `local` and `none`. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import pathlib
import random
import re
import sys
from collections import Counter
from typing import Any

import numpy as np
from ragtoll.proxy.cache.embedders import CachedEmbedder, LocalEmbedder, LocalModel, NoEmbedder
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.cache.principal import Principal
from ragtoll.proxy.cache.store_memory import MemoryEvidenceStore

DATA = pathlib.Path(__file__).parent / "data" / "cache_eval.json"
K = 5
_WORD = re.compile(r"\w+")


def terms(text: str) -> list[str]:
    """Stemmed words and adjacent-word bigrams (phrase matching tells "Paris to London" from the reverse)."""
    words = [_stem(w) for w in _WORD.findall(text.lower())]
    return words + [f"{a}_{b}" for a, b in itertools.pairwise(words)]


def _stem(w: str) -> str:
    for suffix in ("ing", "ed", "es", "s", "e"):
        if w.endswith(suffix) and len(w) > len(suffix) + 2:
            return w[: -len(suffix)]
    return w


class Retriever:
    """Live retrieval: 0.5 x dense cosine + 0.5 x BM25 over words and bigrams (normalised), in a domain."""

    def __init__(self, docs: list[dict[str, Any]], model: LocalModel) -> None:
        self.docs = docs
        self.vecs = np.stack([model.encode(d["text"]) for d in docs])
        self.model = model
        self.toks = [terms(d["text"]) for d in docs]
        self.df: Counter[str] = Counter(w for t in self.toks for w in set(t))
        self.avg = sum(len(t) for t in self.toks) / len(self.toks)

    def bm25(self, q: list[str], i: int, n: int) -> float:
        tf = Counter(self.toks[i])
        score = 0.0
        for w in set(q):
            if w in tf:
                idf = math.log(1 + (n - self.df[w] + 0.5) / (self.df[w] + 0.5))
                score += idf * tf[w] * 2.2 / (tf[w] + 1.2 * (0.25 + 0.75 * len(self.toks[i]) / self.avg))
        return score

    def search(self, text: str, domain: str, filters: dict[str, Any] | None) -> list[str]:
        idx = [i for i, d in enumerate(self.docs) if d["domain"] == domain and
               all(d["metadata"].get(k) == v for k, v in (filters or {}).items())]
        qv = self.model.encode(text)
        q = terms(text)
        bm = np.array([self.bm25(q, i, len(self.docs)) for i in idx])
        bm = bm / bm.max() if bm.max() > 0 else bm
        dense = self.vecs[idx] @ qv
        score = 0.5 * dense + 0.5 * bm
        order = np.argsort(-score)[:K]
        return [self.docs[idx[j]]["id"] for j in order]


def metadata_vocab(docs_by_id: dict[str, dict[str, Any]], ids: list[str]) -> list[str]:
    words: set[str] = set()
    for i in ids:
        for v in docs_by_id[i]["metadata"].values():
            if isinstance(v, str) and len(v.split()) <= 2:
                words.update(w.casefold() for w in v.replace("_", " ").split())
    return sorted(words)


async def run(queries: list[dict[str, Any]], retriever: Retriever, docs_by_id: dict[str, dict[str, Any]],
              cache: EvidenceCache, live: dict[str, list[str]]) -> dict[str, Any]:
    intent_of: dict[str, str] = {}
    principal = Principal("eval", frozenset({"staff"}))
    served = wrong_live = near_miss = same_intent = correct_live = embedded = 0
    refusals: Counter[str] = Counter()
    miss_ms: list[float] = []
    examples: list[dict[str, Any]] = []
    for q in queries:
        intent = json.dumps([q["domain"], q["intent"]], sort_keys=True)
        lk = await cache.lookup(Query(q["domain"], q["text"], q["filters"], K, principal))
        live_ids = live[q["text"]]
        if lk.entry is not None:
            served += 1
            cached = list(lk.entry.chunk_ids)
            ok_live = cached[0] == live_ids[0] and len(set(cached) & set(live_ids)) / max(len(cached), len(live_ids)) >= 0.8
            same = intent_of[lk.entry.query] == intent
            correct_live += ok_live
            wrong_live += not ok_live
            same_intent += same
            near_miss += not same
            if not same or not ok_live:
                examples.append({"query": q["text"], "served_from": lk.entry.query, "tier": lk.tier,
                                 "similarity": round(lk.similarity or 0, 3), "live_ok": ok_live, "same_intent": same})
            continue
        miss_ms.append(lk.seconds * 1000)
        embedded += lk.vector is not None
        if lk.reason:
            refusals[lk.reason] += 1
        body = json.dumps({"results": [{"id": i, "text": docs_by_id[i]["text"]} for i in live_ids]}).encode()
        await cache.store_evidence(lk, chunk_ids=live_ids, acls=[("public",)] * K, body=body,
                                   vocab=metadata_vocab(docs_by_id, live_ids))
        intent_of[lk.norm] = intent
    n = len(queries)
    return {"queries": n, "served": served, "served_share": served / n, "correct_live": correct_live,
            "wrong_live": wrong_live, "wrong_live_share": wrong_live / n, "near_miss_served": near_miss,
            "wrong_label_share": near_miss / n, "same_intent_served": same_intent,
            "miss_lookup_ms_p50": float(np.percentile(miss_ms, 50)) if miss_ms else 0.0,
            "miss_lookup_ms_p95": float(np.percentile(miss_ms, 95)) if miss_ms else 0.0,
            "misses_embedded_share": embedded / max(1, n - served),
            "miss_reasons": dict(refusals.most_common()), "wrong_examples": examples[:15]}


async def latency_none(queries: list[dict[str, Any]]) -> dict[str, float]:
    cache = EvidenceCache(MemoryEvidenceStore(), embedder=NoEmbedder())
    principal = Principal("eval")
    ms: list[float] = []
    for q in queries:
        lk = await cache.lookup(Query(q["domain"], q["text"] + " (latency)", q["filters"], K, principal))
        ms.append(lk.seconds * 1000)
        await cache.store_evidence(lk, chunk_ids=["a"], acls=[("public",)], body=b"{}")
    return {"miss_lookup_ms_p50": float(np.percentile(ms, 50)), "miss_lookup_ms_p95": float(np.percentile(ms, 95))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threshold", type=float, default=0.85, help="candidate cut for the verified rule")
    ap.add_argument("--seeds", type=int, default=3, help="shuffled stream orders to average over")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "cache_eval.json"))
    args = ap.parse_args(argv)
    data = json.loads(DATA.read_text())
    docs_by_id = {d["id"]: d for d in data["docs"]}
    model = LocalModel.shared()
    retriever = Retriever(data["docs"], model)
    live = {q["text"]: retriever.search(q["text"], q["domain"], q["filters"]) for q in data["queries"]}
    rules = {"verified": (args.threshold, True), "cosine_0.9": (0.9, False)}
    report: dict[str, Any] = {"queries": len(data["queries"]), "docs": len(data["docs"]), "seeds": args.seeds,
                              "rules": {}}
    for name, (threshold, verify_on) in rules.items():
        runs = []
        for seed in range(args.seeds):
            qs = list(data["queries"])
            random.Random(seed).shuffle(qs)
            # a fresh embedder cache per run, so the miss latency includes embedding the query
            cache = EvidenceCache(MemoryEvidenceStore(), embedder=CachedEmbedder(LocalEmbedder(model)),
                                  similarity=threshold, verify_candidates=verify_on)
            runs.append(asyncio.run(run(qs, retriever, docs_by_id, cache, live)))
        agg = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}
        agg["miss_reasons"] = runs[0]["miss_reasons"]
        agg["wrong_examples"] = runs[0]["wrong_examples"]
        report["rules"][name] = agg
    report["none"] = asyncio.run(latency_none(data["queries"]))
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{report['queries']} queries over {report['docs']} docs, {args.seeds} stream orders (means)")
    print(f"{'rule':<12}{'served':>8}{'correct':>9}{'wrong(live)':>13}{'near-miss':>11}{'same-intent':>13}{'miss p95 ms':>13}")
    for name, r in report["rules"].items():
        print(f"{name:<12}{r['served_share']:>8.1%}{r['correct_live']:>9.1f}{r['wrong_live_share']:>13.2%}"
              f"{r['near_miss_served']:>11.1f}{r['same_intent_served']:>13.1f}{r['miss_lookup_ms_p95']:>13.2f}")
    print(f"none        miss lookup p95 {report['none']['miss_lookup_ms_p95']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
