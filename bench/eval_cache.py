"""Evidence-cache evaluation on held-out domains: calibrated semantic hits vs plain cosine thresholds.

    python bench/eval_cache.py [--seeds 3] [--splits tuning ...] [--out bench/results/cache_eval.json]

The labelled queries of bench/data/cache_eval.json (one route per domain) are split by domain in
bench/data/cache_eval_splits.json, fixed before any fitting: `tuning` (the model of P(wrong) and its
default bound are fitted and chosen there, by bench/fit_verifier.py), `held_out_a` and `held_out_b`
(never read while tuning). Each split is replayed as shuffled streams through ragtoll's EvidenceCache
(memory store, embedder `local` as the proxy runs it). A miss runs live retrieval (a hybrid BM25 +
MiniLM retriever over the whole corpus, the shipped float graph, top 5) and files its evidence with
the retrieval scores; a hit is right when live retrieval for the new query has the same top result
and >= 0.8 of the same top 5 *and* the two queries share an intent; else it is wrong, and a serve
across intents is also a near-miss serve. Served and wrong shares are of all queries, with Wilson 95%
intervals. Rules: plain cosine 0.85 / 0.90 / 0.95; the vetoes alone at the configured similarity;
the vetoes and the model at the configured `max_error`. Lookup latency: bench/bench_cache_lookup.py.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
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
from ragtoll.proxy.cache import calibration
from ragtoll.proxy.cache.audit import Auditor, wilson
from ragtoll.proxy.cache.embedders import CachedEmbedder, Embedder, LocalEmbedder, LocalModel
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.config import CacheConfig
from ragtoll.proxy.core.verify import Calibration
from ragtoll.proxy.model import Principal
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore

DATA = pathlib.Path(__file__).parent / "data" / "cache_eval.json"
SPLITS = "cache_eval_splits.json"  # beside DATA: tuning and held-out domains, fixed before any fit
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
        return self.search_scored(text, domain, filters)[0]

    def search_scored(self, text: str, domain: str,
                      filters: dict[str, Any] | None) -> tuple[list[str], list[float]]:
        """The top K ids and their scores, as a retrieval response carries them."""
        idx = [i for i, d in enumerate(self.docs) if d["domain"] == domain and
               all(d["metadata"].get(k) == v for k, v in (filters or {}).items())]
        qv = self.model.encode(text)
        q = terms(text)
        bm = np.array([self.bm25(q, i, len(self.docs)) for i in idx])
        bm = bm / bm.max() if bm.max() > 0 else bm
        dense = self.vecs[idx] @ qv
        score = 0.5 * dense + 0.5 * bm
        order = np.argsort(-score)[:K]
        return [self.docs[idx[j]]["id"] for j in order], [float(score[j]) for j in order]


def agrees(cached: list[str], live: list[str]) -> bool:
    """A served answer is right by live retrieval: the same top result and >= 0.8 of the same top K."""
    return bool(cached and live) and cached[0] == live[0] and \
        len(set(cached) & set(live)) / max(len(cached), len(live)) >= 0.8


def metadata_vocab(docs_by_id: dict[str, dict[str, Any]], ids: list[str]) -> list[str]:
    words: set[str] = set()
    for i in ids:
        for v in docs_by_id[i]["metadata"].values():
            if isinstance(v, str) and len(v.split()) <= 2:
                words.update(w.casefold() for w in v.replace("_", " ").split())
    return sorted(words)


MAX_WRONG_UPPER = 0.01  # the target: wrong serves' upper 95% Wilson bound, as a share of queries
COSINES = (0.85, 0.90, 0.95)
ALL_SPLITS = ("tuning", "held_out_a", "held_out_b")


def intent_key(q: dict[str, Any]) -> str:
    return json.dumps([q["domain"], q["intent"]], sort_keys=True)


async def run(queries: list[dict[str, Any]], docs_by_id: dict[str, dict[str, Any]], cache: EvidenceCache,
              live: dict[str, list[str]], scores: dict[str, list[float]] | None = None) -> dict[str, Any]:
    intent_of: dict[str, str] = {}
    principal = Principal("eval", frozenset({"staff"}))
    served = wrong_live = near_miss = same_intent = correct_live = embedded = misses = right = 0
    refusals: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    for q in queries:
        intent = intent_key(q)
        lk = await cache.lookup(Query(q["domain"], q["text"], q["filters"], K, principal))
        live_ids = live[q["text"]]
        if lk.entry is not None:
            served += 1
            cached = list(lk.entry.chunk_ids)
            ok_live = agrees(cached, live_ids)
            same = intent_of[lk.entry.query] == intent
            right += ok_live and same
            correct_live += ok_live
            wrong_live += not ok_live
            same_intent += same
            near_miss += not same
            if not same or not ok_live:
                examples.append({"query": q["text"], "served_from": lk.entry.query, "tier": lk.tier,
                                 "similarity": round(lk.similarity or 0, 3), "live_ok": ok_live, "same_intent": same})
            continue
        misses += 1
        embedded += lk.vector is not None
        if lk.reason:
            refusals[lk.reason] += 1
        body = json.dumps({"results": [{"id": i, "text": docs_by_id[i]["text"]} for i in live_ids]}).encode()
        await cache.store_evidence(lk, chunk_ids=live_ids, acls=[("public",)] * K, body=body,
                                   vocab=metadata_vocab(docs_by_id, live_ids),
                                   scores=scores.get(q["text"]) if scores else None)
        intent_of[lk.norm] = intent
    n = len(queries)
    return {"queries": n, "served": served, "right": right, "served_share": served / n, "correct_live": correct_live,
            "wrong_live": wrong_live, "wrong_live_share": wrong_live / n, "near_miss_served": near_miss,
            "wrong_label_share": near_miss / n, "same_intent_served": same_intent,
            "misses_embedded_share": embedded / max(1, misses),
            "miss_reasons": dict(refusals.most_common()), "wrong_examples": examples[:15]}


def evaluate(queries: list[dict[str, Any]], docs_by_id: dict[str, Any], live: dict[str, list[str]],
             embedder: Embedder, seeds: int, scores: dict[str, list[float]], *, threshold: float,
             verify_on: bool = True, calibration: Calibration | None = None, max_error: float = 1.0,
             intent_floor: float | None = None) -> dict[str, Any]:
    """Means over `seeds` shuffled stream orders, the worst order's near-miss serves, and Wilson 95%
    intervals of the served and wrong shares (on the mean counts over the split's queries)."""
    runs = []
    for seed in range(seeds):
        qs = list(queries)
        random.Random(seed).shuffle(qs)
        cache = EvidenceCache(MemoryEvidenceStore(), embedder=embedder, similarity=threshold,
                              reach=CacheConfig().reach if verify_on else 0.0,
                              verify_candidates=verify_on, min_top_margin=CacheConfig().min_top_margin,
                              calibration=calibration, intent_floor=intent_floor,
                              auditor=Auditor(0.0, threshold, max_error=max_error))
        runs.append(asyncio.run(run(qs, docs_by_id, cache, live, scores)))
    agg: dict[str, Any] = {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]
                           if isinstance(runs[0][k], (int, float))}
    n = agg["queries"]
    wrong = sum(r["served"] - r["right"] for r in runs) / len(runs)
    agg["wrong"] = wrong
    agg["wrong_share"] = wrong / n
    agg["served_ci"] = wilson(round(agg["served"]), int(n))
    agg["wrong_ci"] = wilson(round(wrong), int(n)) if wrong == round(wrong) else _wilson_frac(wrong, n)
    agg["worst_near_miss_served"] = max(r["near_miss_served"] for r in runs)
    agg["miss_reasons"] = runs[0]["miss_reasons"]
    agg["wrong_examples"] = runs[0]["wrong_examples"]
    return agg


