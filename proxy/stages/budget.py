"""Budget stage: reserve before forwarding, cut streams that run out, settle after.

Guarantees: one store round trip before forwarding (reserve) and one after (settle, in `on_end`,
only for admitted calls); a refused call never reaches the upstream and raises `BudgetExceeded`
(the pipeline renders it with `x-should-retry: false`); every response carries
`x-ragtoll-budget-remaining`. Store calls are bounded by `store_timeout_ms`; a failing store
forwards and marks the call degraded (`on_store_error: open`) or answers 503 (`closed`), per
failure domain (`Store.failure_domain`: on Redis Cluster, the node that owns the task's slot).
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ragtoll.instrumentation import semconv as sc

from ..config import Profile, Settings, Timeouts
from ..core import budget as bm
from ..core.budget import Actual, Charge, Ledger, Reservation, Selection
from ..core.classifier import classify as _classify
from ..core.evidence_track import evidence_header
from ..core.pricing import Prices, Quote, allowed_output
from ..core.signing import load_key, verify_budget_baggage
from ..errors import BudgetExceeded, StoreUnavailable
from ..request.pipeline import Exchange, Reply
from ..stores.base import Decision, Store, TaskMeta

REMAINING_HEADER = b"x-ragtoll-budget-remaining"
EVIDENCE_HEADER = b"x-ragtoll-evidence"
OUTCOME_BAGGAGE = "ragtoll.outcome"
_VERDICTS = {"correct": True, "true": True, "incorrect": False, "false": False}
WARNING_HEADER = b"x-ragtoll-budget-warning"
WOULD_REJECT_HEADER = b"x-ragtoll-budget-would-reject"
MAX_CACHED_PROFILES = 100_000
# After a store failure, calls whose task lives in the same failure domain (on Redis Cluster: the
# same node) skip the store for this long (open: forward at once; closed: 503 at once) instead of
# each waiting out store_timeout_ms against a store that is down. Other domains are unaffected.
STORE_RETRY_MS = 1000
MAX_DOWN_DOMAINS = 1024  # domains remembered as down: a cluster's nodes (or slots, before its map is known)
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')  # the first id after "response.created"


@dataclass(slots=True)
class Ticket:
    """What on_request reserved, for on_chunk and on_end. Allowances in internal units, None = no cut."""

    admitted: bool
    charge: Charge
    reservation: Reservation
    limits: dict[str, int]
    profile: str
    shadow: bool
    token_allowance: int | None = None
    cost_allowance: int | None = None  # nano-USD left for this call's output tokens
    out_price_nusd: float = 0.0  # per output token
    deadline_ms: int | None = None
    tail_clean: bool = True  # the bytes sent so far end on an SSE event boundary
    response_id: str | None = None  # Responses API streams: the id the closing event must repeat
    dimension: str | None = None  # the limit that refused (enforce) or would have refused (shadow) the call
    cost_usd: float | None = None  # settled cost, set in on_end (for metrics)
    cut: str | None = None
    settled: bool = False  # settle ran (early, in on_response, or in on_end)
    annotate: Callable[[], None] | None = None  # the reservation's span record, run before settle or at on_end
    seen_chunks: frozenset[str] | None = None  # retrievals: the task's chunk ids when the call was admitted


class BudgetStage:
    def __init__(self, settings: Settings, store: Store, *, meter: Any = None,
                 env: Mapping[str, str] | None = None, wall_ms: Callable[[], int] | None = None,
                 classify: Callable[[str], tuple[str, str]] | None = None) -> None:
        # `meter` is accepted but unused: budget metrics (rejections by dimension, settled cost) are
        # recorded by instrumentation.metrics from `ex.state["budget"]` (Ticket) with the call's others.
        self.settings = settings
        self.cfg = settings.budgets
        self.store = store
        self.timeout = settings.store_timeout_ms / 1000
        self.prices: Prices | None = Prices.from_settings(settings)
        self.classify = classify or _classify
        # set by the app to TaskEnder.record_outcome: where baggage verdicts go
        self.on_outcome: Callable[[str, bool], Awaitable[object]] | None = None
        env = os.environ if env is None else env
        # a weak or unreadable key is a ConfigError at startup, not a silent "ignore every raise"
        self.hmac_key = load_key(self.cfg.hmac_key_env, self.cfg.hmac_key_file, env)
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self._profiles: OrderedDict[str, Selection] = OrderedDict()
        self._down_until: dict[str, int] = {}  # failure domain -> wall ms until which its store is skipped
        self._units: dict[str, dict[str, int]] = {}  # profile -> its limits in internal units

    # --- before forwarding ------------------------------------------------------------------------

    async def on_request(self, ex: Exchange) -> Reply | None:
        if ex.task is None:
            return None
        hit = ex.state.get("cache_hit")
        baggage = dict(ex.task.baggage)
        task_id = ex.task.id
        sel = self._selection(ex, baggage)
        # one price quote per call (cost is linear in output): the charge and the stream allowance
        quote = self.prices.quote(ex.route.upstream, ex.call) if self.prices is not None and hit is None else None
        charge = self._charge(ex, hit is not None, quote)
        now = self._wall_ms()
        domain = self.store.failure_domain(task_id)
        if now < self._down_until.get(domain, 0):
            skipped = StoreUnavailable(f"the store ({domain}) failed moments ago; not retried yet")
            return self._store_failed(ex, skipped, hit)
        try:
            async with asyncio.timeout(self.timeout):
                limits, notes = self._limits(sel.profile, baggage, task_id, now)
                decision = await self._reserve(ex, sel, limits, charge, now)
                if decision.profile_conflict:  # another replica chose first: the task keeps its profile
                    sel = Selection(decision.profile_conflict, "task")
                    self._remember(task_id, sel)
                    limits, notes = self._limits(sel.profile, baggage, task_id, now)
                    decision = await self._reserve(ex, sel, limits, charge, now)
        except Exception as exc:  # noqa: BLE001 - any store failure: open or closed, never hang
            self._mark_down(domain)
            return self._store_failed(ex, exc, hit)
        if decision.profile_conflict:
            return self._store_failed(ex, RuntimeError("profile conflict did not resolve"), hit)
        shadow = self._shadow(sel.profile)
        ticket = Ticket(decision.admitted, charge, decision.reservation, limits, sel.profile, shadow,
                        dimension=decision.dimension, seen_chunks=decision.seen_chunks)
        ex.state["budget"] = ticket
        left, warn = self._headers(ex, ticket, decision, charge, now)
        if not decision.admitted:
            self._annotate(ex, sel, notes, decision, charge, now, left, warn, time.time_ns())
            raise self._exceeded(ex, decision, charge, now)
        # The span attributes wait for on_end (spans are exported only when they end): the
        # ~40 attributes and events then cost nothing before the first byte reaches the client.
        ticket.annotate = functools.partial(self._annotate, ex, sel, notes, decision, charge, now, left, warn,
                                            time.time_ns())
        self._prepare_stream(ex, ticket, decision.ledger, now, quote)
        return hit.reply if hit is not None else None

    def _mark_down(self, domain: str) -> None:
        """Skip `domain`'s store for STORE_RETRY_MS. Bounded: expired windows go first, then the oldest."""
        now = self._wall_ms()
        down = self._down_until
        down.pop(domain, None)  # re-inserted last: the dict stays in order of marking
        if len(down) >= MAX_DOWN_DOMAINS:
            for d in [d for d, until in down.items() if until <= now]:
                del down[d]
            while len(down) >= MAX_DOWN_DOMAINS:
                del down[next(iter(down))]
        down[domain] = now + STORE_RETRY_MS

    def _selection(self, ex: Exchange, baggage: dict[str, str]) -> Selection:
        task_id = ex.task.id  # type: ignore[union-attr]
        sel = self._profiles.get(task_id)
        if sel is None or (baggage.get(bm.BAGGAGE_PROFILE) not in (None, sel.profile) and sel.source != "task"):
            call = ex.call
            classify = self.classify if self.cfg.classes else None
            sel = bm.select_profile(self.cfg, ex.route.upstream.name, ex.headers, baggage,
                                    bm.first_query(call.prompt_texts, call.query, call.user_text), classify)
            self._remember(task_id, sel)
        else:
            self._profiles.move_to_end(task_id)
        return sel

    def forget(self, record: Mapping[str, Any]) -> None:
        """A task ended (TaskEnder listener): its profile choice is no longer needed here."""
        self._profiles.pop(str(record.get("task_id")), None)

    def _remember(self, task_id: str, sel: Selection) -> None:
        self._profiles[task_id] = sel
        while len(self._profiles) > MAX_CACHED_PROFILES:
            self._profiles.popitem(last=False)

    def _limits(self, profile: str, baggage: dict[str, str], task_id: str, now_ms: int) -> tuple[dict[str, int], list[str]]:
        """The call's limits in internal units (never mutated by callers) and notes on its baggage."""
        if not any(k.startswith(bm.BAGGAGE_PREFIX) for k in baggage):
            units = self._units.get(profile)  # no budget baggage: the profile's own limits
            if units is None:
                units = self._units[profile] = bm.to_units(self._profile(profile).limits())
            return units, []
        raises, notes = verify_budget_baggage(baggage, task_id, self.hmac_key, now_ms / 1000)
        limits, lim_notes = bm.effective_limits(self._profile(profile), baggage, raises)
        return bm.to_units(limits), notes + lim_notes

    def _profile(self, name: str) -> Profile:
        # a task in a shared store may name a profile this replica's config no longer has
        return self.cfg.profiles.get(name) or self.cfg.profiles[self.cfg.default_profile]

    def _shadow(self, profile: str) -> bool:
        mode = self._profile(profile).mode or self.cfg.mode
        return mode == "shadow"

    async def _reserve(self, ex: Exchange, sel: Selection, limits: dict[str, int], charge: Charge,
                       now: int) -> Decision:
        task = ex.task
        assert task is not None  # on_request returns early for calls without a task
        meta = TaskMeta(sel.profile, sel.cls, ex.route.upstream.name, task.source, f"{task.trace_id:032x}")
        return await self.store.reserve(task.id, meta, limits, charge, now, self._shadow(sel.profile))

    def _charge(self, ex: Exchange, cache_hit: bool, quote: Quote | None) -> Charge:
        call, up = ex.call, ex.route.upstream
        certain = reserve = 0.0
        if quote is not None:
            total = quote.usd(allowed_output(call, self.cfg.default_max_output_tokens))
            if call.operation in bm.LLM_OPERATIONS:
                certain = quote.base_usd
                reserve = max(0.0, total - certain)
            else:
                certain = total
        key = getattr(call, "query_key", None) or bm.query_key_of(call.query)
        return bm.charge_for(up.kind, call.operation, prompt_tokens=call.prompt_tokens,
                             max_output_tokens=call.max_output_tokens,
                             default_max_output_tokens=self.cfg.default_max_output_tokens * max(1, call.choices),
                             cost_certain_usd=certain, cost_reserve_usd=reserve, query_key=key, cache_hit=cache_hit)

    def _store_failed(self, ex: Exchange, exc: BaseException, hit: Any) -> Reply | None:
        reason = f"budget store failed: {type(exc).__name__}: {str(exc)[:200]}"
        if ex.span is not None:
            ex.span.set_attribute(sc.DEGRADED, True)
            ex.span.add_event(sc.EVENT_DEGRADED, {"reason": reason, "on_store_error": self.settings.on_store_error})
        if self.settings.on_store_error == "closed":
            raise StoreUnavailable(
                "the budget store did not answer in time and on_store_error is closed; the call was not forwarded",
                store=_safe_store_name(self.settings.store),
            ) from exc
        ex.state["budget_degraded"] = reason
        return hit.reply if hit is not None else None

    def _headers(self, ex: Exchange, ticket: Ticket, d: Decision, charge: Charge,
                 now: int) -> tuple[dict[str, Any], dict[str, float]]:
        """The budget response headers; returns what is left and the warnings, for the span."""
        charged = charge if d.admitted else None
        left, warn = bm.standing(ticket.limits, d.ledger, charged, now, self.cfg.warn_fraction)
        if left:
            ex.response_headers.append((REMAINING_HEADER, bm.sf_dictionary(left)))
        if warn:
            ex.response_headers.append((WARNING_HEADER, bm.sf_dictionary({k: round(v, 3) for k, v in warn.items()})))
        if ticket.shadow and d.dimension:
            ex.response_headers.append((WOULD_REJECT_HEADER, d.dimension.encode()))
        return left, warn

    @staticmethod
    def _flush_annotation(ticket: Ticket) -> None:
        if ticket.annotate is not None:
            annotate, ticket.annotate = ticket.annotate, None
            annotate()

    def _annotate(self, ex: Exchange, sel: Selection, notes: list[str], d: Decision, charge: Charge, now: int,
                  left: dict[str, Any], warn: dict[str, float], at_ns: int) -> None:
        """The reservation on the call span: profile, limit/used/remaining per dimension, events at `at_ns`."""
        ticket: Ticket = ex.state["budget"]
        ledger = d.ledger
        charged = charge if d.admitted else None
        span = ex.span
        if span is None or not span.is_recording():
            return
        attrs: dict[str, Any] = {sc.PROFILE: sel.profile, sc.PROFILE_SOURCE: sel.source,
                                 sc.BUDGET_MODE: "shadow" if ticket.shadow else "enforce",
                                 sc.BUDGET_EXCEEDED: not d.admitted}
        if sel.cls:
            attrs[sc.QUERY_CLASS] = sel.cls
            attrs[sc.QUERY_CLASS_REASON] = sel.reason[:300]
        all_notes = list(sel.notes) + notes
        if all_notes:
            attrs[sc.BUDGET_NOTES] = all_notes[:20]
        if charge.query_key is not None:
            attrs[sc.QUERY_NEW] = d.reservation.new_query
        for dim, limit in ticket.limits.items():
            attrs[sc.budget_limit(dim)] = bm.usd(limit) if dim == "max_cost_usd" else limit
            attrs[sc.budget_used(dim)] = bm.used_value(dim, ledger, charged, now)
            attrs[sc.budget_remaining(dim)] = left[dim]
        if d.dimension:
            attrs[sc.BUDGET_EXCEEDED_DIMENSION if not ticket.shadow else sc.BUDGET_WOULD_REJECT] = d.dimension
        span.set_attributes(attrs)
        if d.admitted:
            span.add_event(sc.EVENT_CHARGE, timestamp=at_ns, attributes={k: v for k, v in (
                ("steps", charge.steps), ("calls", charge.calls), ("retrieval_calls", charge.retrieval_calls),
                ("rerank_calls", charge.rerank_calls), ("context_tokens", charge.context_tokens),
                ("completion_tokens_reserved", charge.completion_reserve),
                ("cost_usd_reserved", bm.usd(charge.cost)), ("unique_queries", int(d.reservation.new_query)),
                ("cache_hit", charge.cache_hit)) if v})
        for dim, share in warn.items():
            span.add_event(sc.EVENT_WARNING, {"dimension": dim, "used_fraction": round(share, 4)}, timestamp=at_ns)
        if d.dimension:
            limit = ticket.limits[d.dimension]
            span.add_event(sc.EVENT_EXCEEDED, timestamp=at_ns, attributes={
                "dimension": d.dimension, "limit": bm.usd(limit) if d.dimension == "max_cost_usd" else limit,
                "used": bm.used_value(d.dimension, ledger, charge if d.dimension == "max_prompt_tokens" else None, now),
                "mode": "shadow" if ticket.shadow else "enforce", "would_reject": ticket.shadow})

    def _exceeded(self, ex: Exchange, d: Decision, charge: Charge, now: int) -> BudgetExceeded:
        ticket: Ticket = ex.state["budget"]
        dim = d.dimension or "unknown"
        limit_u = ticket.limits.get(dim, 0)
        limit = bm.usd(limit_u) if dim == "max_cost_usd" else limit_u
        used = bm.used_value(dim, d.ledger, charge if dim == "max_prompt_tokens" else None, now)
        if dim == "max_cost_usd":
            used = round(used, 9)
        task_id = ex.task.id if ex.task else ""
        return BudgetExceeded(
            f"budget exhausted: {dim} limit {limit:g}, used {used:g} (profile {ticket.profile!r}, task {task_id!r}); "
            "this task may not make more calls of this kind",
            status=self.cfg.reject_status, dimension=dim, limit=limit, used=used, profile=ticket.profile,
            task_id=task_id,
        )

    def _prepare_stream(self, ex: Exchange, ticket: Ticket, ledger: Ledger, now: int, quote: Quote | None) -> None:
        """Allowances for mid-stream enforcement, and the upstream timeout clamped to the deadline."""
        limits, charge = ticket.limits, ticket.charge
        deadline = limits.get("max_latency_ms")
        if deadline is not None and ledger.started_ms and not ticket.shadow:
            ticket.deadline_ms = ledger.started_ms + deadline
            left_s = max(0.001, (ticket.deadline_ms - now) / 1000)
            t = ex.timeouts or ex.route.upstream.timeouts
            ex.timeouts = Timeouts(min(t.connect, left_s), min(t.read, left_s), min(t.write, left_s),
                                   min(t.pool, left_s))
        if not ex.call.stream or charge.completion_reserve <= 0:
            return
        comp = limits.get("max_completion_tokens")
        if comp is not None:
            ticket.token_allowance = max(0, comp - (ledger.used("completion_tokens") - charge.completion_reserve))
        cost = limits.get("max_cost_usd")
        if cost is not None and quote is not None and ex.call.operation in bm.LLM_OPERATIONS:
            ticket.out_price_nusd = max(0.0, quote.per_output_usd) * bm.NANO
            before = ledger.used("cost_nusd") - charge.cost
            ticket.cost_allowance = max(0, cost - before - charge.cost_certain)

    # --- while streaming ----------------------------------------------------------------------------

    def on_chunk(self, ex: Exchange, chunk: bytes) -> bytes | None:
        ticket: Ticket | None = ex.state.get("budget")
        if ticket is None or not ticket.admitted or not ex.call.stream or ticket.cut:
            return None
        seen = ex.observation.output_tokens_seen
        dim = None
        if ticket.token_allowance is not None and seen > ticket.token_allowance:
            dim = "max_completion_tokens"
        elif ticket.cost_allowance is not None and seen * ticket.out_price_nusd > ticket.cost_allowance:
            dim = "max_cost_usd"
        elif ticket.deadline_ms is not None and self._wall_ms() >= ticket.deadline_ms:
            dim = "max_latency_ms"
        if ticket.response_id is None and b'"response.created"' in chunk:
            m = _RESPONSE_ID.search(chunk, chunk.find(b'"response.created"'))
            ticket.response_id = m.group(1).decode("utf-8", "replace") if m else None
        if dim is None:
            ticket.tail_clean = chunk.endswith((b"\n\n", b"\r\n\r\n")) or (not chunk and ticket.tail_clean)
            return None
        self._flush_annotation(ticket)  # the reservation's events come before the cut's
        if ticket.shadow:  # record once what enforcement would have done; never cut
            ticket.cut = dim
            if ex.span is not None:
                ex.span.set_attribute(sc.BUDGET_WOULD_REJECT, dim)
                ex.span.add_event(sc.EVENT_EXCEEDED, {"dimension": dim, "stream_cut": False, "would_reject": True,
                                                      "mode": "shadow", "output_tokens_seen": seen})
            return None
        ticket.cut = dim
        if ex.span is not None:
            ex.span.set_attribute(sc.BUDGET_STREAM_CUT, dim)
            ex.span.add_event(sc.EVENT_EXCEEDED, {"dimension": dim, "stream_cut": True, "mode": "enforce",
                                                  "output_tokens_seen": seen})
        prefix = b""
        if not ticket.tail_clean:  # finish the event the client is in the middle of
            end, width = chunk.find(b"\n\n"), 2
            crlf = chunk.find(b"\r\n\r\n")
            if crlf >= 0 and (end < 0 or crlf < end):
                end, width = crlf, 4
            prefix = chunk[: end + width] if end >= 0 else b"\n\n"
        model = ex.observation.response_model or ex.call.model
        return prefix + bm.stream_end(ex.route.adapter.error_style, model, seen, ex.target.split("?", 1)[0],
                                      ticket.response_id, self._wall_ms() // 1000)

    # --- after the response ------------------------------------------------------------------------

    async def on_response(self, ex: Exchange) -> None:
        """A small retrieval answer was read whole: before its headers go out, count how many of
        its chunks are new to the task (`x-ragtoll-evidence`). New means not among the chunks the
        task had when this call was admitted (the reservation brought them: no store round trip;
        the settle follows the body). A task past SEEN_CHUNKS_CAP chunks settles here instead."""
        ticket: Ticket | None = ex.state.get("budget")
        chunks = ex.observation.chunks
        if ticket is None or not ticket.admitted or ex.task is None or chunks is None:
            return
        seen = ticket.seen_chunks
        if seen is not None:
            new = len({c.id for c in chunks if c.id and c.id not in seen})
        else:
            ledger = await self._settle(ex, ticket)
            if ledger is None:
                return
            new = ledger.used("last_new")
        ex.response_headers.append((EVIDENCE_HEADER, evidence_header(chunks, new).encode()))

    async def on_end(self, ex: Exchange) -> None:
        await self._baggage_outcome(ex)
        ticket: Ticket | None = ex.state.get("budget")
        if ticket is not None:
            self._flush_annotation(ticket)
        if ticket is None or not ticket.admitted or ex.task is None or ticket.settled:
            return
        await self._settle(ex, ticket)

    async def _baggage_outcome(self, ex: Exchange) -> None:
        """Baggage `ragtoll.outcome=correct|incorrect` records a verdict on the task, as
        `POST /admin/tasks/{id}/outcome` does; anything else is noted and ignored."""
        raw = dict(ex.task.baggage).get(OUTCOME_BAGGAGE) if ex.task is not None else None
        if raw is None or self.on_outcome is None or ex.task is None:
            return
        verdict = _VERDICTS.get(raw.strip().lower())
        if verdict is None:
            if ex.span is not None:
                note = f"baggage {OUTCOME_BAGGAGE}={raw[:32]!r} ignored: expected correct or incorrect"
                ex.span.set_attribute(sc.BUDGET_NOTES, [note])
            return
        try:
            async with asyncio.timeout(self.timeout):
                await self.on_outcome(ex.task.id, verdict)
        except Exception as exc:  # noqa: BLE001 - a verdict that cannot be written never fails the call
            if ex.span is not None:
                ex.span.add_event(sc.EVENT_DEGRADED, {"reason": f"outcome not recorded: {type(exc).__name__}"})

    async def _settle(self, ex: Exchange, ticket: Ticket) -> Ledger | None:
        """Replace the reservation with the call's actual use, once; record it on the span."""
        assert ex.task is not None
        self._flush_annotation(ticket)  # the reserve-time totals first; settle's replace some
        ticket.settled = True
        actual = self._actual(ex, ticket)
        try:
            async with asyncio.timeout(self.timeout):
                ledger = await self.store.settle(ex.task.id, ticket.reservation, actual, self._wall_ms())
        except Exception as exc:  # noqa: BLE001 - the response is (being) sent; record, never fail
            if ex.span is not None:
                ex.span.set_attribute(sc.DEGRADED, True)
                ex.span.add_event(sc.EVENT_DEGRADED, {"reason": f"settle failed: {type(exc).__name__}"})
            return None
        ticket.cost_usd = bm.usd(actual.cost_nusd)
        span = ex.span
        if span is None or not span.is_recording():
            return ledger
        span.set_attribute(sc.COST_USD, ticket.cost_usd)
        if ledger is not None:
            now = self._wall_ms()
            left = bm.remaining(ticket.limits, ledger, None, now)
            for dim in ("max_context_tokens", "max_completion_tokens", "max_cost_usd", "max_stalled_retrievals"):
                if dim in ticket.limits:
                    span.set_attribute(sc.budget_used(dim), bm.used_value(dim, ledger, None, now))
                    span.set_attribute(sc.budget_remaining(dim), left[dim])
        if actual.chunk_ids is not None and ledger is not None:
            span.set_attribute(sc.EVIDENCE_STALLED, ledger.used("stalled"))
            span.set_attribute(sc.EVIDENCE_NEW_CHUNKS, ledger.used("last_new"))
        return ledger

    def _actual(self, ex: Exchange, ticket: Ticket) -> Actual:
        """The call's real use. Unknown pieces keep what was counted or reserved (never less)."""
        res, call, obs = ticket.reservation, ex.call, ex.observation
        if ticket.charge.cache_hit:
            return Actual()
        if ex.status is None or ex.status >= 400:  # no answer, or an error answer: nothing was produced
            return Actual()
        u = obs.usage
        context = u.input_tokens if u and u.input_tokens is not None else res.context_tokens
        unread = obs.unread is not None and not (u and u.output_tokens is not None)
        if u and u.output_tokens is not None:
            completion = u.output_tokens
        elif unread:  # ragtoll stopped reading (inspection.Inspector): the whole reservation, at least
            completion = max(res.completion_tokens, obs.output_tokens_seen)
        elif call.stream:
            completion = obs.output_tokens_seen
        else:
            completion = res.completion_tokens
        cost = res.cost_nusd
        if self.prices is not None:
            c = self.prices.actual(ex.route.upstream, call, obs)
            if c.known or call.operation not in bm.LLM_OPERATIONS:
                cost = round(c.usd * bm.NANO)
        if unread:
            cost = max(cost, res.cost_nusd)
        chunks = None
        if call.operation == "retrieval" and obs.chunks is not None:
            chunks = tuple(ch.id for ch in obs.chunks)
        if ticket.charge.completion_reserve == 0:
            context, completion = 0, 0  # not an LLM call: its tokens are not the task's context
        return Actual(context, completion, cost, chunks)


def _safe_store_name(url: str) -> str:
    """The store URL without credentials, for error bodies."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url
