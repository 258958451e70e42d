"""Budget arithmetic (pure): limits, what a call charges, the admit rule, profile selection, the
remaining-budget headers, and the per-call `Ticket` the budget stage keeps.

Everything here is a plain function of its inputs (clock values are passed in), so the memory
store, the Redis Lua script and the tests share one definition of "a limit of N admits N".
Internal units are integers: tokens, calls, milliseconds and nano-USD (so sums never drift).
Imports nothing that does I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..config import DIMENSIONS, BudgetsConfig, Profile

NANO = 1_000_000_000  # cost is kept in nano-USD
BAGGAGE_PROFILE = "ragtoll.budget.profile"
BAGGAGE_PREFIX = "ragtoll.budget."

# dimension -> ledger counter it is checked against (None: not a running total)
COUNTER = {
    "max_steps": "steps",
    "max_calls": "calls",
    "max_retrieval_calls": "retrieval_calls",
    "max_unique_queries": "unique_queries",
    "max_rerank_calls": "rerank_calls",
    "max_context_tokens": "context_tokens",
    "max_prompt_tokens": None,
    "max_completion_tokens": "completion_tokens",
    "max_cost_usd": "cost_nusd",
    "max_latency_ms": None,
    "max_stalled_retrievals": "stalled",
    "max_fruitless_retrievals": "fruitless",
}
# limits on the progress verdicts: they refuse only retrievals, and reaching one ends the task's search
PROGRESS_DIMENSIONS = ("max_stalled_retrievals", "max_fruitless_retrievals")
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "messages"})
_NUMBER = re.compile(r"^[0-9]{1,15}(\.[0-9]{1,9})?$")


def to_units(limits: Mapping[str, float]) -> dict[str, int]:
    """User-facing limits (USD, tokens, ms) -> internal integers."""
    return {d: (round(v * NANO) if d == "max_cost_usd" else int(v)) for d, v in limits.items()}


def usd(nusd: int) -> float:
    return nusd / NANO


@dataclass(frozen=True, slots=True)
class Charge:
    """What one call adds to its task before it is forwarded. Costs in nano-USD."""

    steps: int = 0
    calls: int = 1
    retrieval_calls: int = 0
    rerank_calls: int = 0
    context_tokens: int = 0
    prompt_tokens: int = 0  # this call's prompt, for the per-call max_prompt_tokens
    # the most output the call may produce as it would be sent (its cap x choices, else the model's
    # ceiling, else the default): what is reserved, unless the task has less left (`granted_output`)
    completion_reserve: int = 0
    cost_certain: int = 0  # prompt + per-call price: known before forwarding
    cost_reserve: int = 0  # completion_reserve output tokens x price: reserved, settled later
    choices: int = 1  # answers asked for (n): an LLM call needs at least one output token each
    query_key: str | None = None  # unique-query key (retrieval); None: not a query
    cache_hit: bool = False

    @property
    def cost(self) -> int:
        return self.cost_certain + self.cost_reserve


@dataclass(slots=True)
class Ledger:
    """A task's running totals as the store holds them (counters in internal units)."""

    task_id: str
    profile: str = ""
    cls: str = ""
    route: str = ""
    started_ms: int = 0
    last_ms: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    rejections: dict[str, int] = field(default_factory=dict)
    shadow_rejections: dict[str, int] = field(default_factory=dict)
    exhausted: str | None = None
    chunks_seen: int = 0
    source: str = ""
    trace_id: str = ""

    def used(self, counter: str) -> int:
        return self.counters.get(counter, 0)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What reserve added and settle must correct (internal units).

    `id` names the reservation in the store (settle, extend and cancel find it by id, so each is
    idempotent); `expires_ms` is when it stops counting as in flight unless settled or extended
    first (its charge stays: the call may have run). A reservation without an id is settled by
    the deltas it carries (stores written before ids)."""

    context_tokens: int = 0
    completion_tokens: int = 0
    cost_nusd: int = 0
    new_query: bool = False
    id: str = ""
    expires_ms: int = 0


@dataclass(frozen=True, slots=True)
class Actual:
    """What the call really used, known after the response (internal units).

    `chunk_ids` is None when the call returned no evidence to track (not a retrieval, or unread).
    """

    context_tokens: int = 0
    completion_tokens: int = 0
    cost_nusd: int = 0
    chunk_ids: tuple[str, ...] | None = None
    # the progress verdict on a retrieval (core/progress.py); None: judge by "any chunk new" instead
    fruitful: bool | None = None
    # ...and whether it was fruitful evidence for the task's question (Verdict.evidence): a task
    # climbs to `escalate_to` only when its last retrieval was
    evidence: bool = False
    finished: bool = False  # on_exhausted: finish rewrote the call to answer now (counted in the ledger)
    # of `context_tokens` (an LLM call's input as the upstream reported it), what the provider's
    # prompt cache served and what it wrote: kept in the ledger, so a record is whole across replicas
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    # the call's additions to the task's context-economy numbers, (ledger name, amount) pairs
    # (core/tally.py): added to the ledger with the rest, so they too count every replica's calls
    tallies: tuple[tuple[str, int], ...] = ()


def first_exceeded(limits: Mapping[str, int], ledger: Ledger, charge: Charge, new_query: bool,
                   now_ms: int) -> str | None:
    """The first dimension (DIMENSIONS order) this call would break, or None to admit it.

    Counts admit while used + charge <= limit. An LLM call is admitted on completion tokens and
    cost while what the task has left gives each of its answers at least one output token, after
    its prompt (`granted_output`: the call is then reserved, and capped at, what is left); cost
    also refuses any call whose part known up front would cross the limit.
    The deadline refuses once `now - started >= max_latency_ms`.
    """
    for dim in DIMENSIONS:
        limit = limits.get(dim)
        if limit is None:
            continue
        if dim == "max_prompt_tokens":
            bad = charge.prompt_tokens > limit
        elif dim == "max_latency_ms":
            bad = ledger.started_ms > 0 and now_ms - ledger.started_ms >= limit
        elif dim == "max_unique_queries":
            bad = new_query and ledger.used("unique_queries") + 1 > limit
        elif dim == "max_completion_tokens":
            bad = charge.completion_reserve > 0 and limit - ledger.used("completion_tokens") < charge.choices
        elif dim == "max_cost_usd":
            used = ledger.used("cost_nusd")
            bad = charge.cost > 0 and (used + charge.cost_certain > limit or used >= limit or (
                charge.cost_reserve > 0 and _output_by_cost(limit - used - charge.cost_certain, charge)
                < charge.choices))
        elif dim in PROGRESS_DIMENSIONS:
            bad = charge.retrieval_calls > 0 and ledger.used(COUNTER[dim]) >= limit  # type: ignore[arg-type]
        else:
            add = getattr(charge, COUNTER[dim])  # type: ignore[arg-type]
            bad = add > 0 and ledger.used(COUNTER[dim]) + add > limit  # type: ignore[arg-type]
        if bad:
            return dim
    return None


def _output_by_cost(left_nusd: int, charge: Charge) -> int:
    """Output tokens `left_nusd` pays for at the charge's output price (reserve.lua mirrors it)."""
    return left_nusd * charge.completion_reserve // charge.cost_reserve if left_nusd > 0 else 0


