"""The evidence cache itself: lookup (exact -> semantic -> verification -> view and ACL -> freshness) and store.

No HTTP here: the stage turns an exchange into a `Query` (and its version probe into a callable),
and the benchmark drives this class directly. Guarantees: no lookup crosses a partition; a semantic
candidate is served only after `verify` passes (the vetoes), when its evidence's first result was not
nearly tied (`min_top_margin`) and, with a calibration, when its estimated probability of being wrong is
at most the route's error bound (`cache.max_error`, tightened by the audit); nothing is served unless the principal's view is inside the one the entry
was fetched under (when the upstream filters by caller) and the ACL decision (and the external
check, when configured) allows every cached chunk; an entry older than its source's staleness
bound is served only with the source's version confirmed within the bound. A duplicate of a
retrieval in flight in this process waits for it (`lookup(...).wait`).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

from ..core.verify import INTENT_FLOOR, Calibration, Features, features, pair_features, top_margin, verify
from ..model import Principal
from ..stores.evidence import Entry, EvidenceStore
from . import acl
from .audit import Auditor
from .embedders import Embedder, NoEmbedder
from .flights import GONE, Flight, Flights
from .lexical import LexicalIndex
from .partition import (
    DEFAULT_NORMALIZE,
    Partition,
    canonical_filters,
    exact_key,
    filter_words,
    normalize_query,
    serves_top_k,
)
from .versions import Probe, SourceState, Versions, compose

if TYPE_CHECKING:
    import numpy as np

REACH_OVERLAP = 0.4  # content overlap a candidate below the similarity threshold needs (`reach`)
MAX_VOCAB = 2_000  # filter-like words remembered per partition
SYNC_INTERVAL_S = 0.25  # how often a replica pulls other replicas' new entries of a partition
SYNC_OVERLAP_S = 5.0
MAX_STALENESS_S = 300.0  # config.CacheConfig.max_staleness_s's default

# Why an entry was servable as to time (the span's `ragtoll.cache.freshness`).
FRESH_YOUNG = "young"  # fetched within the bound
FRESH_CONFIRMED = "confirmed"  # older, but its version was confirmed within the bound (push, response)
FRESH_PROBED = "probed"  # older, and this lookup's probe confirmed its version
FRESH_INFLIGHT = "inflight"  # the answer of a retrieval this call waited for


@dataclass(slots=True)
class Query:
    route: str
    text: str
    filters: Any = None
    top_k: int | None = None
    principal: Principal = field(default_factory=lambda: Principal("anonymous"))
    selector: str = ""  # partition.selector: the upstream target and the body fields not understood
    vector: Sequence[float] | None = None  # a query by vector: exact tier only, keyed by its hash
    scoped: bool = False  # the upstream filters results by caller: entries remember the fetcher's view
    probe: Probe | None = None  # asks the source for its version when an entry needs confirming


@dataclass(slots=True)
class Lookup:
    """What a lookup found; also what `store_evidence` needs to file the evidence after a miss."""

    query: Query
    partition: Partition
    norm: str
    qkey: str  # the exact tier's key: normalised text (and vector)
    key: str = ""  # the entry key: qkey and, when the upstream filters by caller, the asker's view
    scope: tuple[str, ...] | None = None  # the asker's view, when the upstream filters by caller
    state: SourceState | None = None  # the source's version when the lookup began
    entry: Entry | None = None
    tier: str | None = None  # exact | semantic
    similarity: float | None = None
    # why it is a miss: none, top_k, scope:*, acl:*, authz:*, stale:*, the refusing check, below_threshold
    reason: str = ""
    view: str | None = None  # the view rule a hit passed (acl.VIEW_*)
    freshness: str | None = None  # why a hit was fresh enough (FRESH_*)
    vector: np.ndarray | None = None
    p_wrong: float | None = None  # the calibrated estimate of the last candidate judged
    seconds: float = 0.0
    wait: Flight | None = None  # a retrieval in flight this call may be served from: wait for it
    wait_tier: str = "exact"
    wait_similarity: float = 1.0
    flight: Flight | None = None  # the retrieval in flight this call leads (its duplicates wait for it)

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
    entry: Entry | None = None  # made as soon as the answer was read whole (landed for waiters)
    version: str | None = None  # the source version the answer carried


def private_key(qkey: str, owner: str) -> str:
    return f"{qkey}.{owner[:32]}"


def audit_id(pkey: str, query: str) -> str:
    """An entry's id for its own audit floor (audit.Auditor.entry_floor): its partition and query."""
    return xxhash.xxh3_64_hexdigest(f"{pkey}\x00{query}".encode("utf-8", "surrogatepass"))


