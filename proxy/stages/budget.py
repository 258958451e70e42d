"""Budget stage: reserve before forwarding, extend a stream's reservation as it runs (cutting it
when the task has nothing left), settle after.

Guarantees: one store round trip before forwarding (reserve) and one after (settle, in `on_end`,
only for admitted calls), plus one per extension of a stream's hold, which never delivers output
beyond what it holds; a refused call never reaches the upstream and raises `BudgetExceeded`
(the pipeline renders it with `x-should-retry: false`); every response carries
`x-ragtoll-budget-remaining`. A local answer another stage proposed (a cache hit) is charged as
a call. Store calls go through `stores.breaker.Breaker` (bounded by `store_timeout_ms`, skipped for
a moment per failure domain after a failure); a failing store forwards and marks the call
degraded (`on_store_error: open`) or answers 503 (`closed`).
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from ragtoll.instrumentation import semconv as sc

from ..config import Profile, Settings, Timeouts
from ..core import budget as bm
from ..core.budget import Actual, Charge, Ledger, Selection, Ticket
from ..core.classifier import classify as _classify
from ..core.hold import StreamHold
from ..core.pricing import Prices, Quote, allowed_output
from ..core.profiles import Profiles
from ..core.progress import ProgressRules, RecentQueries
from ..core.signing import signed_profile, verify_budget_baggage
from ..errors import BudgetExceeded, StoreUnavailable, UnreadableBody
from ..request.exchange import Exchange, Reply, Stage
from ..stores.base import Decision, Store, TaskMeta
from ..stores.breaker import Breaker
from . import exhaustion
from .stream_guard import StreamGuard, flush_annotation

REMAINING_HEADER = b"x-ragtoll-budget-remaining"
WARNING_HEADER = b"x-ragtoll-budget-warning"
WOULD_REJECT_HEADER = b"x-ragtoll-budget-would-reject"
EXHAUSTED_HEADER = b"x-ragtoll-budget-exhausted"  # an empty answer in place of a refused search or rerank
FINISHED_HEADER = b"x-ragtoll-budget-finished"  # this call went past that limit once, tools disabled
# timers fire at or after the clamped timeout; the wall clock may read a hair earlier than the deadline
DEADLINE_SLACK_MS = 10


class BudgetStage(Stage):
    def __init__(self, settings: Settings, store: Store, *, hmac_key: bytes | None,
                 wall_ms: Callable[[], int] | None = None,
                 classify: Callable[[str], tuple[str, str]] | None = None) -> None:
        """`hmac_key`: the operator's key for signed budget baggage (secrets.hmac_key), or None."""
        self.settings = settings
        self.cfg = settings.budgets
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self.store = Breaker(store, settings.store_timeout_ms / 1000, self._wall_ms,
                             self.cfg.reservation_ttl_s * 1000)
        self.guard = StreamGuard(self.store, settings.on_store_error, self._wall_ms)
        self.prices: Prices | None = Prices.from_settings(settings)
        self.profiles = Profiles(self.cfg, classify or _classify, self._profile_signed)
        self.hmac_key = hmac_key
        self._units: dict[str, dict[str, int]] = {}  # profile -> its limits in internal units
        self.progress_rules = ProgressRules()
        self._queries = RecentQueries()

    # --- before forwarding ------------------------------------------------------------------------

    async def on_request(self, ex: Exchange) -> Reply | None:
        if ex.task is None:
            return None
        local = ex.proposal is not None  # answered here (a cache hit): charged as a call
        baggage = dict(ex.task.baggage)
        task_id = ex.task.id
        call = ex.call
        sel = self.profiles.choose(task_id, ex.route.upstream.name, ex.headers, baggage, call.prompt_texts,
                                   call.query, call.user_text)
        if call.parse_error and not local:
            self._unreadable(ex, sel.profile)
        # one price quote per call (cost is linear in output): the charge and the stream allowance
        quote = self.prices.quote(ex.route.upstream, call) if self.prices is not None and not local else None
        charge = self._charge(ex, local, quote)
        now = self._wall_ms()
        try:
            limits, notes = self._limits(sel.profile, baggage, task_id, now)
            decision = await self._reserve(ex, sel, limits, charge, now)
            if decision.profile_conflict:  # another replica chose first: the task keeps its profile
                sel = Selection(decision.profile_conflict, "task")
                self.profiles.remember(task_id, sel)
                limits, notes = self._limits(sel.profile, baggage, task_id, now)
                decision = await self._reserve(ex, sel, limits, charge, now)
            if not decision.admitted and (climbed := await self._escalate(task_id, sel, decision)):
                sel = climbed
                limits, notes = self._limits(sel.profile, baggage, task_id, now)
                decision = await self._reserve(ex, sel, limits, charge, now)
        except Exception as exc:  # noqa: BLE001 - any store failure: open or closed, never hang
            self._store_failed(ex, exc)
            return None
        if decision.profile_conflict:
            self._store_failed(ex, RuntimeError("profile conflict did not resolve"))
            return None
        profile, shadow = self._profile(sel.profile), self._shadow(sel.profile)
        finished = None
        if not decision.admitted and exhaustion.may_finish(ex, profile, decision, shadow) and exhaustion.rewrite(ex, profile):
            try:  # past the limit on purpose, charged: no stream cut, no deadline clamp
                finished, decision, limits = decision.dimension, await self._reserve(ex, sel, {}, charge, now), {}
            except Exception as exc:  # noqa: BLE001 - as any store failure
                self._store_failed(ex, exc)
                return None
        elif decision.admitted and exhaustion.finishes(ex, profile, shadow) \
                and (ended := bm.exhausted(limits, decision.ledger)) and exhaustion.rewrite(ex, profile):
            finished = ended  # the task can search no more: answer now
        if finished:
            ex.response_headers.append((FINISHED_HEADER, finished.encode()))
        ticket = ex.ticket = Ticket(decision.admitted, charge, decision.reservation, limits, sel.profile, shadow,
                                    dimension=decision.dimension, seen_chunks=decision.seen_chunks,
                                    finished=finished)
        left, warn = self._headers(ex, ticket, decision, charge, now)
        if not decision.admitted:
            self._annotate(ex, sel, notes, decision, charge, now, left, warn, time.time_ns())
            empty = exhaustion.empty_result(ex, profile)
            if empty is None:
                raise self._exceeded(ex, decision, charge, now)
            ex.outcome = "rejected"
            return Reply(200, empty, [(EXHAUSTED_HEADER, (decision.dimension or "").encode())])
        # The span attributes wait for on_end (spans are exported only when they end): the
        # ~40 attributes and events then cost nothing before the first byte reaches the client.
        ticket.annotate = functools.partial(self._annotate, ex, sel, notes, decision, charge, now, left, warn,
                                            time.time_ns())
        self._prepare_stream(ex, ticket, decision.ledger, now, quote)
        if ticket.deadline_ms is not None:
            ex.timeout_error = functools.partial(self._deadline_exceeded, ex)
        return None

    def on_task_end(self, task_id: str) -> None:
        self.profiles.forget(task_id)
        self._queries.forget(task_id)

    async def _escalate(self, task_id: str, sel: Selection, refusal: Decision) -> Selection | None:
        """The task's selection after it climbed to its profile's `escalate_to`, or None."""
        to = exhaustion.escalation(self._profile(sel.profile), refusal, self._shadow(sel.profile))
        if to is None or not await self.store.escalate(task_id, sel.profile, to, refusal.dimension or ""):
            return None
        note = f"escalated from {sel.profile!r} to {to!r}: {refusal.dimension} refused a task still making progress"
        climbed = Selection(to, "escalated", sel.cls, sel.reason, (*sel.notes, note))
        self.profiles.remember(task_id, climbed)
        return climbed

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

    def _profile_signed(self, baggage: Mapping[str, str], task_id: str) -> bool:
        return signed_profile(baggage, task_id, self.hmac_key, self._wall_ms() / 1000)

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

    def _unreadable(self, ex: Exchange, profile: str) -> None:
        """A body the adapter could not read is never forwarded unbudgeted: refused (400
        unreadable_body), or (`on_unreadable: charge_reservation`) charged as conservatively as it
        can be: a prompt token per 4 body bytes, the whole output reservation, a new query each."""
        call, body = ex.call, ex.body or b""
        mode = self.cfg.on_unreadable or ("charge_reservation" if self._shadow(profile) else "reject")
        if mode == "reject":
            if ex.span is not None:  # the span stage, after this one, does not run for a refused call
                ex.span.set_attribute(sc.PARSE_ERROR, (call.parse_error or "")[:300])
            raise UnreadableBody(
                f"the request body could not be read, so it cannot be budgeted ({call.parse_error}); send JSON "
                "(UTF-8, -16 or -32), or let budgets.on_unreadable: charge_reservation forward it at its reservation",
                reason=(call.parse_error or "")[:300])
        if call.prompt_tokens is None:
            call.prompt_tokens = len(body) // 4 + 1
        if call.operation == "retrieval" and call.query_key is None:
            call.query_key = "unreadable:" + hashlib.sha256(body).hexdigest()[:32]

    def _charge(self, ex: Exchange, cache_hit: bool, quote: Quote | None) -> Charge:
        call, up = ex.call, ex.route.upstream
        certain = reserve = 0.0
        if quote is not None and not quote.priced and ex.span is not None:
            ex.span.set_attribute(sc.COST_ESTIMATED, True)  # reserved at `pricing.default`
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
                             cost_certain_usd=certain, cost_reserve_usd=reserve, query_key=key, cache_hit=cache_hit,
                             classified=ex.route.adapter.reads_body)

    def _store_failed(self, ex: Exchange, exc: BaseException) -> None:
        store_failed(self.settings, ex, exc, "budget store")

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

    _flush_annotation = staticmethod(flush_annotation)

    def _annotate(self, ex: Exchange, sel: Selection, notes: list[str], d: Decision, charge: Charge, now: int,
                  left: dict[str, Any], warn: dict[str, float], at_ns: int) -> None:
        """The reservation on the call span: profile, limit/used/remaining per dimension, events at `at_ns`."""
        ticket = ex.ticket
        assert ticket is not None
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
        if ticket.finished:
            attrs[sc.BUDGET_FINISHED] = ticket.finished
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
        ticket = ex.ticket
        assert ticket is not None
        dim = d.dimension or "unknown"
        limit_u = ticket.limits.get(dim, 0)
        limit = bm.usd(limit_u) if dim == "max_cost_usd" else limit_u
        used = bm.used_value(dim, d.ledger, charge if dim == "max_prompt_tokens" else None, now)
        if dim == "max_cost_usd":
            used = round(used, 9)
        return self._rejection(ex, dim, limit, used)

    def _rejection(self, ex: Exchange, dim: str, limit: float, used: float) -> BudgetExceeded:
        """The refusal, with the status the route's SDKs do not retry (`budgets.reject_status` if set)."""
        assert ex.ticket is not None
        profile = ex.ticket.profile
        task_id = ex.task.id if ex.task else ""
        return BudgetExceeded(
            f"budget exhausted: {dim} limit {limit:g}, used {used:g} (profile {profile!r}, task {task_id!r}); "
            "this task may not make more calls of this kind",
            status=self.cfg.reject_status or ex.route.adapter.reject_status, dimension=dim, limit=limit, used=used,
            profile=profile, task_id=task_id,
        )

    def _deadline_exceeded(self, ex: Exchange) -> BudgetExceeded | None:
        """When the upstream timeout that `max_latency_ms` cut short expires: the budget's refusal
        (not a 504 an SDK would retry). None when the deadline has not passed (the upstream's own
        timeout was shorter)."""
        ticket, now = ex.ticket, self._wall_ms()
        if ticket is None or ticket.deadline_ms is None or now < ticket.deadline_ms - DEADLINE_SLACK_MS:
            return None
        limit = ticket.limits["max_latency_ms"]
        used = max(limit, now - (ticket.deadline_ms - limit))
        self._flush_annotation(ticket)  # the reservation's record first; this refusal amends it
        if ex.span is not None:
            ex.span.set_attributes({sc.BUDGET_EXCEEDED: True, sc.BUDGET_EXCEEDED_DIMENSION: "max_latency_ms"})
            ex.span.add_event(sc.EVENT_EXCEEDED, {"dimension": "max_latency_ms", "limit": limit, "used": used,
                                                  "mode": "enforce", "would_reject": False})
        return self._rejection(ex, "max_latency_ms", limit, used)

    def _prepare_stream(self, ex: Exchange, ticket: Ticket, ledger: Ledger, now: int, quote: Quote | None) -> None:
        """The stream's hold (its own reservation, extended as it runs), and the upstream timeout
        clamped to the deadline."""
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
        # its reservation, but never more than the task had left when it was admitted: the holds
        # of a task's streams never add up to more than its limit
        tokens = cost = None
        comp = limits.get("max_completion_tokens")
        if comp is not None:
            before = ledger.used("completion_tokens") - charge.completion_reserve
            tokens = min(charge.completion_reserve, max(0, comp - before))
        price = 0.0
        limit = limits.get("max_cost_usd")
        if limit is not None and quote is not None and ex.call.operation in bm.LLM_OPERATIONS:
            price = max(0.0, quote.per_output_usd) * bm.NANO
            before = ledger.used("cost_nusd") - charge.cost
            cost = min(charge.cost_reserve, max(0, limit - before - charge.cost_certain)) if price > 0 else None
        if tokens is not None or cost is not None:
            ticket.hold = StreamHold(tokens, cost, price, self.cfg.stream_extension_tokens)

    # --- while streaming ----------------------------------------------------------------------------

    def on_chunk(self, ex: Exchange, chunk: bytes) -> bytes | None:
        return self.guard.on_chunk(ex, chunk)

    # --- after the response ------------------------------------------------------------------------

    async def on_response(self, ex: Exchange) -> None:
        """A small retrieval answer was read whole, before its head goes out: how many of its chunks
        are new to the task (`ticket.new_chunks`, which the evidence stage describes). New means not
        among the chunks the task had when this call was admitted (the reservation brought them: no
        store round trip; the settle follows the body). A task past SEEN_CHUNKS_CAP settles here."""
        ticket = ex.ticket
        chunks = ex.observation.chunks
        if ticket is None or not ticket.admitted or ex.task is None or chunks is None:
            return
        seen = ticket.seen_chunks
        if seen is not None:
            ticket.new_chunks = len({c.id for c in chunks if c.id and c.id not in seen})
        else:
            ledger = await self._settle(ex, ticket)
            if ledger is not None:
                ticket.new_chunks = ledger.used("last_new")

    async def on_end(self, ex: Exchange) -> None:
        ticket = ex.ticket
        if ticket is not None:
            self._flush_annotation(ticket)
        if ticket is None or not ticket.admitted or ex.task is None or ticket.settled:
            return
        await self._settle(ex, ticket)

    async def _settle(self, ex: Exchange, ticket: Ticket) -> Ledger | None:
        """Replace the reservation with the call's actual use, once; record it on the span."""
        assert ex.task is not None
        self._flush_annotation(ticket)  # the reserve-time totals first; settle's replace some
        ticket.settled = True
        actual = self._actual(ex, ticket)
        try:
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
        if ticket.hold is not None:
            span.set_attribute(sc.BUDGET_STREAM_EXTENSIONS, ticket.extensions)
            span.set_attribute(sc.BUDGET_STREAM_HELD, max(0, int(ticket.hold.headroom(0))))
        if ledger is not None:
            now = self._wall_ms()
            left = bm.remaining(ticket.limits, ledger, None, now)
            for dim in ("max_context_tokens", "max_completion_tokens", "max_cost_usd", "max_stalled_retrievals",
                        "max_fruitless_retrievals"):
                if dim in ticket.limits:
                    span.set_attribute(sc.budget_used(dim), bm.used_value(dim, ledger, None, now))
                    span.set_attribute(sc.budget_remaining(dim), left[dim])
        if actual.chunk_ids is not None and ledger is not None:
            span.set_attribute(sc.EVIDENCE_STALLED, ledger.used("stalled"))
            span.set_attribute(sc.EVIDENCE_FRUITLESS, ledger.used("fruitless"))
            span.set_attribute(sc.EVIDENCE_NEW_CHUNKS, ledger.used("last_new"))
        if ticket.verdict is not None:
            span.set_attributes({sc.PROGRESS_PREFIX + k: v for k, v in ticket.verdict.attributes().items()})
        return ledger

    def _actual(self, ex: Exchange, ticket: Ticket) -> Actual:
        """The call's real use. Unknown pieces keep what was counted or reserved (never less)."""
        res, call, obs = ticket.reservation, ex.call, ex.observation
        if ticket.charge.cache_hit:  # charged as a call; its chunks are the task's evidence all the same
            chunks = tuple(ch.id for ch in obs.chunks) if call.operation == "retrieval" and obs.chunks else None
            return Actual(chunk_ids=chunks, fruitful=self._judge(ex, ticket) if chunks is not None else None)
        if ex.status is None or ex.status >= 400:  # no answer, or an error answer: nothing was produced
            return Actual()
        u = obs.usage
        context = u.input_tokens if u and u.input_tokens is not None else res.context_tokens
        # ragtoll stopped reading the answer (inspection.Inspector) or could not read the request
        unread = (obs.unread is not None or bool(call.parse_error)) and not (u and u.output_tokens is not None)
        if u and u.output_tokens is not None:
            completion = u.output_tokens
        elif unread:  # the whole reservation, at least
            completion = max(res.completion_tokens, obs.output_tokens_seen)
        elif call.stream:
            completion = obs.output_tokens_seen
        else:
            completion = res.completion_tokens
        cost = res.cost_nusd
        if self.prices is not None:
            # the tokens used, at the model's price or else at `pricing.default` (an estimate)
            c = self.prices.actual(ex.route.upstream, call, obs)
            if c.measured or call.operation not in bm.LLM_OPERATIONS:
                cost = round(c.usd * bm.NANO)
            if not c.priced and ex.span is not None:
                ex.span.set_attribute(sc.COST_ESTIMATED, True)
        if unread:
            cost = max(cost, res.cost_nusd)
        chunks = fruitful = None
        if call.operation == "retrieval" and obs.chunks is not None:
            chunks = tuple(ch.id for ch in obs.chunks)
            fruitful = self._judge(ex, ticket)
        if ticket.charge.completion_reserve == 0:
            context, completion = 0, 0  # not an LLM call: its tokens are not the task's context
        return Actual(context, completion, cost, chunks, fruitful, finished=ticket.finished is not None)

    def _judge(self, ex: Exchange, ticket: Ticket) -> bool | None:
        """The progress verdict on a retrieval read whole (core/progress.py), kept on the ticket for
        the span; None (judged by "any chunk new" in the store) for a task past SEEN_CHUNKS_CAP."""
        if ticket.seen_chunks is None or ex.task is None:
            return None
        ticket.verdict = self._queries.judge(ex.task.id, ex.observation.chunks, ticket.seen_chunks, ex.call.query,
                                             self.progress_rules)
        return ticket.verdict.fruitful


def _safe_store_name(url: str) -> str:
    """The store URL without credentials, for error bodies."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def store_failed(settings: Settings, ex: Exchange, exc: BaseException, what: str) -> None:
    """A store (`what`) failed for this call. Open: the call goes on without that budget (the span
    and metrics say so). Closed: 503."""
    reason = f"{what} failed: {type(exc).__name__}: {str(exc)[:200]}"
    if ex.span is not None:
        ex.span.set_attribute(sc.DEGRADED, True)
        ex.span.add_event(sc.EVENT_DEGRADED, {"reason": reason, "on_store_error": settings.on_store_error})
    if settings.on_store_error == "closed":
        raise StoreUnavailable(
            "the budget store did not answer in time and on_store_error is closed; the call was not forwarded",
            store=_safe_store_name(settings.store),
        ) from exc
    ex.degraded = reason