def granted_output(limits: Mapping[str, int], ledger: Ledger, charge: Charge) -> tuple[int, int]:
    """(output tokens, their cost in nano-USD) an admitted LLM call is reserved: its
    `completion_reserve`, or as much of it as the task has left under `max_completion_tokens` and
    `max_cost_usd` after the call's prompt, rounded down to whole tokens per answer. The stage caps
    the call's output at what this grants, so an admitted call cannot take its task past either
    limit (worst-case admission). Calls that produce no output are reserved what they charge."""
    tokens, cost = charge.completion_reserve, charge.cost_reserve
    if tokens <= 0:
        return tokens, cost
    granted = tokens
    comp = limits.get("max_completion_tokens")
    if comp is not None:
        granted = min(granted, comp - ledger.used("completion_tokens"))
    lim = limits.get("max_cost_usd")
    if lim is not None and cost > 0:
        granted = min(granted, _output_by_cost(lim - ledger.used("cost_nusd") - charge.cost_certain, charge))
    if granted >= tokens:
        return tokens, cost
    granted = max(0, granted) // charge.choices * charge.choices
    return granted, cost * granted // tokens


def exhausted(limits: Mapping[str, int], ledger: Ledger) -> str | None:
    """The limit that ended the task's search, if one has: the first refusal, or a progress limit
    reached (every later retrieval of the task would be refused: only a fruitful one resets the
    stall, and none can run)."""
    if ledger.exhausted:
        return ledger.exhausted
    for dim in PROGRESS_DIMENSIONS:
        limit = limits.get(dim)
        if limit is not None and ledger.used(COUNTER[dim]) >= limit:  # type: ignore[arg-type]
            return dim
    return None


