"""Cache stage: ACL-checked cached evidence for retrieval calls, exact caches for embeddings/rerank.

First in the stage list. An identity header sent twice is refused here (400, ambiguous). On a
servable hit it *proposes* the cached answer (`ex.proposal`); the stages after it charge it (budget)
or veto it, and the pipeline answers with it if it stands. A duplicate of a retrieval this process
has in flight waits for it (bounded by the call's read timeout) and is proposed its answer. On a
miss, the evidence is filed (status 200, body complete, chunks parsed) with ACLs, the fetcher's
view and the source version: landed for waiters as soon as the answer is read whole, stored in
`on_end`. Cache trouble never fails a call: it is recorded and the call goes upstream. Who is
asking is `ex.caller` (resolved once by the pipeline); the evidence cache, its store, its embedder
and the upstream client are the app's, made once in its lifespan (`evidence_cache`). The wall
clock is injected (entry ages, staleness).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash
from opentelemetry import metrics, trace
from ragtoll.instrumentation import semconv as sc

from ..adapters.fields import get_path
from ..cache import acl, calibration
from ..cache.audit import Auditor, compare
from ..cache.embedders import Embedder, make_embedder
from ..cache.evidence import EvidenceCache, Filing, Lookup, Query, age_of, audit_id
from ..cache.flights import FAILED, GONE, MAX_FAILURES, UNFILED
from ..cache.partition import Partition, selector
from ..cache.replies import metadata_words, trim_results
from ..cache.versions import Probe, SourceState, Versions, probed_version
from ..config import Settings, Timeouts, UpstreamConfig
from ..errors import BadRequest, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from ..model import Principal
from ..request.caller import AMBIGUOUS
from ..request.exchange import CacheOutcome, Exchange, Reply, Stage, contract
from ..request.forward import upstream_headers
from ..request.upstream import UpstreamClient
from ..stores.evidence import Entry, EvidenceStore

CACHE_HEADER = b"x-ragtoll-cache"
_SHORT = Timeouts(connect=1.0, read=5.0, write=5.0, pool=1.0)
# request headers a version probe does not repeat: it has no body of the caller's, and reads plain bytes
_NOT_PROBED = frozenset({b"content-length", b"content-type", b"accept-encoding"})


@dataclass(slots=True)
class CacheHit:
    reply: Reply
    tier: str  # exact | semantic
    similarity: float
    entry: Entry


class CacheStage(Stage):
    contract = contract(
        reads="caller method body call headers route target timeouts span raw_headers",
        writes="proposal filing cache",
        response_reads="filing observation status route target call", response_writes="filing",
        end_reads="filing status outcome complete observation route target call span", end_writes="filing")

    def __init__(self, settings: Settings, cache: EvidenceCache, client: UpstreamClient, *,
                 tracer_provider: Any = None, meter_provider: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`cache` (`evidence_cache`) and `client`: the app's, made once; `clock`: the wall clock."""
        cfg = settings.cache
        self.settings = settings
        self.cfg = cfg
        self._client = client
        self.cache = cache
        self.store = cache.store
        self.auditor = cache.auditor
        self._clock = clock
        # the upstreams that filter results by caller: their entries remember the fetcher's view
        identity_reaches = settings.identity.mode in ("header", "jwt")
        self._scoped = {u.name for u in settings.upstreams
                        if (u.cache.filters_by_caller if u.cache.filters_by_caller is not None else identity_reaches)}
        self._upstreams = {u.name: u for u in settings.upstreams}
        tp = tracer_provider or trace.get_tracer_provider()
        self._tracer = tp.get_tracer("ragtoll.proxy.cache")
        meter = (meter_provider or metrics.get_meter_provider()).get_meter("ragtoll.proxy.cache")
        self._audits = meter.create_counter(sc.METRIC_CACHE_AUDITS, unit="{audit}",
                                            description="Semantic hits re-run upstream, by agreement")
        self._audit_error = meter.create_gauge(sc.METRIC_CACHE_AUDIT_ERROR_RATE, unit="1",
                                               description="Live error rate of semantic hits by route, over "
                                                           "this replica's recent audits")
        self._max_error = meter.create_gauge(sc.METRIC_CACHE_MAX_ERROR, unit="1",
                                             description="The error bound semantic hits are served under, by "
                                                         "route (cache.max_error, tightened by the audit)")
        self._background: set[asyncio.Task[None]] = set()
        # how long a duplicate may wait for a retrieval in flight as its task stands (seconds; 0: its
        # deadline has passed; None: no deadline): the budget stage's, set by the app when budgets run
        self.wait_allowance: Callable[[Exchange], Awaitable[float | None]] | None = None
        # misses whose evidence is still to be filed: the response can reach the client before
        # `on_end` has stored it (tests and drains wait for zero)
        self.pending_filings = 0

    # --- admin ------------------------------------------------------------------------------------

    async def set_source_version(self, name: str, version: str) -> SourceState:
        """`POST /admin/sources/{name}/version`: a new version makes older entries unreachable; the
        current one again confirms it. Raises KeyError, ValueError, VersionSuperseded (an older one)."""
        if name not in self._upstreams:
            raise KeyError(name)
        return await self.cache.versions.set(name, version)

    async def aclose(self) -> None:
        """Stop the audits still running (the store and the client are the app's to close)."""
        for task in list(self._background):
            task.cancel()

    # --- phases -----------------------------------------------------------------------------------

    async def on_request(self, ex: Exchange) -> Reply | None:
        caller = ex.caller
        if caller is not None and caller.reason == AMBIGUOUS:
            # which one did the upstream read? 400, never a union
            raise BadRequest(f"identity header {', '.join(map(repr, caller.notes))} was sent more than once; send it once",
                             code="ambiguous_identity")
        if ex.method != "POST" or ex.body is None:
            return None
        op = ex.call.operation
        if op not in ("retrieval", "embeddings", "rerank") or (op != "retrieval" and not self.cfg.exact_embeddings):
            return None
        control = ex.headers.get("cache-control", "").lower()
        principal = caller.principal if caller is not None else None
        if principal is None or ex.call.parse_error:
            self._bypass(ex, (caller.reason if caller is not None else "") or "parse_error")
            return None
        store = "no-store" not in control
        try:
            if op == "retrieval":
                hit, pending = await self._lookup_retrieval(ex, principal, "no-cache" in control, store)
            else:
                hit, pending = await self._lookup_exact(ex, principal, "no-cache" in control)
        except UpstreamError:
            raise  # the failure of the duplicate in flight this call waited for (`_wait`) is its own
        except Exception as exc:  # noqa: BLE001 - a store or embedder failure is a miss, never an error
            if ex.span is not None:
                ex.span.record_exception(exc)
            self._bypass(ex, "store_error")
            return None
        if hit is not None:
            ex.proposal = hit.reply
            return None
        if pending is not None and store:
            ex.filing = pending
            self.pending_filings += 1
        return None

    def on_chunk(self, ex: Exchange, chunk: bytes) -> bytes | None:
        pending = ex.filing
        if pending is not None and not pending.too_big:
            pending.size += len(chunk)
            if pending.size > self.cfg.max_body_bytes:
                pending.too_big, pending.parts = True, []
            else:
                pending.parts.append(chunk)
        return None

    async def on_response(self, ex: Exchange) -> None:
        """The answer was read whole, before its head goes out: land it for the duplicates waiting."""
        pending = ex.filing
        lk = pending.lookup if pending is not None else None
        if pending is None or lk is None or pending.too_big or ex.status != 200:
            return
        made = self._entry(ex, lk, b"".join(pending.parts))
        if made is not None:
            pending.entry, pending.version = made
            if self.cache.known_current(lk, pending.version):
                self.cache.land(lk, pending.entry)

    async def on_end(self, ex: Exchange) -> None:
        pending, ex.filing = ex.filing, None
        if pending is None:
            return
        try:
            # an answer read whole (its entry made) is the upstream's in full, whatever became of the
            # client; a streamed one only when it reached its end
            if pending.entry is None and (pending.too_big or ex.status != 200 or ex.outcome != "ok"
                                          or not ex.complete):
                return
            body = b"".join(pending.parts)
            if pending.key is not None:
                entry = Entry("", None, (), (), body, owner=None, created=self._clock())
                await self.store.put(pending.key[0], pending.key[1], entry, None, self.cfg.ttl_s)
            elif pending.lookup is not None:
                made = self._entry(ex, pending.lookup, body) if pending.entry is None else \
                    (pending.entry, pending.version)
                if made is not None:
                    await self.cache.store_evidence(pending.lookup, version=made[1], entry=made[0])
        except Exception as exc:  # noqa: BLE001 - failing to cache never fails the call
            if ex.span is not None:
                ex.span.record_exception(exc)
        finally:
            if pending.lookup is not None:
                self.cache.end(pending.lookup, *_outcome(ex))
            self.pending_filings -= 1

    # --- retrieval --------------------------------------------------------------------------------

    async def _lookup_retrieval(self, ex: Exchange, principal: Principal, no_cache: bool,
                                store: bool) -> tuple[CacheHit | None, Filing | None]:
        call = ex.call
        text = call.query if isinstance(call.query, str) else ""
        if not text.strip() and call.query_vector is None:
            self._bypass(ex, "no_query")
            return None, None
        up = ex.route.upstream
        q = Query(up.name, text, call.filters, call.top_k, principal, selector(ex.target, call.selector),
                  call.query_vector, up.name in self._scoped, self._prober(ex))
        # a miss to be filed leads a flight: duplicates arriving meanwhile wait for it (on_end ends it)
        lk = await self.cache.lookup(q, serve=not no_cache, lead=store)
        if no_cache:
            self._bypass(ex, "no-cache")
            return None, Filing(lk)
        waited = None
        if lk.wait is not None:
            t0 = time.perf_counter()
            try:
                await self._wait(ex, lk, store)
            except BaseException:
                self.cache.end(lk)
                raise
            waited = time.perf_counter() - t0
            lk.seconds += waited
        self._annotate(ex, lk.tier, lk.similarity, lk.reason, lk.seconds, lk.partition)
        self._describe(ex, lk, waited)
        if lk.entry is None:
            return None, Filing(lk)
        reply = self._reply(up, lk.entry, call.top_k, lk.tier or "exact")
        hit = CacheHit(reply, lk.tier or "exact", lk.similarity or 1.0, lk.entry)
        if lk.tier == "semantic" and self.auditor.sample():
            self._spawn(self._audit(ex, lk, hit))
        return hit, None

    async def _wait(self, ex: Exchange, lk: Lookup, lead: bool) -> None:
        """Wait for the retrieval in flight `lk.wait`, and be served its answer (`cache.admit`).
        Never past the call's own read timeout, nor its task's deadline (`wait_allowance`, asked
        before waiting: a task already past it goes on at once, to its budget's refusal). A leader
        that failed hands the key to one waiter (`cache.relay`); the others wait for that one. After
        flights.MAX_FAILURES upstream failures in a row, the failure is this call's too (502)."""
        up = ex.route.upstream
        limit = read = (ex.timeouts or up.timeouts).read
        if self.wait_allowance is not None:
            left = await self.wait_allowance(ex)
            if left is not None:
                limit = min(read, left)
        until = time.perf_counter() + limit
        while lk.wait is not None:
            flight = lk.wait
            left = until - time.perf_counter()
            if left <= 0 and limit < read:
                lk.wait, lk.reason = None, "inflight:deadline"  # the budget refuses it next
                return
            try:
                landed = await asyncio.wait_for(asyncio.shield(flight.landed), max(left, 0.0))
            except TimeoutError:
                if limit < read:
                    lk.wait, lk.reason = None, "inflight:deadline"
                    return
                raise UpstreamTimeout(f"the same query, in flight for another call, was not answered within "
                                      f"this call's read timeout ({read:g} s); not sent again") from None
            if landed is not None or flight.outcome == UNFILED:
                await self.cache.admit(lk, landed)  # served, or a miss of its own (not servable, unfiled)
                lk.wait = None
                return
            if flight.outcome == FAILED and flight.failures + 1 >= MAX_FAILURES:
                raise UpstreamUnavailable(
                    f"the upstream failed {flight.failures + 1} times in a row for this query (last status "
                    f"{flight.status or 'none'}) while this call waited for it; not sent again",
                    upstream_status=flight.status)
            self.cache.relay(lk, flight, lead=lead)
            lk.reason = "inflight:relay"

    def _entry(self, ex: Exchange, lk: Lookup, body: bytes) -> tuple[Entry, str | None] | None:
        """The entry a miss's answer becomes, and the version it carried; None when it cannot be filed."""
        obs = ex.observation
        if obs.chunks is None or obs.parse_error:
            return None
        ids = [c.id for c in obs.chunks]
        if not all(ids):
            return None
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        version = obs.source_version or _version(ex, self.cfg.version_field, doc)
        fields = ex.route.upstream.fields
        vocab = metadata_words(get_path(doc, fields.get("results", "results")),
                               {fields.get("text", "text"), fields.get("id", "id"), fields.get("score", "score")})
        entry = self.cache.make_entry(lk, chunk_ids=ids, acls=[c.acl for c in obs.chunks], body=body, vocab=vocab,
                                      version=version, scores=[c.score for c in obs.chunks])
        return entry, version

    def _reply(self, upstream: UpstreamConfig, entry: Entry, top_k: int | None, tier: str) -> Reply:
        body = entry.body
        if top_k is not None and entry.top_k is not None and top_k < entry.top_k:
            body = trim_results(body, upstream.fields.get("results", "results"), top_k)
        headers = [(CACHE_HEADER, f"hit; tier={tier}".encode()), (b"age", str(int(age_of(entry, self._clock()))).encode())]
        name = upstream.fields.get("version_header")
        if name and entry.version:  # what the upstream said with this evidence, as it said it
            headers.append((name.lower().encode(), entry.version.encode()))
        return Reply(200, body, headers, entry.content_type.encode())

    def _prober(self, ex: Exchange) -> Probe | None:
        """The source's version probe, asked on this caller's behalf (its credentials, never its
        body), through the app's upstream client."""
        probe = ex.route.upstream.cache.probe
        if probe is None:
            return None
        upstream, raw = ex.route.upstream, ex.raw_headers

        async def run() -> str | None:
            headers = [(k, v) for k, v in upstream_headers(raw) if k.lower() not in _NOT_PROBED]
            body = probe.body.encode() if probe.body else b""
            if body:
                headers.append((b"content-type", b"application/json"))
            t = probe.timeout_s
            async with asyncio.timeout(t * 2):
                status, answer, answer_headers = await self._client.fetch(
                    upstream, probe.method, probe.path, headers, body, timeouts=Timeouts(t, t, t, t))
            return probed_version(probe.field, probe.header or upstream.fields.get("version_header") or "", status,
                                  answer, answer_headers)

        return run

    # --- embeddings and rerank: exact, keyed by the request body and the caller ------------------

    async def _lookup_exact(self, ex: Exchange, principal: Principal,
                            no_cache: bool) -> tuple[CacheHit | None, Filing | None]:
        try:
            canon = orjson.dumps(orjson.loads(ex.body or b""), option=orjson.OPT_SORT_KEYS)
        except orjson.JSONDecodeError:
            self._bypass(ex, "not_json")
            return None, None
        # Keyed by the caller too: a credential the upstream would refuse never gets its answers.
        part = Partition(ex.route.upstream.name, "exact:" + ex.target, b"", principal.key)
        bkey = xxhash.xxh3_128_hexdigest(canon)
        pending = Filing(None, (part.key, bkey))
        if no_cache:
            self._bypass(ex, "no-cache")
            return None, pending
        t0 = time.perf_counter()
        entry = await self.store.get(part.key, bkey)
        self._annotate(ex, "exact" if entry else None, 1.0 if entry else None, "none",
                       time.perf_counter() - t0, part)
        if entry is None:
            return None, pending
        reply = Reply(200, entry.body, [(CACHE_HEADER, b"hit; tier=exact")], entry.content_type.encode())
        return CacheHit(reply, "exact", 1.0, entry), None

    # --- telemetry --------------------------------------------------------------------------------

    def _annotate(self, ex: Exchange, tier: str | None, similarity: float | None, reason: str, seconds: float,
                  part: Partition) -> None:
        result = "hit" if tier else "miss"
        attrs: dict[str, Any] = {sc.CACHE_RESULT: result, sc.CACHE_HIT: tier is not None,
                                 sc.CACHE_LOOKUP_MS: round(seconds * 1000, 3)}
        if tier:
            attrs[sc.CACHE_TIER] = tier
        if similarity is not None:
            attrs[sc.CACHE_SIMILARITY] = round(similarity, 4)
        if not tier and reason:
            attrs[sc.CACHE_REASON] = reason
        if tier == "semantic" or (not tier and ex.call.operation == "retrieval"):
            attrs[sc.CACHE_THRESHOLD] = self.auditor.threshold(part.source)
        if ex.span is not None:
            ex.span.set_attributes(attrs)
        ex.cache = CacheOutcome(result, tier, similarity)

    def _describe(self, ex: Exchange, lk: Lookup, waited: float | None) -> None:
        """Which rules decided a retrieval lookup: the version, and for a hit its view rule and freshness."""
        if ex.span is None:
            return
        attrs: dict[str, Any] = {sc.CACHE_VERSION: lk.partition.version}
        if lk.p_wrong is not None:  # the calibrated estimate of the last semantic candidate judged
            attrs[sc.CACHE_P_WRONG] = round(lk.p_wrong, 4)
        if lk.entry is not None:
            attrs[sc.CACHE_VIEW] = lk.view or acl.view_rule(lk.entry.scope, lk.entry.owner)
            attrs[sc.CACHE_FRESHNESS] = lk.freshness or ""
            attrs[sc.CACHE_AGE_S] = round(age_of(lk.entry, self._clock()), 3)
        if waited is not None:
            attrs[sc.CACHE_WAITED_MS] = round(waited * 1000, 3)
        ex.span.set_attributes(attrs)

    def _bypass(self, ex: Exchange, reason: str) -> None:
        if ex.span is not None:
            ex.span.set_attributes({sc.CACHE_RESULT: "bypass", sc.CACHE_HIT: False, sc.CACHE_REASON: reason})
        ex.cache = CacheOutcome("bypass")

    # --- self-audit, off the request path ----------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _audit(self, ex: Exchange, lk: Lookup, hit: CacheHit) -> None:
        parent = trace.set_span_in_context(ex.span) if ex.span is not None else None
        with self._tracer.start_as_current_span("cache.audit " + ex.route.upstream.name, context=parent) as span:
            try:
                headers = [(k, v) for k, v in upstream_headers(ex.raw_headers) if k.lower() != b"content-length"]
                status, body, resp_headers = await self._client.fetch(ex.route.upstream, ex.method, ex.target,
                                                                      headers, ex.body or b"", timeouts=_SHORT)
                observer = ex.route.adapter.observer(ex.call, status, resp_headers)
                observer.feed(body, True)
                chunks = observer.observation.chunks
                if status != 200 or chunks is None:
                    span.set_attribute(sc.CACHE_REASON, f"audit:upstream_{status}")
                    return
                result = compare(hit.entry.chunk_ids, [c.id for c in chunks], ex.call.top_k)
                raised = await self.auditor.record(lk.partition.source, result,
                                                   audit_id(lk.partition.key, hit.entry.query), hit.similarity)
                attrs: dict[str, Any] = {sc.CACHE_AUDIT_SAME_TOP: result.same_top,
                                         sc.CACHE_AUDIT_OVERLAP: round(result.overlap, 4),
                                         sc.CACHE_AUDIT_AGREES: result.agrees,
                                         sc.CACHE_SIMILARITY: round(hit.similarity, 4),
                                         sc.CACHE_THRESHOLD: raised or self.auditor.threshold(lk.partition.source),
                                         sc.CACHE_MAX_ERROR: self.auditor.bound_now(lk.partition.source)}
                span.add_event(sc.EVENT_CACHE_AUDIT, attrs)
                self._audits.add(1, {sc.CACHE_AUDIT_AGREES: result.agrees, sc.UPSTREAM: ex.route.upstream.name})
                rate, _ = self.auditor.error_rate(lk.partition.source)
                route = {sc.UPSTREAM: ex.route.upstream.name}
                self._audit_error.set(rate, route)
                self._max_error.set(self.auditor.bound_now(lk.partition.source), route)
            except Exception as exc:  # noqa: BLE001 - an audit failure only costs the sample
                span.record_exception(exc)