def entry_key(qkey: str, scope: tuple[str, ...] | None) -> str:
    """Where an entry is filed: per fetcher view when the upstream filters by caller."""
    if scope is None:
        return qkey
    return f"{qkey}~{xxhash.xxh3_64_hexdigest(chr(0).join(scope).encode('utf-8', 'surrogatepass'))}"


class EvidenceCache:
    def __init__(self, store: EvidenceStore, *, embedder: Embedder | None = None, versions: Versions | None = None,
                 similarity: float = 0.8, candidates: int = 3, ttl_s: int = 3600, public: str = "public",
                 authz: acl.ExternalAuthz | None = None, auditor: Auditor | None = None,
                 verify_candidates: bool = True, prefilter: bool = True, min_top_margin: float = 0.0,
                 max_staleness_s: float = MAX_STALENESS_S, staleness: Mapping[str, float] | None = None,
                 calibration: Calibration | None = None, intent_floor: float | None = None,
                 reach: float = 0.0, reach_overlap: float = REACH_OVERLAP,
                 normalize: Sequence[str] = DEFAULT_NORMALIZE, normalize_routes: Mapping[str, Sequence[str]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        # how a query text is normalised before keying: per route (its upstream's own indifferences)
        self.normalize = tuple(normalize)
        self.normalize_routes = {r: tuple(m) for r, m in (normalize_routes or {}).items()}
        # the model of P(wrong) a verified candidate is judged by against the route's error bound
        # (`auditor.bound`); None: the vetoes alone decide, with their own content-overlap floor
        self.calibration = calibration
        self.intent_floor = intent_floor if intent_floor is not None else INTENT_FLOOR
        # candidates up to `reach` below the similarity threshold are verified too, held to the higher
        # content-overlap floor `reach_overlap`: a paraphrase that embeds a little apart but shares most
        # of its words is served; one that shares few of them only above the threshold
        self.reach, self.reach_overlap = reach, reach_overlap
        # an entry whose first result led its own retrieval by less than this (`top_margin`) serves
        # exact hits only: a reworded query is likely to reorder a near tie
        self.min_top_margin = min_top_margin
        self.verify_candidates = verify_candidates  # False only for the plain-threshold baseline (bench)
        self.embedder = embedder or NoEmbedder()
        self.versions = versions or Versions(store, {}, now=clock)
        self.candidates = candidates
        self.ttl_s = ttl_s
        self.public = public
        self.authz = authz
        self.auditor = auditor or Auditor(0.0, similarity)
        self.auditor.bind(store)  # raised thresholds are shared by every replica on this store
        self.max_staleness_s = max_staleness_s
        self.staleness = dict(staleness or {})  # per route (source)
        self.flights = Flights()
        self._clock = clock  # wall clock: when entries were fetched, versions confirmed
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

    def bound(self, route: str) -> float:
        """The staleness bound of a source: how old an entry may be served without a confirmed version."""
        return self.staleness.get(route, self.max_staleness_s)

    async def lookup(self, q: Query, *, serve: bool = True, lead: bool = False) -> Lookup:
        """Find evidence for `q`. `serve=False` (the caller's `no-cache`): only what filing needs.
        `lead`: a miss will be filed, so it leads a flight its duplicates wait for (`lk.flight`; the
        caller must `end` it); a miss that finds another's flight gets `lk.wait` instead."""
        t0 = time.perf_counter()
        state = await self.versions.state(q.route)
        part = Partition(q.route, state.version, canonical_filters(q.filters), q.principal.tenant, q.selector)
        norm = normalize_query(q.text, self.normalize_routes.get(q.route, self.normalize))
        qkey = exact_key(norm, q.vector)
        scope = acl.scope_of(q.principal, q.scoped)
        lk = Lookup(q, part, norm, qkey, entry_key(qkey, scope), scope, state, reason="none")
        if lead:  # before any store round trip: a duplicate arriving meanwhile finds it
            lk.flight = self.flights.start(part.key, lk.key, norm, q.top_k, text=q.vector is None)
        try:
            if serve:
                await self._lookup(lk)
                if lk.entry is not None:
                    self._served(lk)
                elif not lk.reason.startswith("stale:version"):
                    if lk.flight is not None and lk.vector is not None:
                        lk.flight.vector = lk.vector  # semantic duplicates compare with it
                    await self._inflight(lk)
        except BaseException:
            self.end(lk)
            raise
        finally:
            lk.seconds = time.perf_counter() - t0
        return lk

    def _served(self, lk: Lookup) -> None:
        """A hit leads nothing: its own flight's waiters get the entry when it is theirs word for word."""
        if lk.flight is not None:
            self.land(lk, lk.entry if lk.entry is not None and lk.entry.query == lk.norm else None)
            self.end(lk)
            lk.flight = None

    async def _lookup(self, lk: Lookup) -> None:
        q, pkey = lk.query, lk.partition.key
        # The asker's own view's entry; the latest of any view (the query key: a wider view's entry
        # serves a narrower one); entries with an unknown ACL under the owner's own key, so two
        # principals asking the same thing never evict each other's private evidence. One round trip.
        slots = [lk.key, private_key(lk.key, q.principal.key)] + ([lk.qkey] if lk.key != lk.qkey else [])
        judged: list[Entry] = []
        for entry in await self.store.get_many(pkey, slots):
            if entry is None or any(entry == e for e in judged):
                continue
            judged.append(entry)
            if not serves_top_k(entry.top_k, q.top_k):
                lk.reason = "top_k"
                continue
            why = await self._servable(lk, entry)
            if why is None:
                lk.entry, lk.tier, lk.similarity = entry, "exact", 1.0
                return
            lk.reason = why
            if why == "stale:version":
                return  # the source moved on: nothing in this partition is current
        if isinstance(self.embedder, NoEmbedder) or q.vector is not None:
            return  # queries by vector have the exact tier only
        vocab = self._partition_vocab(pkey, q.filters)
        mine = features(lk.norm, vocab)
        keys: list[str] | None = None
        if self.prefilter and self._shared:
            await self._sync(pkey)
        if self.prefilter:
            # only entries that could verify are compared: near misses that embed closer than a
            # paraphrase never crowd it out of the candidate list
            keys, why = self._lex.candidates(pkey, mine, vocab, floor=self.intent_floor)
            if not keys:
                lk.reason = why if lk.reason == "none" else lk.reason
                return
        lk.vector = await self.embedder.embed(lk.norm)
        if lk.vector is None:
            return
        threshold = await self.auditor.current(lk.partition.source)
        found = await self.store.nearest(pkey, lk.vector, threshold - self.reach, self.candidates, keys)
        if not found:
            if lk.reason == "none":
                lk.reason = "below_threshold"
            return
        bound = await self.auditor.bound(lk.partition.source) if self.calibration is not None else 1.0
        near = len(keys) if keys is not None else len(found)  # cached queries that could have verified
        for i, (sim, cand) in enumerate(found):
            if cand.query == lk.norm and cand.scope == lk.scope:
                continue  # the exact entry, already judged above
            if not serves_top_k(cand.top_k, q.top_k):
                lk.reason = "top_k"
                continue
            others = [s for j, (s, _) in enumerate(found) if j != i]
            gap = sim - (max(others) if others else threshold)
            refused = self._verify(lk, cand, sim, vocab, mine, gap=gap, near=near, bound=bound,
                                   floor=self.intent_floor if sim >= threshold else self.reach_overlap)
            if refused is not None:
                lk.reason, lk.similarity = f"verify:{refused}", sim
                continue
            why = await self._servable(lk, cand)
            if why is not None:
                lk.reason = why
                if why == "stale:version":
                    return
                continue
            if cand.query != lk.norm and sim < await self.auditor.entry_floor(lk.partition.source,
                                                                              audit_id(pkey, cand.query)):
                lk.reason, lk.similarity = "audit:entry", sim  # an audit found this entry wrong this far out
                continue  # read last: one store read (memoised for REFRESH_S) per candidate about to serve
            # the same text fetched under another (wider) view is an exact hit, not a paraphrase
            lk.entry, lk.tier, lk.similarity = cand, "exact" if cand.query == lk.norm else "semantic", sim
            return

    def _verify(self, lk: Lookup, cand: Entry, sim: float, vocab: frozenset[str], mine: Any = None, *,
                gap: float | None = None, near: int = 1, bound: float = 1.0, floor: float | None = None) -> str | None:
        """None if `cand`'s query may serve this one (the vetoes, the ranking check, the error bound); else why not.
        `floor`: the content overlap it must reach (the cache's own, unless the candidate is in the reach)."""
        if cand.query == lk.norm or not self.verify_candidates:
            return None
        words = vocab | frozenset(cand.vocab) if cand.vocab else vocab
        ours = features(lk.norm, words) if cand.vocab or mine is None else mine
        theirs = features(cand.query, words)
        refused = verify(ours, theirs, sim, words, intent_floor=self.intent_floor if floor is None else floor)
        if refused is None and cand.margin is not None and cand.margin < self.min_top_margin:
            refused = "ranking"
        if refused is None and self.calibration is not None:
            refused = self._judge(lk, cand, ours, theirs, sim, sim - self.auditor.base if gap is None else gap,
                                  near, bound)
        return refused

    def _judge(self, lk: Lookup, cand: Entry, ours: Features, theirs: Features, sim: float, gap: float, near: int,
               bound: float) -> str | None:
        """The calibrated decision: "error_bound" when the estimated P(wrong) is above the route's bound."""
        assert self.calibration is not None
        p = self.calibration.p_wrong(pair_features(ours, theirs, sim, cand.margin, gap, near))
        lk.p_wrong = p
        return None if p <= bound else "error_bound"

    async def _servable(self, lk: Lookup, entry: Entry) -> str | None:
        """None if `entry` may be served to this lookup's principal now; else why not (view, ACL, authz, age)."""
        principal = lk.query.principal
        if lk.scope is not None and entry.scope is None:
            return "view:unknown"  # filed when the upstream was taken to answer everyone alike
        why = acl.decide(entry.acls, entry.owner, principal, self.public, entry.scope)
        if why is None and self.authz is not None:
            why = await self.authz.allows(principal, entry.chunk_ids)
        if why is None:
            why = await self._stale(lk, entry)
        if why is None:
            lk.view = acl.view_rule(entry.scope, entry.owner)
        return why

    async def _stale(self, lk: Lookup, entry: Entry) -> str | None:
        """None if `entry` is fresh enough: fetched within the source's bound, or older with the source's
        version confirmed within it (by a push or a response, else by the query's probe, run now)."""
        bound = self.bound(lk.query.route)
        now = self._clock()
        if now - entry.created <= bound:
            lk.freshness = FRESH_YOUNG
            return None
        assert lk.state is not None
        if lk.state.confirmed_within(bound, now):
            lk.freshness = FRESH_CONFIRMED
            return None
        if lk.query.probe is None:
            return "stale:unconfirmed"
        state = await self.versions.confirm(lk.query.route, bound, lk.query.probe)
        if state.version != lk.partition.version:
            # the source moved on: this miss's answer is filed under the version it now has
            p = lk.partition
            lk.state, lk.partition = state, Partition(p.route, state.version, p.filters, p.tenant, p.selector)
            return "stale:version"
        if not state.confirmed_within(bound, self._clock()):
            return "stale:unconfirmed"
        lk.state, lk.freshness = state, FRESH_PROBED
        return None

    # --- single flight ------------------------------------------------------------------------------

    async def _inflight(self, lk: Lookup) -> None:
        """A retrieval in flight in this process that this miss may be served from: `lk.wait`."""
        q, pkey = lk.query, lk.partition.key
        same = self.flights.find(pkey, lk.key)
        if same is not None and same is not lk.flight and serves_top_k(same.top_k, q.top_k):
            lk.wait = same
            return
        if isinstance(self.embedder, NoEmbedder) or q.vector is not None or not self.verify_candidates:
            return
        flying = [f for f in self.flights.others(pkey, lk.key, lk.flight) if serves_top_k(f.top_k, q.top_k)]
        if not flying:
            return
        vocab = self._partition_vocab(pkey, q.filters)
        mine = features(lk.norm, vocab)
        threshold = await self.auditor.current(lk.partition.source)
        for f in flying:
            if f.norm != lk.norm and verify(mine, features(f.norm, vocab), 1.0, vocab,
                                            intent_floor=self.intent_floor) is not None:
                continue  # could never verify: not worth an embedding
            if lk.vector is None:
                lk.vector = await self.embedder.embed(lk.norm)
            if f.vector is None:
                f.vector = await self.embedder.embed(f.norm)
            if lk.vector is None or f.vector is None:
                return
            sim = 1.0 if f.norm == lk.norm else float(lk.vector @ f.vector)
            if sim >= threshold:
                lk.wait, lk.wait_tier, lk.wait_similarity = f, "exact" if f.norm == lk.norm else "semantic", sim
                return

    async def admit(self, lk: Lookup, entry: Entry | None) -> bool:
        """After waiting for `lk.wait`: serve its landed `entry` to this lookup if every rule allows."""
        if entry is None:
            lk.reason = "inflight:unfiled"
            return False
        if not serves_top_k(entry.top_k, lk.query.top_k):
            lk.reason = "top_k"
            return False
        if lk.wait_tier == "semantic":
            bound = await self.auditor.bound(lk.partition.source) if self.calibration is not None else 1.0
            refused = self._verify(lk, entry, lk.wait_similarity, self._partition_vocab(lk.partition.key,
                                                                                       lk.query.filters), bound=bound)
            if refused is not None:
                lk.reason, lk.similarity = f"verify:{refused}", lk.wait_similarity
                return False
        why = await self._servable(lk, entry)
        if why is not None:
            lk.reason = why
            return False
        lk.entry, lk.tier, lk.similarity, lk.freshness = entry, lk.wait_tier, lk.wait_similarity, FRESH_INFLIGHT
        self._served(lk)
        return True

    def land(self, lk: Lookup, entry: Entry | None) -> None:
        """The leader has the whole answer (`entry`, None if it will not be filed): its waiters go on."""
        if lk.flight is not None:
            lk.flight.land(entry)

    def end(self, lk: Lookup, outcome: str = GONE, status: int | None = None) -> None:
        """The leader is done, however it ended (always called once per led flight; `outcome`: how,
        if it landed nothing - flights.UNFILED, FAILED or GONE)."""
        if lk.flight is not None:
            self.flights.end(lk.flight, outcome, status)

    def relay(self, lk: Lookup, failed: Flight, *, lead: bool) -> None:
        """`lk.wait` ended without an entry (`failed`): this lookup leads the key's next flight (it
        is the first waiter to ask, and `lead`: its answer will be filed), or waits for the one
        another waiter leads (`lk.wait`), or, neither possible, asks upstream on its own."""
        lk.wait = None
        if lk.flight is not None or failed.key != lk.key:
            return  # a semantic duplicate: it already leads its own key
        if lead:
            lk.flight, waiting = self.flights.relay(failed, lk.query.top_k)
        else:
            waiting = self.flights.find(failed.pkey, failed.key)
        if waiting is not None and serves_top_k(waiting.top_k, lk.query.top_k):
            lk.wait, lk.wait_tier, lk.wait_similarity = waiting, "exact", 1.0

    # --- filing ---------------------------------------------------------------------------------------

    def make_entry(self, lk: Lookup, *, chunk_ids: Sequence[str], acls: Sequence[tuple[str, ...] | None],
                   body: bytes, content_type: str = "application/json", vocab: Sequence[str] = (),
                   version: str | None = None, scores: Sequence[float | None] | None = None) -> Entry:
        """The entry live retrieval's answer to `lk` becomes. `version`: the one the response carried."""
        words = tuple(sorted({w for w in vocab if 0 < len(w) <= 40})[:200])
        return Entry(lk.norm, lk.query.top_k, tuple(chunk_ids), tuple(acls), body, content_type,
                     acl.owner_of(acls, lk.query.principal), words, self._clock(),
                     top_margin(scores) if scores is not None else None, lk.scope,
                     version or (lk.state.observed if lk.state else None))

    def known_current(self, lk: Lookup, version: str | None) -> bool:
        """Whether an answer carrying `version` is known current without asking the store (so it may be
        landed for waiters at once): no version, or the one the lookup saw."""
        return version is None or (lk.state is not None and version == lk.state.observed)

    async def store_evidence(self, lk: Lookup, *, chunk_ids: Sequence[str] = (),
                             acls: Sequence[tuple[str, ...] | None] = (), body: bytes = b"",
                             content_type: str = "application/json", vocab: Sequence[str] = (),
                             version: str | None = None, scores: Sequence[float | None] | None = None,
                             entry: Entry | None = None) -> Partition | None:
        """File what live retrieval returned for `lk`'s query (or the `entry` made of it already).
        `version`: the one the response carried: a value the source has moved past is not filed (a
        lagging replica's answer), a new one moves the source forward. Returns the partition filed in."""
        if entry is None:
            entry = self.make_entry(lk, chunk_ids=chunk_ids, acls=acls, body=body, content_type=content_type,
                                    vocab=vocab, version=version, scores=scores)
        part = lk.partition
        if version is not None:
            _, current = await self.versions.observe(lk.query.route, version)
            if not current:
                self.land(lk, None)
                return None
            # filed under the version the call was sent under, with the observed part the response
            # carried: a push in between makes it unreachable, never misfiled as newer
            assert lk.state is not None
            seen = compose(lk.state.pushed, version)
            if seen != part.version:
                part = Partition(part.route, seen, part.filters, part.tenant, part.selector)
        self.land(lk, entry)
        vector = lk.vector
        text = lk.query.vector is None
        if vector is None and text and not isinstance(self.embedder, NoEmbedder):
            vector = await self.embedder.embed(lk.norm)
        key = lk.key if entry.owner is None else private_key(lk.key, entry.owner)
        # a shared entry of one view is also the query's latest, which any view inside it may be served
        aliases = (lk.qkey,) if entry.owner is None and lk.key != lk.qkey else ()
        await self.store.put(part.key, key, entry, vector if text else None, self.ttl_s, aliases)
        self._learn(part.key, entry.vocab, lk.query.filters)
        if self.prefilter and vector is not None and text:
            self._lex.add(part.key, key, lk.norm, features(lk.norm).content)
        return part

    # --- replica-local indexes --------------------------------------------------------------------------

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


def age_of(entry: Entry, now: float) -> float:
    """How long ago the upstream answered with this entry's evidence, in seconds (0 for a clock behind)."""
    return max(0.0, now - entry.created) if math.isfinite(entry.created) else 0.0