def apply_charge(ledger: Ledger, charge: Charge, new_query: bool, now_ms: int, sign: int = 1,
                 output: tuple[int, int] | None = None) -> Reservation:
    """Add an admitted call to `ledger` in place (the memory store; the Lua script mirrors it), its
    output reserved as `output` grants (`granted_output`; default: all it asked); `sign=-1` takes a
    charge away again (a cancelled reservation)."""
    tokens, out_cost = output if output is not None else (charge.completion_reserve, charge.cost_reserve)
    cost = charge.cost_certain + out_cost
    c = ledger.counters
    for name, add in (("steps", charge.steps), ("calls", charge.calls), ("retrieval_calls", charge.retrieval_calls),
                      ("rerank_calls", charge.rerank_calls), ("context_tokens", charge.context_tokens),
                      ("completion_tokens", tokens), ("cost_nusd", cost),
                      ("unique_queries", 1 if new_query else 0), ("cache_hits", 1 if charge.cache_hit else 0)):
        if add:
            c[name] = c.get(name, 0) + sign * add
    return Reservation(charge.context_tokens, tokens, cost, new_query)


def used_value(dim: str, ledger: Ledger, charge: Charge | None, now_ms: int) -> float:
    """A dimension's use in user units (USD for cost), after this call's charge."""
    if dim == "max_prompt_tokens":
        return charge.prompt_tokens if charge else 0
    if dim == "max_latency_ms":
        return max(0, now_ms - ledger.started_ms) if ledger.started_ms else 0
    counter = COUNTER[dim]
    value = ledger.used(counter)  # type: ignore[arg-type]
    return usd(value) if dim == "max_cost_usd" else value


# The part of a running total that reservations in flight hold (the stores keep these counters
# beside the totals: + at reserve and extend, - at settle and cancel), so the settled part is the
# total minus it.
HELD = {"context_tokens": "held_context_tokens", "completion_tokens": "held_completion_tokens",
        "cost_nusd": "held_cost_nusd"}


def settled(ledger: Ledger) -> Ledger:
    """`ledger` with its token and cost totals down to what settled calls used (reservations in
    flight taken out); counts (steps, calls, ...) stay: an admitted call's are known, not reserved."""
    counters = dict(ledger.counters)
    for total, held in HELD.items():
        if held in counters:
            counters[total] = counters.get(total, 0) - max(0, counters.pop(held))
    return Ledger(ledger.task_id, ledger.profile, ledger.cls, ledger.route, ledger.started_ms, ledger.last_ms,
                  counters, ledger.rejections, ledger.shadow_rejections, ledger.exhausted, ledger.chunks_seen,
                  ledger.source, ledger.trace_id)


def header_remaining(limits: Mapping[str, int], ledger: Ledger, charge: Charge | None,
                     now_ms: int) -> dict[str, float]:
    """`x-ragtoll-budget-remaining`: per limited dimension, the limit minus what the task has used,
    as the store held it when this call was admitted. Counts include every admitted call, this one
    too; tokens and cost are what settled calls used, without what calls in flight (this one
    included) have reserved: a reservation is a worst case that settles lower, so a value that
    subtracted it would rise at the settle (9384 µ$, then 9992). So the value never rises while the
    task spends: every admission and every settle only adds to what it subtracts. (Admission still
    counts the reservations: a call may be refused while the header shows something left, when
    calls are in flight. `max_stalled_retrievals` counts a streak, which a fruitful retrieval resets.)"""
    return remaining(limits, settled(ledger), charge, now_ms)


def remaining(limits: Mapping[str, int], ledger: Ledger, charge: Charge | None, now_ms: int) -> dict[str, float]:
    """What is left per limited dimension, in user units (never negative)."""
    return standing(limits, ledger, charge, now_ms, math.inf)[0]


