"""The evidence cache itself: lookup (exact -> semantic -> verification -> ACL) and store.

No HTTP here: the stage turns an exchange into a `Query`, and the benchmark drives this class
directly. Guarantees: no lookup crosses a partition; a semantic candidate is served only after
`verify` passes and when its evidence's first result was not nearly tied (`min_top_margin`); nothing
is served unless the ACL decision (and the external check, when configured) allows every cached
chunk to the current principal.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import acl
from .audit import Auditor
from .embedders import Embedder, NoEmbedder
from .entry import Entry, EvidenceStore
from .lexical import LexicalIndex
from .partition import Partition, canonical_filters, exact_key, filter_words, normalize_query, serves_top_k
from .principal import Principal
from .verify import features, top_margin, verify
from .versions import Versions

if TYPE_CHECKING:
    import numpy as np

MAX_VOCAB = 2_000  # filter-like words remembered per partition
SYNC_INTERVAL_S = 0.25  # how often a replica pulls other replicas' new entries of a partition
SYNC_OVERLAP_S = 5.0


@dataclass(slots=True)
class Query:
    route: str
    text: str
    filters: Any = None
    top_k: int | None = None
    principal: Principal = field(default_factory=lambda: Principal("anonymous"))


@dataclass(slots=True)
class Lookup:
    """What a lookup found; also what `store` needs to file the evidence after a miss."""

    query: Query
    partition: Partition
    norm: str
    qkey: str
    entry: Entry | None = None
    tier: str | None = None  # exact | semantic
    similarity: float | None = None
    reason: str = ""  # why it is a miss: none, top_k, acl:*, authz:*, the refusing check, below_threshold
    vector: np.ndarray | None = None
    seconds: float = 0.0

    @property
    def hit(self) -> bool:
        return self.entry is not None


@dataclass(slots=True)
class Filing:
    """A miss's answer on its way into the cache: the decoded body as it streams past (up to the
    cache's size bound), filed when the call ends well. `key` is set for the exact caches
    (embeddings, rerank): (partition key, body key)."""

    lookup: Lookup | None
    key: tuple[str, str] | None = None
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    too_big: bool = False


def private_key(qkey: str, owner: str) -> str:
    return f"{qkey}.{owner[:32]}"


class EvidenceCache:
    def __init__(self, store: EvidenceStore, *, embedder: Embedder | None = None, versions: Versions | None = None,
                 similarity: float = 0.8, candidates: int = 3, ttl_s: int = 3600, public: str = "public",
                 authz: acl.ExternalAuthz | None = None, auditor: Auditor | None = None,
                 verify_candidates: bool = True, prefilter: bool = True, min_top_margin: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        # an entry whose first result led its own retrieval by less than this (`top_margin`) serves
        # exact hits only: a reworded query is likely to reorder a near tie
        self.min_top_margin = min_top_margin
        self.verify_candidates = verify_candidates  # False only for the plain-threshold baseline (bench)
        self.embedder = embedder or NoEmbedder()
        self.versions = versions or Versions(store, {})
        self.candidates = candidates
        self.ttl_s = ttl_s
        self.public = public
        self.authz = authz
        self.auditor = auditor or Auditor(0.0, similarity)
        self.auditor.bind(store)  # raised thresholds are shared by every replica on this store
        self._clock = clock
        # filter-like words per partition (its filters' values, then what responses' metadata taught), frozen:
        # verification features are memoised per (text, vocabulary)
        self._vocab: OrderedDict[str, frozenset[str]] = OrderedDict()
        # Replica-local lexical index: partition -> signature -> {query key: content words}. A query
        # with no entry of equal signature and enough shared content cannot pass verification, so
        # its miss skips the embedding (computed after the response, for filing). Off for shared
        # stores, whose entries other replicas wrote are not in this index.
        self.prefilter = prefilter and verify_candidates
        self._lex = LexicalIndex()
        # a shared store (Redis): entries other replicas filed reach this index through `recent`
        self._shared = bool(getattr(store, "shared", False))
        self._synced: OrderedDict[str, tuple[float, float]] = OrderedDict()  # pkey -> (newest seen, checked at)

    async def partition(self, q: Query) -> Partition:
        version = await self.versions.current(q.route)
        return Partition(q.route, version, canonical_filters(q.filters), q.principal.tenant)

    async def lookup(self, q: Query) -> Lookup:
        t0 = time.perf_counter()
        part = await self.partition(q)
        norm = normalize_query(q.text)
        lk = Lookup(q, part, norm, exact_key(norm), reason="none")
        try:
            await self._lookup(lk)
        finally:
            lk.seconds = time.perf_counter() - t0
        return lk

    async def _lookup(self, lk: Lookup) -> None:
        q, pkey = lk.query, lk.partition.key
        # shared entries under the query key; entries with an unknown ACL under the owner's own key,
        # so two principals asking the same thing never evict each other's private evidence
        for entry in await self.store.get_many(pkey, (lk.qkey, private_key(lk.qkey, q.principal.key))):
            if entry is None:
                continue
            if not serves_top_k(entry.top_k, q.top_k):
                lk.reason = "top_k"
                continue
            why = await self._allowed(entry, q.principal)
            if why is None:
                lk.entry, lk.tier, lk.similarity = entry, "exact", 1.0
                return
            lk.reason = why
        if isinstance(self.embedder, NoEmbedder):
            return
        vocab = self._partition_vocab(pkey, q.filters)
        mine = features(lk.norm, vocab)
        keys: list[str] | None = None
        if self.prefilter and self._shared:
            await self._sync(pkey)
        if self.prefilter:
            # only entries that could verify are compared: near misses that embed closer than a
            # paraphrase never crowd it out of the candidate list
            keys, why = self._lex.candidates(pkey, mine, vocab)
            if not keys:
                lk.reason = why if lk.reason == "none" else lk.reason
                return
        lk.vector = await self.embedder.embed(lk.norm)
        if lk.vector is None:
            return
        threshold = await self.auditor.current(lk.partition.source)
        found = await self.store.nearest(pkey, lk.vector, threshold, self.candidates, keys)
        if not found:
            if lk.reason == "none":
                lk.reason = "below_threshold"
            return
        for sim, cand in found:
            if cand.query == lk.norm:
                continue  # the exact entry, already judged above
            if not serves_top_k(cand.top_k, q.top_k):
                lk.reason = "top_k"
                continue
            words = vocab | frozenset(cand.vocab) if cand.vocab else vocab
            ours = features(lk.norm, words) if cand.vocab else mine
            refused = verify(ours, features(cand.query, words), sim, words) if self.verify_candidates else None
            if refused is None and self.verify_candidates and self._fragile(cand):
                refused = "ranking"
            if refused is not None:
                lk.reason, lk.similarity = f"verify:{refused}", sim
                continue
            why = await self._allowed(cand, q.principal)
            if why is not None:
                lk.reason = why
                continue
            lk.entry, lk.tier, lk.similarity = cand, "semantic", sim
            return

    def _fragile(self, entry: Entry) -> bool:
        return entry.margin is not None and entry.margin < self.min_top_margin

    async def _allowed(self, entry: Entry, principal: Principal) -> str | None:
        why = acl.decide(entry.acls, entry.owner, principal, self.public)
        if why is None and self.authz is not None:
            why = await self.authz.allows(principal, entry.chunk_ids)
        return why

    async def store_evidence(self, lk: Lookup, *, chunk_ids: Sequence[str], acls: Sequence[tuple[str, ...] | None],
                             body: bytes, content_type: str = "application/json", vocab: Sequence[str] = (),
                             version: str | None = None,
                             scores: Sequence[float | None] | None = None) -> Partition:
        """File what live retrieval returned for `lk`'s query. `version`: the one the response carried;
        `scores`: the results' retrieval scores in rank order, when the response had them."""
        part = lk.partition
        if version is not None:
            seen = await self.versions.observe(lk.query.route, version)
            if seen != part.version:
                part = Partition(part.route, seen, part.filters, part.tenant)
        words = tuple(sorted({w for w in vocab if 0 < len(w) <= 40})[:200])
        entry = Entry(lk.norm, lk.query.top_k, tuple(chunk_ids), tuple(acls), body, content_type,
                      acl.owner_of(acls, lk.query.principal), words, self._clock(),
                      top_margin(scores) if scores is not None else None)
        vector = lk.vector
        if vector is None and not isinstance(self.embedder, NoEmbedder):
            vector = await self.embedder.embed(lk.norm)
        key = lk.qkey if entry.owner is None else private_key(lk.qkey, entry.owner)
        await self.store.put(part.key, key, entry, vector, self.ttl_s)
        self._learn(part.key, words, lk.query.filters)
        if self.prefilter and vector is not None:
            self._lex.add(part.key, key, lk.norm, features(lk.norm).content)
        return part

    async def _sync(self, pkey: str) -> None:
        newest, checked = self._synced.get(pkey, (0.0, 0.0))
        now = time.monotonic()
        if now - checked < SYNC_INTERVAL_S:
            return
        # overlap the window: replicas' clocks differ a little, and adding twice is harmless
        rows = await self.store.recent(pkey, max(0.0, newest - SYNC_OVERLAP_S))
        for qkey, query, filed in rows:
            self._lex.add(pkey, qkey, query, features(query).content)
            newest = max(newest, filed)
        self._synced[pkey] = (newest, now)
        self._synced.move_to_end(pkey)
        while len(self._synced) > 10_000:
            self._synced.popitem(last=False)

    def _learn(self, pkey: str, words: Sequence[str], filters: Any) -> None:
        known = self._partition_vocab(pkey, filters)
        if len(known) < MAX_VOCAB and not known.issuperset(words):
            self._vocab[pkey] = known | frozenset(words)
        self._vocab.move_to_end(pkey)
        while len(self._vocab) > 10_000:
            self._vocab.popitem(last=False)

    def _partition_vocab(self, pkey: str, filters: Any) -> frozenset[str]:
        known = self._vocab.get(pkey)
        if known is None:  # the partition key covers the filters: their words are the partition's
            known = self._vocab[pkey] = frozenset(filter_words(filters))
            while len(self._vocab) > 10_000:
                self._vocab.popitem(last=False)
        return known
