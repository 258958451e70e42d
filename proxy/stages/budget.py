"""Budget stage: reserve before forwarding, extend a stream's reservation as it runs (cutting it
when the task has nothing left), settle after.

Guarantees: one store round trip before forwarding (reserve) and one after (settle, in `on_end`,
only for admitted calls), plus one per extension of a stream's hold, which never delivers output
beyond what it holds; a refused call never reaches the upstream and raises `BudgetExceeded`
(the pipeline renders it with `x-should-retry: false`); every response carries
`x-ragtoll-budget-remaining`. A local answer another stage proposed (a cache hit) is charged as
a call. Store calls go through `stores.breaker.Breaker` (bounded by `store_timeout_ms`, skipped for
a moment per failure domain after a failure). While the store's answer is unknown, `on_store_error:
open` decides on the breaker's local ledger (same limits per task; the call is marked degraded and
counted in `ragtoll.budget.degraded_admissions` with bound `local`), `closed` answers 503. A call
forwarded with no budget at all (bound `none`) is a bug's path only: it is counted the same way.

One call's steps, each a small function over its typed values: `_plan` (profile, price, charge),
`_reserve` (the store's decision; a profile conflict or an escalation reserves again), `_finish`
(`on_exhausted: finish`), `_admit` (the `Admission` on the exchange, its headers, a refusal or the
stream's hold and deadline), `StreamGuard` (extend while streaming), `_settle` (the actual use).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ragtoll.instrumentation import semconv as sc

from ..config import Profile, Settings, Timeouts
from ..core import budget as bm
from ..core.budget import Actual, Admission, Charge, Ledger, Selection, Settlement
from ..core.ceilings import OutputCeilings
from ..core.classifier import classify as _classify
from ..core.hold import StreamHold, StreamState
from ..core.pricing import Prices, Quote, allowed_output
from ..core.profiles import Profiles
from ..core.progress import ProgressRules, RecentQueries, Verdict
from ..core.signing import signed_profile, verify_budget_baggage
from ..errors import BudgetExceeded, StoreUnavailable, UnreadableBody
from ..model import HEURISTIC_SOURCES, Call
from ..redact import redact
from ..request.exchange import Exchange, Reply, Stage, contract
from ..stores.base import Decision, Store, TaskMeta
from ..stores.breaker import LOCAL_MAX_TASKS, Breaker
from ..stores.memory import MemoryStore
from . import exhaustion
from .budget_span import flush_record, record_degraded, record_reservation, record_settlement
from .stream_guard import StreamGuard

REMAINING_HEADER = b"x-ragtoll-budget-remaining"
WARNING_HEADER = b"x-ragtoll-budget-warning"
WOULD_REJECT_HEADER = b"x-ragtoll-budget-would-reject"
EXHAUSTED_HEADER = b"x-ragtoll-budget-exhausted"  # an empty answer in place of a refused search or rerank
FINISHED_HEADER = b"x-ragtoll-budget-finished"  # this call went past that limit once, tools disabled
DEGRADED_HEADER = b"x-ragtoll-budget-degraded"  # `local`: decided on this replica's local ledger (store away)
CAPPED_HEADER = b"x-ragtoll-budget-output-cap"  # the output cap (tokens per answer) ragtoll set: what the task had left
_UNCAPPED = 1 << 62  # the most output of a call sent without a cap, when nothing else bounds it
# timers fire at or after the clamped timeout; the wall clock may read a hair earlier than the deadline
DEADLINE_SLACK_MS = 10


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a call asks of its task's budget, before the store is asked."""

    sel: Selection
    baggage: dict[str, str]
    charge: Charge
    quote: Quote | None
    now: int
    # LLM calls: the most output the call may produce as it would be sent, all answers together (its
    # cap, else its model's ceiling, else the default reservation); 0 for other calls
    most_output: int = 0