def standing(limits: Mapping[str, int], ledger: Ledger, charge: Charge | None, now_ms: int,
             fraction: float) -> tuple[dict[str, float], dict[str, float]]:
    """What is left per limited dimension, in user units (never negative), and the dimensions whose
    use has reached `fraction` of their limit -> the used fraction (0..1+), in one pass."""
    left: dict[str, float] = {}
    warn: dict[str, float] = {}
    for dim in DIMENSIONS:
        limit = limits.get(dim)
        if limit is None:
            continue
        if dim == "max_prompt_tokens":
            left[dim] = limit  # a per-call ceiling: every call may use this much
            continue
        used = used_value(dim, ledger, charge, now_ms)
        if dim == "max_cost_usd":
            lim: float = usd(limit)
            left[dim] = max(0.0, lim - used)
        else:
            lim = limit
            left[dim] = max(0, int(lim - used))
        if limit > 0 and used / lim >= fraction:
            warn[dim] = used / lim
    return left, warn


def sf_dictionary(values: Mapping[str, float]) -> bytes:
    """An RFC 8941 dictionary. Integers stay integers; decimals keep RFC 8941's three fraction
    digits, rounded down so a client never sees more than is left; cost also carries the exact
    amount in micro-USD as the `micros` parameter (0.0123 USD -> `max_cost_usd=0.012;micros=12300`)."""
    parts = []
    for key, value in values.items():
        if key == "max_cost_usd":
            # RFC 8941 caps decimals at 12 integer digits and integers at 15 digits
            floored = min(math.floor(value * 1000) / 1000, _SF_MAX_DECIMAL)
            parts.append(f"{key}={floored:.3f};micros={min(int(value * 1_000_000), _SF_MAX_INTEGER)}")
        elif isinstance(value, int) or value.is_integer():
            parts.append(f"{key}={min(int(value), _SF_MAX_INTEGER)}")
        else:
            parts.append(f"{key}={min(math.floor(value * 1000) / 1000, _SF_MAX_DECIMAL):.3f}")
    return ", ".join(parts).encode()


_SF_MAX_INTEGER = 999_999_999_999_999
_SF_MAX_DECIMAL = 999_999_999_999.999


# --- limits from profile and baggage ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    profile: str
    source: str  # baggage | rule | classifier | default | task (already chosen for this task)
    cls: str = ""
    reason: str = ""
    notes: tuple[str, ...] = ()


Classifier = Callable[[str], tuple[str, str]]


def select_profile(cfg: BudgetsConfig, route: str, headers: Mapping[str, str], baggage: Mapping[str, str],
                   query: str | None, classify: Classifier | None) -> Selection:
    """DESIGN.md order: baggage `ragtoll.budget.profile` (if the profile allows selection) ->
    route/header rules -> the classifier on the query (only when `budgets.classes` is set) -> default."""
    notes: list[str] = []
    asked = baggage.get(BAGGAGE_PROFILE)
    if asked is not None:
        prof = cfg.profiles.get(asked)
        if prof is None:
            notes.append(f"baggage {BAGGAGE_PROFILE}={asked[:64]!r} ignored: no such profile")
        elif not prof.allow_selection:
            notes.append(f"baggage {BAGGAGE_PROFILE}={asked!r} ignored: profile does not allow selection")
        else:
            return Selection(asked, "baggage", notes=tuple(notes))
    for rule in cfg.rules:
        if rule.route is not None and rule.route != route:
            continue
        if rule.header is not None and headers.get(rule.header.lower()) != rule.equals:
            continue
        return Selection(rule.profile, "rule", notes=tuple(notes))
    if cfg.classes and classify is not None and query:
        cls, reason = classify(query)
        if cls in cfg.classes:
            return Selection(cfg.classes[cls], "classifier", cls, reason, tuple(notes))
        notes.append(f"query class {cls!r} has no profile in budgets.classes")
        return Selection(cfg.default_profile, "default", cls, reason, tuple(notes))
    return Selection(cfg.default_profile, "default", notes=tuple(notes))