def _wilson_frac(k: float, n: float) -> tuple[float, float]:
    return wilson(math.ceil(k), int(n))  # a fractional mean count: the upper bound rounded up, to be safe


def meets(r: dict[str, Any]) -> bool:
    return r["worst_near_miss_served"] == 0 and r["wrong_ci"][1] <= MAX_WRONG_UPPER and r["served_share"] >= 0.2


def row(name: str, r: dict[str, Any]) -> str:
    lo, hi = r["served_ci"]
    wlo, whi = r["wrong_ci"]
    return (f"{name:<34}{r['served_share']:>7.1%}{f'{lo:.1%}-{hi:.1%}':>14}{r['wrong_share']:>8.2%}"
            f"{f'{wlo:.2%}-{whi:.2%}':>14}{r['near_miss_served']:>7.1f}{r['worst_near_miss_served']:>6}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="shuffled stream orders per split")
    ap.add_argument("--out", default=str(pathlib.Path(__file__).parent / "results" / "cache_eval.json"))
    ap.add_argument("--splits", nargs="+", choices=ALL_SPLITS, default=list(ALL_SPLITS),
                    help="the splits to run and print (while tuning: `--splits tuning`, so held-out stays unseen)")
    args = ap.parse_args(argv)
    data = json.loads(DATA.read_text())
    splits = json.loads((DATA.parent / SPLITS).read_text())
    docs_by_id = {d["id"]: d for d in data["docs"]}
    # live retrieval stands for the user's stack: the shipped float graph, whatever ragtoll's embedder does
    retriever = Retriever(data["docs"], LocalModel.shared(int8=False))
    ranked = {q["text"]: retriever.search_scored(q["text"], q["domain"], q["filters"])
              for q in data["queries"]}
    live = {text: ids for text, (ids, _) in ranked.items()}
    scores = {text: s for text, (_, s) in ranked.items()}
    embedder = CachedEmbedder(LocalEmbedder(LocalModel.shared(), offload=False), size=100_000)
    cfg = CacheConfig()
    model = calibration.shipped()
    fitted = json.loads(importlib.resources.files("ragtoll.proxy.data").joinpath(calibration.FILE).read_text())
    report: dict[str, Any] = {"queries": len(data["queries"]), "docs": len(data["docs"]), "seeds": args.seeds,
                              "splits": {k: v for k, v in splits.items() if k != "note"},
                              "default_similarity": cfg.similarity, "default_max_error": cfg.max_error,
                              "results": {}}
    head = (f"{'rule':<34}{'served':>7}{'95% CI':>14}{'wrong':>8}{'95% CI':>14}{'near':>7}{'worst':>6}")
    for name in args.splits:
        qs = [q for q in data["queries"] if q["domain"] in set(splits[name])]
        rules: dict[str, Any] = {}
        for c in COSINES:
            rules[f"cosine {c:.2f}"] = evaluate(qs, docs_by_id, live, embedder, args.seeds, scores,
                                                threshold=c, verify_on=False)
        rules[f"vetoes, similarity {cfg.similarity:g}-{cfg.reach:g}"] = evaluate(qs, docs_by_id, live, embedder, args.seeds,
                                                                   scores, threshold=cfg.similarity)
        rules[f"vetoes + model, max_error {cfg.max_error:g}"] = evaluate(
            qs, docs_by_id, live, embedder, args.seeds, scores, threshold=cfg.similarity, calibration=model,
            max_error=cfg.max_error)
        report["results"][name] = rules
        print(f"\n{name}: {', '.join(sorted(splits[name]))}; {len(qs)} queries, "
              f"{len({intent_key(q) for q in qs})} intents; means over {args.seeds} orders "
              "(near: near-miss serves, worst: the worst order's)")
        print(head)
        for rule, r in rules.items():
            print(row(rule, r) + ("   meets" if not rule.startswith("cosine") and meets(r) else ""))
    report["fitted"] = {k: fitted.get(k) for k in ("fitted", "tuning_domains", "pairs", "max_error",
                                                   "similarity_floor", "intent_floor")}
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