def evidence_cache(settings: Settings, store: EvidenceStore, client: UpstreamClient, *,
                   embedder: Embedder | None = None, clock: Callable[[], float] = time.time) -> EvidenceCache:
    """The evidence cache the stage serves from, made once in the app's lifespan: its store, the
    configured embedder (`cache.embedder`) and external authz, which reach their upstreams through
    the app's one client, the self-audit and the source versions."""
    cfg = settings.cache
    upstreams = {u.name: u for u in settings.upstreams}

    async def post_embeddings(body: bytes) -> tuple[int, bytes]:
        upstream = upstreams[cfg.embedder[len("upstream:"):]]
        target = "/embeddings" if upstream.url.rstrip("/").endswith("/v1") else "/v1/embeddings"
        status, raw, _ = await client.fetch(upstream, "POST", target, [(b"content-type", b"application/json")], body,
                                            timeouts=_SHORT)
        return status, raw

    async def post_url(url: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        authz = UpstreamConfig(name="authz", kind="other", url=url)
        t = Timeouts(connect=timeout_s, read=timeout_s, write=timeout_s, pool=timeout_s)
        async with asyncio.timeout(timeout_s * 2):
            status, raw, _ = await client.fetch(authz, "POST", "", [(b"content-type", b"application/json")], body,
                                                timeouts=t)
        return status, raw

    if embedder is None:
        embedder = make_embedder(cfg.embedder, post_embeddings, cfg.embedder_model)
    authz = acl.ExternalAuthz(cfg.authz_url, post_url, cfg.authz_ttl_s, cfg.authz_timeout_s) if cfg.authz_url else None
    staleness = {u.name: u.cache.max_staleness_s for u in settings.upstreams if u.cache.max_staleness_s}
    return EvidenceCache(store, embedder=embedder, versions=Versions(store, cfg.sources, now=clock),
                         similarity=cfg.similarity, reach=cfg.reach, candidates=cfg.candidates, ttl_s=cfg.ttl_s, public=cfg.acl_public,
                         authz=authz, auditor=Auditor(cfg.audit_fraction, cfg.similarity, cfg.audit_target,
                                                      cfg.audit_step, max_error=cfg.max_error),
                         calibration=calibration.shipped() if cfg.max_error < 1 else None,
                         min_top_margin=cfg.min_top_margin, max_staleness_s=cfg.max_staleness_s, staleness=staleness,
                         normalize=cfg.normalize,
                         normalize_routes={u.name: u.cache.normalize for u in settings.upstreams
                                           if u.cache.normalize is not None},
                         clock=clock)


def _outcome(ex: Exchange) -> tuple[str, int | None]:
    """How a leader that landed nothing ended, for its waiters (cache.flights): the upstream answered
    but nothing was filed (UNFILED); the upstream failed (FAILED: 5xx, 408, 429, timeout, broken);
    or the leader's own failure (GONE: refused credentials or another 4xx that may be this caller's
    request, its client gone, its call refused here)."""
    status = ex.status
    if ex.outcome == "upstream_error" or (status is not None and (status >= 500 or status in (408, 429))
                                          and ex.outcome != "rejected"):
        return FAILED, status
    if status is not None and 200 <= status < 300 and ex.outcome == "ok":
        return UNFILED, status
    return GONE, status


def _version(ex: Exchange, field: str | None, doc: Any) -> str | None:
    """The source version a response carried: the adapter's (header or field), else `cache.version_field`."""
    if ex.observation.source_version:
        return ex.observation.source_version
    if not field:
        return None
    found = get_path(doc, field) if isinstance(doc, dict) else None
    return str(found) if isinstance(found, (str, int)) and not isinstance(found, bool) else None