def effective_limits(profile: Profile, baggage: Mapping[str, str],
                     raises: Mapping[str, float] | None = None) -> tuple[dict[str, float], list[str]]:
    """The profile's limits, raised only by verified signed values, then lowered by plain baggage.

    Plain `ragtoll.budget.<dimension>=N` can only lower a limit (or set one where the profile has
    none). Unknown dimensions and malformed numbers are ignored and noted; never an error.
    """
    limits = profile.limits()
    notes: list[str] = []
    for dim, value in (raises or {}).items():
        if dim in DIMENSIONS:
            limits[dim] = value
    for key, raw in baggage.items():
        if not key.startswith(BAGGAGE_PREFIX) or key == BAGGAGE_PROFILE:
            continue
        dim = key[len(BAGGAGE_PREFIX):]
        if dim not in DIMENSIONS:
            if dim not in ("sig", "exp"):  # the signature pair is read by signing.py
                notes.append(f"baggage {key[:80]} ignored: not a budget dimension")
            continue
        text = raw.strip()
        if not _NUMBER.match(text):
            notes.append(f"baggage {key} ignored: {text[:32]!r} is not a non-negative number")
            continue
        value = float(text)
        current = limits.get(dim)
        if current is None or value < current:
            limits[dim] = value
        elif value > current and not (raises and dim in raises):
            notes.append(f"baggage {key}={text} ignored: can only lower the limit ({current:g})")
    return limits, notes


# --- what a call charges ------------------------------------------------------------------------------


def charge_for(kind: str, operation: str, *, prompt_tokens: int | None, max_output_tokens: int | None,
               default_max_output_tokens: int, cost_certain_usd: float, cost_reserve_usd: float,
               query_key: str | None, cache_hit: bool, classified: bool = False, choices: int = 1) -> Charge:
    """The charge of one call. A cache hit is only a call: not a step, retrieval or new query.
    `max_output_tokens`: the most output the LLM call may produce (all `choices` together).

    `classified`: the route's adapter read the call and named its operation, so `other` on a
    retrieval or rerank route (collection info, an upsert) is only a call; unread calls on such a
    route (`passthrough`) count as the route's kind."""
    if cache_hit:
        return Charge(calls=1, cache_hit=True)
    llm = operation in LLM_OPERATIONS or (kind == "llm" and operation not in ("embeddings", "other"))
    if llm:
        prompt = max(0, prompt_tokens or 0)
        reserve = max_output_tokens if max_output_tokens is not None and max_output_tokens >= 0 \
            else default_max_output_tokens
        choices = max(1, choices)
        return Charge(steps=1, context_tokens=prompt, prompt_tokens=prompt, completion_reserve=max(choices, reserve),
                      cost_certain=round(cost_certain_usd * NANO), cost_reserve=round(cost_reserve_usd * NANO),
                      choices=choices)
    unread = operation == "other" and not classified
    retrieval = operation == "retrieval" or (kind == "retrieval" and unread)
    rerank = operation == "rerank" or (kind == "rerank" and unread)
    return Charge(retrieval_calls=1 if retrieval else 0, rerank_calls=1 if rerank else 0,
                  cost_certain=round((cost_certain_usd + cost_reserve_usd) * NANO),
                  query_key=query_key if retrieval else None)


def query_key_of(query: str | None) -> str | None:
    """A fallback unique-query key when the adapter gives none: case- and space-normalised text."""
    if not query:
        return None
    return " ".join(query.lower().split())[:512] or None


def first_query(prompt_texts: list[str], query: str | None, user_text: str | None = None) -> str | None:
    """The text the classifier reads: the retrieval query, else the last user message, else the
    last prompt text (never the tool definitions when a user message is known)."""
    if query:
        return query
    if user_text:
        return user_text
    return prompt_texts[-1] if prompt_texts else None


# --- one call's admission and settlement ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admission:
    """What the budget decided for one call before forwarding: admitted or not, what it charged,
    the reservation the settle replaces, and the limits (internal units) and profile it ran under."""

    admitted: bool
    charge: Charge
    reservation: Reservation
    limits: Mapping[str, int]
    profile: str
    shadow: bool
    dimension: str | None = None  # the limit that refused (enforce) or would have refused (shadow) the call
    seen_chunks: frozenset[str] | None = None  # retrievals: the task's chunk ids when the call was admitted
    finished: str | None = None  # on_exhausted: finish: the limit this call was forwarded past, tools disabled
    deadline_ms: int | None = None  # wall ms when `max_latency_ms` runs out (enforced only)


@dataclass(frozen=True, slots=True)
class Settlement:
    """What the task's ledger was finally charged for one admitted call: `cost_nusd`, the settled
    cost (its reservation's charge when the store did not confirm the settle); `cost_usd`, the
    settled cost in USD, None when the store did not confirm it."""

    cost_nusd: int
    cost_usd: float | None
