"""Fits the semantic tier's model of P(wrong) on the tuning domains only, and chooses the default bound.

    python bench/fit_verifier.py [--seeds 3] [--out proxy/data/cache_verifier.json]

Reads only the `tuning` domains of bench/data/cache_eval_splits.json (fixed before any fit); the
held-out domains are never loaded here. Each tuning domain's queries are replayed as shuffled streams
through ragtoll's EvidenceCache (memory store, the local int8 embedder, candidates from the
similarity and content-overlap `FLOORS` up) with every veto in force and nothing served
semantically: every candidate that passed the vetoes is recorded with its features
(core.verify.PAIR_FEATURES) and its label, right when live retrieval for the new query has the same
top result and >= 0.8 of the same top 5 as the candidate's evidence *and* the two queries share an
intent. A logistic regression (standardised features, L2 with `--C`, each coefficient held to the
sign its feature means, `SIGNS`; scipy's L-BFGS-B) is fitted on those pairs.

The default bound is chosen by leave-one-domain-out: for each tuning domain, a model fitted on the
other tuning domains serves that domain's streams at each bound of `BOUNDS`; the largest bound whose
pooled results meet every target (no near-miss serve on any order, wrong serves' upper 95% Wilson
bound <= 1% of queries) is the default; when none does, the largest bound with no near-miss serve
among those within one wrong serve per order of the fewest (a single pair is below what the streams
resolve; this tolerance was set on the tuning domains, issue 33). The final model is then fitted on every tuning pair.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import pathlib
import random
import sys
from collections import defaultdict
from typing import Any

import numpy as np
from scipy.optimize import minimize
from scipy.special import expit
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from eval_cache import DATA, SPLITS, K, Retriever, agrees, metadata_vocab
from ragtoll.proxy.cache.audit import wilson
from ragtoll.proxy.cache.embedders import CachedEmbedder, LocalEmbedder, LocalModel
from ragtoll.proxy.cache.evidence import EvidenceCache, Lookup, Query
from ragtoll.proxy.config import CacheConfig
from ragtoll.proxy.core.verify import INTENT_FLOOR, PAIR_FEATURES, Calibration, Features, pair_features
from ragtoll.proxy.model import Principal
from ragtoll.proxy.stores.evidence import Entry
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore

OUT = pathlib.Path(__file__).parent.parent / "proxy" / "data" / "cache_verifier.json"
# [similarity, content overlap]: candidates below either are never considered (--similarity-floor, --intent-floor)
FLOORS = [0.85, INTENT_FLOOR]  # the configured similarity and the vetoes' own overlap floor
BOUNDS = [0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.1, 0.15, 0.2, 1.0]  # 1.0: the vetoes alone
MAX_WRONG_UPPER = 0.01
REGULARISATION = [1.0]  # scikit-learn's C (--C)
DUMMY = Calibration(PAIR_FEATURES, (0.0,) * len(PAIR_FEATURES), (1.0,) * len(PAIR_FEATURES),
                    (0.0,) * len(PAIR_FEATURES), 0.0)


class Recorder(EvidenceCache):
    """Serves nothing semantically; records every candidate that passed the vetoes."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.seen: list[tuple[str, str, tuple[float, ...]]] = []

    def _judge(self, lk: Lookup, cand: Entry, ours: Features, theirs: Features, sim: float, gap: float, near: int,
               bound: float) -> str | None:
        self.seen.append((lk.norm, cand.query, pair_features(ours, theirs, sim, cand.margin, gap, near)))
        return "error_bound"


def cache_for(embedder: Any, calibration: Calibration | None, bound: float = 1.0, cls: type = EvidenceCache) -> Any:
    from ragtoll.proxy.cache.audit import Auditor
    return cls(MemoryEvidenceStore(), embedder=embedder, similarity=FLOORS[0], reach=CacheConfig().reach,
               calibration=calibration,
               intent_floor=FLOORS[1], auditor=Auditor(0.0, FLOORS[0], max_error=bound))


