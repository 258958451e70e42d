"""What the budget stage writes on the call span: the reservation (profile, limit, used and left
per dimension, the charge and warning and refusal events) and the settlement (what the call
really used, the stream's extensions, the progress verdict). Spans are exported only when they
end, so the reservation's record waits on the exchange (`ex.budget_record`) until the first of a
stream cut, the deadline, the settle or the call's end writes it: none of it costs anything before
the first byte reaches the client. When the settle writes it, the settle's values go in the same
`set_attributes` call, so each attribute is cleaned and stored once (bench/cpu_profile.py).

Per dimension the span holds `limit` and `used`; `remaining` only where it says something they do
not: where it is not max(0, limit - used). That is the per-call prompt ceiling (every call may use
the whole limit) and, at the reservation, tokens and cost while reservations are in flight (there
`remaining` is the `x-ragtoll-budget-remaining` header's figure, the limit minus settled use). Each
attribute costs the OTLP encoder ~3-4 µs per call (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ragtoll.instrumentation import semconv as sc

from ..core import budget as bm
from ..core.budget import Actual, Admission, Charge, Ledger, Reservation, Selection
from ..core.progress import Verdict
from ..request.exchange import Exchange
from ..stores.base import Decision

# the dimensions settle changes (the rest stand as reserved)
SETTLED_DIMENSIONS = ("max_context_tokens", "max_completion_tokens", "max_cost_usd", "max_stalled_retrievals",
                      "max_fruitless_retrievals")


def flush_record(ex: Exchange, settled: Mapping[str, Any] | None = None) -> bool:
    """Write the reservation's span record now, once (before a cut's, a deadline's or a settle's),
    with `settled` (the settle's attributes, which replace some of the reservation's) in the same
    write; False when it was already written."""
    if ex.budget_record is None:
        return False
    record, ex.budget_record = ex.budget_record, None
    record(settled=settled)
    return True


def record_reservation(span: Any, adm: Admission, sel: Selection, notes: list[str], d: Decision, now: int,
                       left: Mapping[str, Any], warn: Mapping[str, float], at_ns: int, *,
                       settled: Mapping[str, Any] | None = None) -> None:
    """The reservation on the call span: profile, limit and used per dimension (remaining where it is
    not limit - used), events at `at_ns`; `settled`: the settle's attributes, written in the same call
    (they replace some of these)."""
    if span is None or not span.is_recording():
        return
    charge = adm.charge
    charged = charge if d.admitted else None
    attrs: dict[str, Any] = {sc.PROFILE: sel.profile, sc.PROFILE_SOURCE: sel.source,
                             sc.BUDGET_MODE: "shadow" if adm.shadow else "enforce", sc.BUDGET_EXCEEDED: not d.admitted}
    if sel.cls:
        attrs[sc.QUERY_CLASS] = sel.cls
        attrs[sc.QUERY_CLASS_REASON] = sel.reason[:300]
    all_notes = list(sel.notes) + notes
    if all_notes:
        attrs[sc.BUDGET_NOTES] = all_notes[:20]
    if charge.query_key is not None:
        attrs[sc.QUERY_NEW] = d.reservation.new_query
    for dim, limit in adm.limits.items():
        lim = attrs[sc.budget_limit(dim)] = bm.usd(limit) if dim == "max_cost_usd" else limit
        used = attrs[sc.budget_used(dim)] = bm.used_value(dim, d.ledger, charged, now)
        if left[dim] != max(0, lim - used) and not (settled and sc.budget_used(dim) in settled):
            attrs[sc.budget_remaining(dim)] = left[dim]
    if d.dimension:
        attrs[sc.BUDGET_EXCEEDED_DIMENSION if not adm.shadow else sc.BUDGET_WOULD_REJECT] = d.dimension
    if adm.finished:
        attrs[sc.BUDGET_FINISHED] = adm.finished
    if settled:
        attrs.update(settled)
    span.set_attributes(attrs)
    if d.admitted:
        span.add_event(sc.EVENT_CHARGE, timestamp=at_ns, attributes=_charged(charge, d.reservation))
    for dim, share in warn.items():
        span.add_event(sc.EVENT_WARNING, {"dimension": dim, "used_fraction": round(share, 4)}, timestamp=at_ns)
    if d.dimension:
        limit = adm.limits[d.dimension]
        span.add_event(sc.EVENT_EXCEEDED, timestamp=at_ns, attributes={
            "dimension": d.dimension, "limit": bm.usd(limit) if d.dimension == "max_cost_usd" else limit,
            "used": bm.used_value(d.dimension, d.ledger, charge if d.dimension == "max_prompt_tokens" else None, now),
            "mode": "shadow" if adm.shadow else "enforce", "would_reject": adm.shadow})


def _charged(charge: Charge, res: Reservation) -> dict[str, Any]:
    """The charge event's attributes: what the reservation added (its output as granted), the zeros left out."""
    return {k: v for k, v in (
        ("steps", charge.steps), ("calls", charge.calls), ("retrieval_calls", charge.retrieval_calls),
        ("rerank_calls", charge.rerank_calls), ("context_tokens", charge.context_tokens),
        ("completion_tokens_reserved", res.completion_tokens if res.id else charge.completion_reserve),
        ("cost_usd_reserved", bm.usd(res.cost_nusd if res.id else charge.cost)),
        ("unique_queries", int(res.new_query)), ("cache_hit", charge.cache_hit)) if v}


def record_settlement(ex: Exchange, adm: Admission, ledger: Ledger | None, actual: Actual,
                      verdict: Verdict | None, now: int) -> None:
    """The settle on the call span: the cost, what the settled dimensions used, a stream's extensions
    and unspent hold, a retrieval's progress; in one write, with the reservation's record when that is
    still waiting (else the settled dimensions' `remaining` too, which that record may have written
    and which is now limit - used)."""
    span, stream = ex.span, ex.stream_state
    if span is None or not span.is_recording():
        return
    attrs: dict[str, Any] = {sc.COST_USD: bm.usd(actual.cost_nusd)}
    if stream is not None and stream.hold is not None:
        attrs[sc.BUDGET_STREAM_EXTENSIONS] = stream.extensions
        attrs[sc.BUDGET_STREAM_HELD] = max(0, int(stream.hold.headroom(0)))
    recorded = ex.budget_record is None  # the reservation's record is on the span already
    if ledger is not None:
        left = bm.remaining(adm.limits, ledger, None, now) if recorded else {}
        for dim in SETTLED_DIMENSIONS:
            if dim in adm.limits:
                attrs[sc.budget_used(dim)] = bm.used_value(dim, ledger, None, now)
                if recorded:
                    attrs[sc.budget_remaining(dim)] = left[dim]
        if actual.chunk_ids is not None:
            attrs[sc.EVIDENCE_STALLED] = ledger.used("stalled")
            attrs[sc.EVIDENCE_FRUITLESS] = ledger.used("fruitless")
            attrs[sc.EVIDENCE_NEW_CHUNKS] = ledger.used("last_new")
    if verdict is not None:
        attrs.update({sc.PROGRESS_PREFIX + k: v for k, v in verdict.attributes().items()})
    if not flush_record(ex, attrs):
        span.set_attributes(attrs)


def record_degraded(span: Any, reason: str, **attributes: Any) -> None:
    """A store step that failed for this call: the span says so (its budget went on without it)."""
    if span is not None:
        span.set_attribute(sc.DEGRADED, True)
        span.add_event(sc.EVENT_DEGRADED, {"reason": reason, **attributes})