@dataclass(frozen=True, slots=True)
class _Reserved:
    """The store's decision, with the profile and limits it was made under."""

    sel: Selection
    limits: Mapping[str, int]
    notes: list[str]
    decision: Decision
    charge: Charge  # what was reserved (a finish's own charge past the limit)
    most_output: int = 0  # the most output the call may produce as it would be sent (_Plan.most_output)
    finished: str | None = None
    guessed: bool = False  # a heuristic task held to its progress limits only (tasks.session_budgets)


class BudgetStage(Stage):
    contract = contract(
        reads="task caller proposal call body route headers span timeouts",
        writes="admission stream_state budget_record body timeouts timeout_error degraded degraded_bound outcome "
               "response_headers budget_left",
        # `tallies`: the call's context-economy counts, settled with it (a retrieval may settle in on_response)
        response_reads="admission stream_state budget_record task call observation route target span tallies",
        response_writes="new_chunks settlement stream_state budget_record gate",
        end_reads="admission stream_state budget_record settlement task call observation status span route tallies",
        end_writes="settlement budget_record")

    def __init__(self, settings: Settings, store: Breaker, *, hmac_key: bytes | None,
                 wall_ms: Callable[[], int] | None = None,
                 classify: Callable[[str], tuple[str, str]] | None = None) -> None:
        """`store`: the app's budget store behind its breaker (`breaker_for`, made in the lifespan);
        `hmac_key`: the operator's key for signed budget baggage (secrets.hmac_key), or None."""
        self.settings = settings
        self.cfg = settings.budgets
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self.store = store
        self.guard = StreamGuard(self.store, settings.on_store_error, self._wall_ms)
        self.prices: Prices | None = Prices.from_settings(settings)
        self.ceilings = OutputCeilings(self.cfg.output_ceilings)
        self.profiles = Profiles(self.cfg, classify or _classify, self._profile_signed)
        self.hmac_key = hmac_key
        self._units: dict[str, dict[str, int]] = {}  # profile -> its limits in internal units
        self.progress_rules = ProgressRules()
        self._queries = RecentQueries()
        self._forgetting: set[asyncio.Task[None]] = set()  # local ledgers of ended tasks, being let go

    # --- before forwarding ------------------------------------------------------------------------

    async def on_request(self, ex: Exchange) -> Reply | None:
        if ex.task is None:
            return None
        plan = self._plan(ex)
        try:
            reserved = await self._finish(ex, plan, await self._reserve(ex, plan))
        except Exception as exc:  # noqa: BLE001 - any store failure: open or closed, never hang
            self._store_failed(ex, exc)
            return None
        if reserved.decision.degraded:  # the local ledger decided: the store's answer is unknown
            ex.degraded = f"budget store: {reserved.decision.degraded}; decided on the local ledger"
            record_degraded(ex.span, ex.degraded, on_store_error="open", bound="local")
            ex.response_headers.append((DEGRADED_HEADER, b"local"))
            if reserved.decision.admitted:
                ex.degraded_bound = "local"
        return self._admit(ex, plan, reserved)

    async def wait_allowance(self, ex: Exchange) -> float | None:
        """How long this call may wait for a duplicate retrieval in flight (the cache stage asks,
        before it waits): 0 when its task has already used a limit up or passed its deadline (the
        reservation refuses it next, at once); else the seconds left to `max_latency_ms`; None when
        the task has no deadline yet, or the store cannot say (then the call's read timeout bounds it)."""
        if ex.task is None:
            return None
        try:
            async with asyncio.timeout(self.store.timeout_s):
                ledger = await self.store.store.get_task(ex.task.id)
        except Exception:  # noqa: BLE001 - the reservation after it meets the store trouble again
            return None
        if ledger is None or not ledger.profile or self._shadow(ledger.profile):
            return None
        if ledger.exhausted:
            return 0.0
        now = self._wall_ms()
        limits, _ = self._limits(ledger.profile, dict(ex.task.baggage), ex.task.id, now)
        deadline = limits.get("max_latency_ms")
        if deadline is None or not ledger.started_ms:
            return None
        return max(0.0, (ledger.started_ms + deadline - now) / 1000)

    def _plan(self, ex: Exchange) -> _Plan:
        """The task's profile, the call's price and its charge. An unreadable body is refused here."""
        assert ex.task is not None
        call, local = ex.call, ex.proposal is not None  # answered here (a cache hit): charged as a call
        sel = self.profiles.choose(ex.task.id, ex.route.upstream.name, ex.headers, dict(ex.task.baggage),
                                   call.prompt_texts, call.query, call.user_text)
        if call.operation in bm.LLM_OPERATIONS or call.operation == "retrieval":
            self._queries.asked(ex.task.id, bm.first_query(call.prompt_texts, call.query, call.user_text))
        if call.parse_error and not local:
            self._unreadable(ex, sel.profile)
        # one price quote per call (cost is linear in output): the charge and the stream allowance
        quote = self.prices.quote(ex.route.upstream, call) if self.prices is not None and not local else None
        most = self._most_output(call) if call.operation in bm.LLM_OPERATIONS and not local else 0
        return _Plan(sel, dict(ex.task.baggage), self._charge(ex, local, quote, most), quote, self._wall_ms(), most)

    def _most_output(self, call: Call) -> int:
        """The most output an LLM call may produce as it would be sent, all its answers together: its
        cap; without one, its model's output ceiling (a stream: the default reservation, extended as
        it runs); else `default_max_output_tokens` per answer."""
        if call.max_output_tokens is not None and call.max_output_tokens >= 0:
            return max(call.max_output_tokens, call.choices)
        ceiling = None if call.stream else self.ceilings.of(call.model)
        return (ceiling or self.cfg.default_max_output_tokens) * max(1, call.choices)

    async def _reserve(self, ex: Exchange, plan: _Plan) -> _Reserved:
        """The store's decision. A task another replica gave a profile first keeps it (reserved again
        under it); a refused task still making progress climbs to `escalate_to` once (and again)."""
        reserved = await self._reserve_as(ex, plan, plan.sel)
        conflict = reserved.decision.profile_conflict
        if conflict:
            sel = Selection(conflict, "task")
            self.profiles.remember(ex.task.id, sel)  # type: ignore[union-attr]
            reserved = await self._reserve_as(ex, plan, sel)
        if not reserved.decision.admitted and (climbed := await self._escalate(ex, reserved)):
            reserved = await self._reserve_as(ex, plan, climbed)
        if reserved.decision.profile_conflict:
            raise RuntimeError("profile conflict did not resolve")
        return reserved

    async def _reserve_as(self, ex: Exchange, plan: _Plan, sel: Selection,
                          limits: Mapping[str, int] | None = None, charge: Charge | None = None) -> _Reserved:
        task = ex.task
        assert task is not None  # on_request returns early for calls without a task
        notes: list[str] = []
        guessed = False
        if limits is None:
            limits, notes = self._limits(sel.profile, plan.baggage, task.id, plan.now)
            if task.source in HEURISTIC_SOURCES and self.settings.tasks.session_budgets == "progress":
                guessed = True
                # a guessed task may hold many users: only a stalled search stops it (README, Budgets)
                limits = {d: v for d, v in limits.items() if d in bm.PROGRESS_DIMENSIONS}
                notes = [*notes, (f"task source {task.source!r} is a guess: count and cost limits not enforced "
                                  "(tasks.session_budgets: progress)")]
        charge = charge or plan.charge
        meta = TaskMeta(sel.profile, sel.cls, ex.route.upstream.name, task.source, f"{task.trace_id:032x}")
        decision = await self.store.reserve(task.id, meta, limits, charge, plan.now, self._shadow(sel.profile))
        return _Reserved(sel, limits, notes, decision, charge, plan.most_output, guessed=guessed)

    async def _escalate(self, ex: Exchange, refused: _Reserved) -> Selection | None:
        """The task's selection after it climbed to its profile's `escalate_to`, or None."""
        sel, decision = refused.sel, refused.decision
        to = exhaustion.escalation(self._profile(sel.profile), decision, self._shadow(sel.profile))
        task_id = ex.task.id  # type: ignore[union-attr]
        if to is None:
            return None
        try:  # the ledger that refused decides; a store that fails now leaves the refusal standing
            climbed_ok = await self.store.escalate(task_id, sel.profile, to, decision.dimension or "",
                                                   local=bool(decision.degraded))
        except Exception:  # noqa: BLE001
            return None
        if not climbed_ok:
            return None
        note = f"escalated from {sel.profile!r} to {to!r}: {decision.dimension} refused a task still making progress"
        climbed = Selection(to, "escalated", sel.cls, sel.reason, (*sel.notes, note))
        self.profiles.remember(task_id, climbed)
        return climbed

    async def _finish(self, ex: Exchange, plan: _Plan, reserved: _Reserved) -> _Reserved:
        """`on_exhausted: finish`: the task's first refused LLM call goes past its limit once, tools
        disabled, one answer, within the profile's finish allowance (`_finish_past`); an admitted
        LLM call of a task whose search has ended is asked to answer now."""
        profile, shadow, d = self._profile(reserved.sel.profile), self._shadow(reserved.sel.profile), reserved.decision
        finished = None
        if not d.admitted and exhaustion.may_finish(ex, profile, d, shadow):
            passed = await self._finish_past(ex, plan, reserved, profile)
            if passed is not None:
                reserved, finished = passed, d.dimension
        elif d.admitted and exhaustion.finishes(ex, profile, shadow) \
                and (ended := bm.exhausted(reserved.limits, d.ledger)) and exhaustion.rewrite(ex, profile):
            finished = ended  # the task can search no more: answer now
        if finished:
            ex.response_headers.append((FINISHED_HEADER, finished.encode()))
        return replace(reserved, finished=finished)

    async def _finish_past(self, ex: Exchange, plan: _Plan, refused: _Reserved, profile: Profile) -> _Reserved | None:
        """The finish past the limit, as an allowance: one answer, its output capped at
        `finish_max_output_tokens` and its cost, prompt included, at the finish cost allowance beyond
        what the task had used (at most its limit), so the task ends at most at its limit plus the
        allowance; a stream is held and cut within it like any other. None (refused as it was) when
        the prompt alone costs more than the allowance or the API cannot be asked to answer now."""
        tokens, cost_usd = profile.finish_allowance()
        allowance = round(cost_usd * bm.NANO)
        charge = plan.charge
        if charge.cost_certain > allowance:
            return None
        per_answer = max(1, plan.most_output // max(1, charge.choices))
        out = min(per_answer, tokens)
        price = plan.quote.per_output_usd if plan.quote is not None else 0.0
        finish = replace(charge, completion_reserve=out, cost_reserve=round(out * price * bm.NANO), choices=1)
        ledger, limits = refused.decision.ledger, refused.limits
        base = {dim: min(ledger.used(counter), limits[dim]) if dim in limits else ledger.used(counter)
                for dim, counter in (("max_completion_tokens", "completion_tokens"), ("max_cost_usd", "cost_nusd"))}
        allowed = {"max_completion_tokens": base["max_completion_tokens"] + tokens,
                   "max_cost_usd": base["max_cost_usd"] + allowance}
        if not exhaustion.rewrite(ex, profile):
            return None
        # the finish always goes out with a cap (the allowance's, if the call named none or a larger one)
        sent = per_answer if ex.call.max_output_tokens is not None else _UNCAPPED
        passed = await self._reserve_as(ex, replace(plan, most_output=sent), refused.sel, limits=allowed,
                                        charge=finish)
        return replace(passed, notes=refused.notes) if passed.decision.admitted else None

    def _admit(self, ex: Exchange, plan: _Plan, r: _Reserved) -> Reply | None:
        """The admission on the exchange and its headers; then a refusal (raised, or an empty answer),
        or the admitted call's deadline and stream hold."""
        d, shadow = r.decision, self._shadow(r.sel.profile)
        deadline = r.limits.get("max_latency_ms")
        adm = ex.admission = Admission(
            d.admitted, r.charge, d.reservation, r.limits, r.sel.profile, shadow, dimension=d.dimension,
            seen_chunks=d.seen_chunks, finished=r.finished,
            deadline_ms=d.ledger.started_ms + deadline if deadline is not None and d.ledger.started_ms and not shadow
            else None)
        left, warn = self._headers(ex, adm, d, plan.now)
        ex.budget_left = left  # the context stage's budget note reads it
        record = functools.partial(record_reservation, ex.span, adm, r.sel, r.notes, d, plan.now, left, warn,
                                   time.time_ns())
        if not d.admitted:
            record()
            empty = exhaustion.empty_result(ex, self._profile(r.sel.profile))
            if empty is None:
                raise self._exceeded(ex, d, plan.now)
            ex.outcome = "rejected"
            return Reply(200, empty, [(EXHAUSTED_HEADER, (d.dimension or "").encode())])
        ex.budget_record = record  # written when the call span has a moment (budget_span.py)
        if r.guessed:
            self._guessed_verdict(ex, r.sel.profile, plan, d)
        if not shadow and d.reservation.completion_tokens < r.most_output:
            self._cap_output(ex, r.charge, d.reservation.completion_tokens)
        if adm.deadline_ms is not None:
            left_s = max(0.001, (adm.deadline_ms - plan.now) / 1000)
            t = ex.timeouts or ex.route.upstream.timeouts
            ex.timeouts = Timeouts(min(t.connect, left_s), min(t.read, left_s), min(t.write, left_s),
                                   min(t.pool, left_s))
            ex.timeout_error = functools.partial(self._deadline_exceeded, ex)
        if ex.call.stream:
            ex.stream_state = StreamState(self._hold(ex, adm, d.ledger, plan.quote))
        return None

    def _guessed_verdict(self, ex: Exchange, profile: str, plan: _Plan, d: Decision) -> None:
        """A guessed task's shadow verdict: the count or cost limit its profile would have refused
        it by (`x-ragtoll-budget-would-reject`, a span event), had the task been named."""
        full, _ = self._limits(profile, plan.baggage, ex.task.id, plan.now)  # type: ignore[union-attr]
        for dim, limit in full.items():
            if dim in bm.PROGRESS_DIMENSIONS or dim in ("max_prompt_tokens", "max_latency_ms"):
                continue
            used = bm.used_value(dim, d.ledger, None, plan.now)
            value = bm.usd(limit) if dim == "max_cost_usd" else limit
            if used > value:
                ex.response_headers.append((WOULD_REJECT_HEADER, dim.encode()))
                if ex.span is not None:
                    ex.span.add_event(sc.EVENT_EXCEEDED, {"dimension": dim, "limit": value, "used": used,
                                                          "mode": "shadow", "would_reject": True})
                return

    def _cap_output(self, ex: Exchange, charge: Charge, granted: int) -> None:
        """Worst-case admission: the task had less left than the call may produce as sent, so its
        output cap becomes what was granted (per answer), written into the request."""
        if charge.completion_reserve <= 0 or ex.body is None:
            return
        per_answer = max(1, granted // max(1, charge.choices))
        body = ex.route.adapter.cap_output(ex.target.split("?", 1)[0], ex.body, per_answer)
        if body is None:
            return
        ex.body = body
        ex.response_headers.append((CAPPED_HEADER, str(per_answer).encode()))
        if ex.span is not None:
            ex.span.set_attribute(sc.BUDGET_OUTPUT_CAP, per_answer)

    def _hold(self, ex: Exchange, adm: Admission, ledger: Ledger, quote: Quote | None) -> StreamHold | None:
        """A stream's hold: its own reservation, but never more than the task had left when it was
        admitted, so the holds of a task's streams never add up to more than its limit."""
        limits, charge, res = adm.limits, adm.charge, adm.reservation
        if charge.completion_reserve <= 0:
            return None
        tokens = cost = None
        comp = limits.get("max_completion_tokens")
        if comp is not None:
            before = ledger.used("completion_tokens") - res.completion_tokens
            tokens = min(res.completion_tokens, max(0, comp - before))
        price = 0.0
        limit = limits.get("max_cost_usd")
        if limit is not None and quote is not None and ex.call.operation in bm.LLM_OPERATIONS:
            price = max(0.0, quote.per_output_usd) * bm.NANO
            before = ledger.used("cost_nusd") - res.cost_nusd
            held = res.cost_nusd - charge.cost_certain
            cost = min(held, max(0, limit - before - charge.cost_certain)) if price > 0 else None
        if tokens is None and cost is None:
            return None
        return StreamHold(tokens, cost, price, self.cfg.stream_extension_tokens)

    def on_task_end(self, task_id: str) -> None:
        self.profiles.forget(task_id)
        self._queries.forget(task_id)
        if self.store.fallback is not None:
            forget = asyncio.get_running_loop().create_task(self.store.forget(task_id))
            self._forgetting.add(forget)
            forget.add_done_callback(self._forgetting.discard)

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

    def _charge(self, ex: Exchange, cache_hit: bool, quote: Quote | None, most_output: int) -> Charge:
        call, up = ex.call, ex.route.upstream
        certain = reserve = 0.0
        if quote is not None and not quote.priced and ex.span is not None:
            ex.span.set_attribute(sc.COST_ESTIMATED, True)  # reserved at `pricing.default`
        if quote is not None:
            total = quote.usd(most_output or allowed_output(call, self.cfg.default_max_output_tokens))
            if call.operation in bm.LLM_OPERATIONS:
                certain = quote.base_usd
                reserve = max(0.0, total - certain)
            else:
                certain = total
        key = getattr(call, "query_key", None) or bm.query_key_of(call.query)
        return bm.charge_for(up.kind, call.operation, prompt_tokens=call.prompt_tokens,
                             max_output_tokens=most_output or call.max_output_tokens,
                             default_max_output_tokens=self.cfg.default_max_output_tokens * max(1, call.choices),
                             cost_certain_usd=certain, cost_reserve_usd=reserve, query_key=key, cache_hit=cache_hit,
                             classified=ex.route.adapter.reads_body, choices=call.choices)

    def _store_failed(self, ex: Exchange, exc: BaseException) -> None:
        store_failed(self.settings, ex, exc, "budget store")
        ex.degraded_bound = "none"  # open: forwarded with no budget (closed raised above)

    def _headers(self, ex: Exchange, adm: Admission, d: Decision, now: int) -> tuple[dict[str, Any], dict[str, float]]:
        """The budget response headers; returns what is left and the warnings, for the span."""
        charged = adm.charge if d.admitted else None
        _, warn = bm.standing(adm.limits, d.ledger, charged, now, self.cfg.warn_fraction)
        left = bm.header_remaining(adm.limits, d.ledger, charged, now)  # settled use: never rises
        if left:
            ex.response_headers.append((REMAINING_HEADER, bm.sf_dictionary(left)))
        if warn:
            ex.response_headers.append((WARNING_HEADER, bm.sf_dictionary({k: round(v, 3) for k, v in warn.items()})))
        if adm.shadow and d.dimension:
            ex.response_headers.append((WOULD_REJECT_HEADER, d.dimension.encode()))
        return left, warn

    def _exceeded(self, ex: Exchange, d: Decision, now: int) -> BudgetExceeded:
        adm = ex.admission
        assert adm is not None
        dim = d.dimension or "unknown"
        limit_u = adm.limits.get(dim, 0)
        limit = bm.usd(limit_u) if dim == "max_cost_usd" else limit_u
        used = bm.used_value(dim, d.ledger, adm.charge if dim == "max_prompt_tokens" else None, now)
        if dim == "max_cost_usd":
            used = round(used, 9)
        return self._rejection(ex, dim, limit, used)

    def _rejection(self, ex: Exchange, dim: str, limit: float, used: float) -> BudgetExceeded:
        """The refusal, with the status the route's SDKs do not retry (the route's `reject_status`, else
        `budgets.reject_status`, if set)."""
        assert ex.admission is not None
        profile = ex.admission.profile
        task_id = ex.task.id if ex.task else ""
        return BudgetExceeded(
            f"budget exhausted: {dim} limit {limit:g}, used {used:g} (profile {profile!r}, task {task_id!r}); "
            "this task may not make more calls of this kind",
            status=ex.route.upstream.reject_status or self.cfg.reject_status or ex.route.adapter.reject_status,
            dimension=dim, limit=limit, used=used,
            profile=profile, task_id=task_id,
        )

    def _deadline_exceeded(self, ex: Exchange) -> BudgetExceeded | None:
        """When the upstream timeout that `max_latency_ms` cut short expires: the budget's refusal
        (not a 504 an SDK would retry). None when the deadline has not passed (the upstream's own
        timeout was shorter)."""
        adm, now = ex.admission, self._wall_ms()
        if adm is None or adm.deadline_ms is None or now < adm.deadline_ms - DEADLINE_SLACK_MS:
            return None
        limit = adm.limits["max_latency_ms"]
        used = max(limit, now - (adm.deadline_ms - limit))
        flush_record(ex)  # the reservation's record first; this refusal amends it
        if ex.span is not None:
            ex.span.set_attributes({sc.BUDGET_EXCEEDED: True, sc.BUDGET_EXCEEDED_DIMENSION: "max_latency_ms"})
            ex.span.add_event(sc.EVENT_EXCEEDED, {"dimension": "max_latency_ms", "limit": limit, "used": used,
                                                  "mode": "enforce", "would_reject": False})
        return self._rejection(ex, "max_latency_ms", limit, used)

    # --- while streaming ----------------------------------------------------------------------------

    def on_chunk(self, ex: Exchange, chunk: bytes) -> bytes | None:
        return self.guard.on_chunk(ex, chunk)

    # --- after the response ------------------------------------------------------------------------

    async def on_response(self, ex: Exchange) -> None:
        """A small retrieval answer was read whole, before its head goes out: how many of its chunks
        are new to the task (`ex.new_chunks`, which the evidence stage describes). New means not
        among the chunks the task had when this call was admitted (the reservation brought them: no
        store round trip; the settle follows the body). A task past SEEN_CHUNKS_CAP settles here."""
        adm, chunks = ex.admission, ex.observation.chunks
        if adm is None or not adm.admitted or ex.task is None or chunks is None:
            return
        if adm.seen_chunks is not None:
            ex.new_chunks = len({c.id for c in chunks if c.id and c.id not in adm.seen_chunks})
        elif (ledger := await self._settle(ex, adm)) is not None:
            ex.new_chunks = ledger.used("last_new")

    async def on_end(self, ex: Exchange) -> None:
        adm = ex.admission
        if adm is None or not adm.admitted or ex.task is None or ex.settlement is not None:
            flush_record(ex)
            return
        await self._settle(ex, adm)

    async def _settle(self, ex: Exchange, adm: Admission) -> Ledger | None:
        """Replace the reservation with the call's actual use, once (`ex.settlement`); record it on
        the span (with the reservation's record, when that is still waiting: one write)."""
        assert ex.task is not None
        actual, verdict = self._actual(ex, adm)
        ex.settlement = Settlement(adm.charge.cost, None)  # what stands if the store does not confirm
        try:
            ledger = await self.store.settle(ex.task.id, adm.reservation, actual, self._wall_ms())
        except Exception as exc:  # noqa: BLE001 - the response is (being) sent; record, never fail
            flush_record(ex)  # the reserve-time totals stand; the failure amends them
            record_degraded(ex.span, f"settle failed: {type(exc).__name__}")
            return None
        except BaseException:  # cancelled while the store answered: the reserve-time record still goes out
            flush_record(ex)
            raise
        ex.settlement = Settlement(actual.cost_nusd, bm.usd(actual.cost_nusd))
        record_settlement(ex, adm, ledger, actual, verdict, self._wall_ms())
        return ledger

    def _actual(self, ex: Exchange, adm: Admission) -> tuple[Actual, Verdict | None]:
        """The call's real use, and a retrieval's progress verdict. Unknown pieces keep what was
        counted or reserved (never less)."""
        res, call, obs = adm.reservation, ex.call, ex.observation
        retrieved = call.operation == "retrieval" and obs.chunks is not None
        chunks = tuple(ch.id for ch in obs.chunks) if retrieved and obs.chunks else None
        if adm.charge.cache_hit:  # charged as a call; its chunks are the task's evidence all the same
            verdict = self._judge(ex, adm) if chunks is not None else None
            return Actual(chunk_ids=chunks, fruitful=verdict.fruitful if verdict else None,
                          evidence=verdict.evidence if verdict else False, tallies=ex.tallies.ledger_counts()), verdict
        if ex.status is None or ex.status >= 400:  # no answer, or an error answer: nothing was produced
            return Actual(tallies=ex.tallies.ledger_counts()), None  # what the rewrites sent still counts
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
        cost = self._cost(ex, res.cost_nusd)
        if unread:
            cost = max(cost, res.cost_nusd)
        verdict = self._judge(ex, adm) if retrieved else None
        if adm.charge.completion_reserve == 0:
            context, completion = 0, 0  # not an LLM call: its tokens are not the task's context
        chunk_ids = tuple(ch.id for ch in obs.chunks or ()) if retrieved else None
        llm = u is not None and adm.charge.completion_reserve > 0
        cached, writes = (u.cached_input_tokens or 0, u.cache_write_tokens or 0) if u and llm else (0, 0)
        tallies = ex.tallies.ledger_counts(llm_input_tokens=(u.input_tokens or 0) if u and llm else 0)
        return Actual(context, completion, cost, chunk_ids, verdict.fruitful if verdict else None,
                      evidence=verdict.evidence if verdict else False, finished=adm.finished is not None,
                      cached_input_tokens=cached, cache_write_tokens=writes, tallies=tallies), verdict

    def _cost(self, ex: Exchange, reserved: int) -> int:
        """The tokens used, at the model's price or else at `pricing.default` (an estimate); the
        reservation when the upstream reported no usage of an LLM call."""
        if self.prices is None:
            return reserved
        c = self.prices.actual(ex.route.upstream, ex.call, ex.observation)
        if not c.priced and ex.span is not None:
            ex.span.set_attribute(sc.COST_ESTIMATED, True)
        return round(c.usd * bm.NANO) if c.measured or ex.call.operation not in bm.LLM_OPERATIONS else reserved

    def _judge(self, ex: Exchange, adm: Admission) -> Verdict | None:
        """The progress verdict on a retrieval read whole (core/progress.py); None (judged by "any
        chunk new" in the store) for a task past SEEN_CHUNKS_CAP."""
        if adm.seen_chunks is None or ex.task is None:
            return None
        return self._queries.judge(ex.task.id, ex.observation.chunks, adm.seen_chunks, ex.call.query,
                                   self.progress_rules)


def breaker_for(settings: Settings, store: Store, wall_ms: Callable[[], int] | None = None) -> Breaker:
    """The budget store behind the breaker every budget step goes through (made once, in the
    lifespan); with `on_store_error: open` and a shared store, the local ledger it falls back on."""
    fallback = MemoryStore(LOCAL_MAX_TASKS) if settings.on_store_error == "open" and settings.store != "memory" \
        else None
    return Breaker(store, settings.store_timeout_ms / 1000, wall_ms or (lambda: int(time.time() * 1000)),
                   settings.budgets.reservation_ttl_s * 1000, fallback=fallback)


def store_failed(settings: Settings, ex: Exchange, exc: BaseException, what: str) -> None:
    """A store (`what`) failed for this call. Open: the call goes on without that budget (the span
    and metrics say so). Closed: 503."""
    reason = f"{what} failed: {type(exc).__name__}: {redact(str(exc))[:200]}"
    record_degraded(ex.span, reason, on_store_error=settings.on_store_error)
    if settings.on_store_error == "closed":
        raise StoreUnavailable(
            "the budget store did not answer in time and on_store_error is closed; the call was not forwarded",
            store=redact(settings.store),
        ) from exc
    ex.degraded = reason