async def replay(queries: list[dict[str, Any]], cache: EvidenceCache, ranked: dict[str, Any],
                 docs_by_id: dict[str, Any]) -> dict[str, Any]:
    """One stream: what was served and whether it was right (by live retrieval and by label)."""
    principal = Principal("fit", frozenset({"staff"}))
    intent_of: dict[str, str] = {}
    served = wrong = near_miss = 0
    for q in queries:
        lk = await cache.lookup(Query(q["domain"], q["text"], q["filters"], K, principal))
        ids, scores = ranked[q["text"]]
        if lk.entry is not None:
            served += 1
            ok = agrees(list(lk.entry.chunk_ids), ids)
            same = intent_of[lk.entry.query] == intent(q)
            wrong += not (ok and same)
            near_miss += not same
            continue
        body = json.dumps({"results": [{"id": i} for i in ids]}).encode()
        await cache.store_evidence(lk, chunk_ids=ids, acls=[("public",)] * K, body=body,
                                   vocab=metadata_vocab(docs_by_id, ids), scores=scores)
        intent_of[lk.norm] = intent(q)
    return {"queries": len(queries), "served": served, "wrong": wrong, "near_miss": near_miss}


def intent(q: dict[str, Any]) -> str:
    return json.dumps([q["domain"], q["intent"]], sort_keys=True)


# The sign each feature's coefficient may take, fixed from what the feature means (P(right) rises with
# similarity, shared words, the same order, a clear retrieval and a clear lead; falls with substituted
# and added words); 0: free. With a few dozen wrong pairs to learn from, an unconstrained fit gives
# some features the sign of noise (more shared order read as more wrong) and then refuses a pair
# that differs by one synonym.
SIGNS = {"similarity": 1, "overlap": 1, "containment": 1, "substituted": -1, "added": -1, "same_order": 1,
         "margin": 1, "margin_known": 0, "gap": 1, "neighbours": 0}


def fit(x: np.ndarray, y: np.ndarray) -> Calibration:
    """L2-regularised logistic regression on standardised features, each coefficient held to its SIGNS."""
    scaler = StandardScaler().fit(x)
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    z = (x - scaler.mean_) / scale
    t = 2.0 * y - 1.0

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        m = t * (z @ w[1:] + w[0])
        p = expit(-m)  # the gradient's weight per pair
        g = -(t * p)
        grad = np.concatenate([[g.sum()], z.T @ g + w[1:] / REGULARISATION[0]])
        return float(np.logaddexp(0.0, -m).sum() + (w[1:] ** 2).sum() / (2 * REGULARISATION[0])), grad

    bounds = [(None, None)] + [(0, None) if SIGNS[n] > 0 else (None, 0) if SIGNS[n] < 0 else (None, None)
                               for n in PAIR_FEATURES]
    w = minimize(loss, np.zeros(len(PAIR_FEATURES) + 1), jac=True, method="L-BFGS-B", bounds=bounds).x
    return Calibration(PAIR_FEATURES, tuple(float(v) for v in scaler.mean_), tuple(float(v) for v in scale),
                       tuple(float(v) for v in w[1:]), float(w[0]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--similarity-floor", type=float, default=FLOORS[0])
    ap.add_argument("--intent-floor", type=float, default=FLOORS[1])
    ap.add_argument("--C", type=float, default=REGULARISATION[0], help="inverse regularisation strength")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    FLOORS[:] = [args.similarity_floor, args.intent_floor]
    REGULARISATION[:] = [args.C]
    splits = json.loads((DATA.parent / SPLITS).read_text())
    tuning = set(splits["tuning"])
    data = json.loads(DATA.read_text())
    docs = [d for d in data["docs"] if d["domain"] in tuning]
    queries = [q for q in data["queries"] if q["domain"] in tuning]  # the held-out domains are never read
    docs_by_id = {d["id"]: d for d in docs}
    retriever = Retriever(docs, LocalModel.shared(int8=False))
    ranked = {q["text"]: retriever.search_scored(q["text"], q["domain"], q["filters"]) for q in queries}
    embedder = CachedEmbedder(LocalEmbedder(LocalModel.shared(), offload=False), size=100_000)
    by_text = {q["text"]: q for q in queries}
    from ragtoll.proxy.cache.partition import normalize_query
    by_norm = {normalize_query(t): q for t, q in by_text.items()}
    domains = sorted(tuning)

    # 1. the pairs: every candidate that passed the vetoes, over shuffled streams of each domain
    rows: list[tuple[str, tuple[float, ...], int]] = []
    for domain in domains:
        qs = [q for q in queries if q["domain"] == domain]
        for seed in range(args.seeds):
            order = list(qs)
            random.Random(seed).shuffle(order)
            rec = cache_for(embedder, DUMMY, cls=Recorder)
            filed: dict[str, list[str]] = {}
            for q in order:
                start = len(rec.seen)
                lk = asyncio.run(rec.lookup(Query(q["domain"], q["text"], q["filters"], K,
                                                  Principal("fit", frozenset({"staff"})))))
                ids, scores = ranked[q["text"]]
                for norm, cand, x in rec.seen[start:]:
                    c = by_norm[cand]
                    right = agrees(filed[cand], ids) and intent(c) == intent(q)
                    rows.append((domain, x, int(right)))
                asyncio.run(rec.store_evidence(lk, chunk_ids=ids, acls=[("public",)] * K,
                                               body=json.dumps({"results": [{"id": i} for i in ids]}).encode(),
                                               vocab=metadata_vocab(docs_by_id, ids), scores=scores))
                filed[lk.norm] = ids
    x_all = np.array([r[1] for r in rows])
    y_all = np.array([r[2] for r in rows])
    groups = np.array([r[0] for r in rows])
    print(f"{len(rows)} vetted candidate pairs from {len(domains)} tuning domains, {y_all.mean():.1%} right")

    # 2. the default bound, by leave-one-domain-out over the tuning domains
    pooled: dict[float, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    worst_near: dict[float, int] = defaultdict(int)
    for domain in domains:
        mask = groups != domain
        model = fit(x_all[mask], y_all[mask])
        qs = [q for q in queries if q["domain"] == domain]
        for bound in BOUNDS:
            for seed in range(args.seeds):
                order = list(qs)
                random.Random(seed).shuffle(order)
                r = asyncio.run(replay(order, cache_for(embedder, model, bound), ranked, docs_by_id))
                for k, v in r.items():
                    pooled[bound][k] += v
                worst_near[bound] = max(worst_near[bound], r["near_miss"])
    print(f"\nleave-one-domain-out over the tuning domains ({args.seeds} orders each, pooled)")
    print(f"{'bound':>7}{'served':>9}{'wrong':>9}{'wrong 95% CI':>18}{'near-miss':>11}")
    chosen = None
    table = []
    for bound in BOUNDS:
        p = pooled[bound]
        lo, hi = wilson(p["wrong"], p["queries"])
        ok = p["near_miss"] == 0 and hi <= MAX_WRONG_UPPER
        table.append({"bound": bound, **p, "wrong_ci": [lo, hi], "meets": ok})
        if ok:
            chosen = bound
        print(f"{bound:>7}{p['served'] / p['queries']:>9.1%}{p['wrong'] / p['queries']:>9.2%}"
              f"{f'{lo:.2%}-{hi:.2%}':>18}{p['near_miss']:>11}{'  meets' if ok else ''}")
    if chosen is None:  # no bound met every target: the largest with no near-miss serve and about the fewest wrong
        safe = [t for t in table if t["near_miss"] == 0]
        if safe:
            # within one wrong serve per order of the fewest: a single pair is below what the streams resolve
            fewest = min(t["wrong"] for t in safe)
            chosen = max(t["bound"] for t in safe if t["wrong"] <= fewest + args.seeds)
        print(f"\nno bound met every target; the largest with no near-miss serve and within one wrong serve per "
              f"order of the fewest: {chosen}")
    else:
        print(f"\nchosen default bound: {chosen}")

    # 3. the shipped model: every tuning pair
    final = fit(x_all, y_all)
    doc = {
        "about": "Model of P(a verified semantic candidate's evidence is right); p_wrong = 1 - sigmoid(intercept + "
                 "sum(coef * (x - mean) / scale)). Written by bench/fit_verifier.py; do not edit by hand.",
        "fitted": datetime.date.today().isoformat(),
        "tuning_domains": domains, "pairs": len(rows), "right_share": float(y_all.mean()), "seeds": args.seeds,
        "similarity_floor": FLOORS[0], "intent_floor": FLOORS[1], "max_error": chosen,
        "leave_one_domain_out": table,
        "features": list(PAIR_FEATURES), "mean": list(final.mean), "scale": list(final.scale),
        "coef": list(final.coef), "intercept": final.intercept,
    }
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print("coefficients (standardised):", {n: round(c, 3) for n, c in zip(PAIR_FEATURES, final.coef, strict=True)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
