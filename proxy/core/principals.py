"""Budgets across tasks (pure): who the principal of a call is, its limits in internal units, the
rolling windows, and the admit rule the memory store and the Redis scripts share.

A principal is, in order: the verified identity (JWT subject, or the trusted gateway's header in
`identity.mode: header`) -> `sub:<tenant>/<subject>`; else a SHA-256 of the credential the route's
upstream authenticates by (`canonical_credential`: the first of the adapter's `credential_headers`
the caller sent, in canonical form; never stored raw) -> `key:<32 hex>`; else the client address
-> `addr:<ip>`. Canonical, because a principal that a caller could rename by spelling (a scheme in
another case, extra spaces, one more credential-looking header the upstream ignores) would give it
a fresh budget per spelling. `ragtoll principal-id` prints the same ids for operators' overrides.

Windows: new tasks are counted over the last 60 s exactly (one entry per new task); cost per hour
is the sum of the last 60 minute buckets (the current one included: 59-60 minutes back), cost per
day the sum of the last 24 hour buckets (23-24 hours back). Costs are nano-USD, as task ledgers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from ragtoll.instrumentation.semconv import PRINCIPAL_DIMENSIONS

from .budget import NANO

# checked in this order; the first one that refuses names the rejection
DIMENSIONS = PRINCIPAL_DIMENSIONS
COST_DIMENSIONS = frozenset({"max_cost_usd_per_hour", "max_cost_usd_per_day"})
NEW_TASK_WINDOW_MS = 60_000
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
HOUR_BUCKETS = 60  # minute buckets summed for the hour
DAY_BUCKETS = 24  # hour buckets summed for the day
SCOPE = "principal"  # the `scope` of a principal rejection (a task's own budget is scope `task`)


# Credential-looking headers: the ones an adapter that does not name its own may authenticate by,
# in the order the first one sent is taken (adapters declare theirs: `Adapter.credential_headers`).
CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key")


def credential(headers: Mapping[str, str], names: tuple[str, ...] = CREDENTIAL_HEADERS) -> str:
    """Every credential-looking header a caller sent, raw and joined (only NULs when it sent none):
    the anonymous cache principal, which errs towards telling callers apart. Only ever hashed."""
    extra = tuple(n for n in names if n not in CREDENTIAL_HEADERS)
    return "\x00".join(headers.get(h, "") for h in CREDENTIAL_HEADERS + extra)


def canonical_credential(headers: Mapping[str, str], names: tuple[str, ...] = CREDENTIAL_HEADERS) -> str:
    """The credential that names a principal: the first of `names` (the route's upstream's credential
    headers, in its order of precedence) the caller sent with a value, as `<header>:<value>` with
    the value canonical (`canonical_value`); "" when it sent none. Other headers never change it."""
    for name in names:
        value = canonical_value(name, headers.get(name, ""))
        if value:
            return f"{name}:{value}"
    return ""


def canonical_value(name: str, value: str) -> str:
    """A credential header's value as the upstream reads it: whitespace trimmed and runs of it made
    one space; the scheme of an `authorization` value (`Bearer`, `Basic`, `ApiKey`) in lower case,
    as HTTP auth schemes are case-insensitive (RFC 9110 11.1)."""
    parts = value.split()
    if name == "authorization" and len(parts) > 1:
        parts[0] = parts[0].lower()
    return " ".join(parts)


def subject_id(subject: str, tenant: str = "") -> str:
    """The id of a verified identity."""
    return f"sub:{tenant}/{subject}" if tenant else f"sub:{subject}"


def credential_id(credential: str) -> str:
    """The id of an unverified credential: a hash, so the credential itself is never kept."""
    return "key:" + hashlib.sha256(credential.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def principal_id(subject: str | None, tenant: str, credential: str, address: str) -> str:
    """`subject`: a verified identity's, or None. `credential`: `canonical_credential(headers, ...)`."""
    if subject:
        return subject_id(subject, tenant)
    if credential:
        return credential_id(credential)
    return f"addr:{address or 'unknown'}"


def to_units(limits: Mapping[str, float]) -> dict[str, int]:
    """Config limits (USD, counts) -> internal integers (nano-USD, counts)."""
    return {d: round(v * NANO) if d in COST_DIMENSIONS else int(v) for d, v in limits.items()}


@dataclass(frozen=True, slots=True)
class Standing:
    """A principal's use as the store saw it when it decided a call (before the call's own share).
    A cost without a limit is not summed (0)."""

    live_tasks: int = 0
    new_tasks: int = 0  # tasks started in the last minute
    cost_hour: int = 0  # nano-USD
    cost_day: int = 0

    def used(self, dim: str) -> int:
        return {"max_new_tasks_per_minute": self.new_tasks, "max_concurrent_tasks": self.live_tasks,
                "max_cost_usd_per_hour": self.cost_hour, "max_cost_usd_per_day": self.cost_day}[dim]


def first_exceeded(limits: Mapping[str, int], standing: Standing, new_task: bool) -> str | None:
    """The limit that refuses the call, or None. A limit of N admits N: the N+1st new task in a
    minute, or a task beyond N live ones, is refused. Cost is settled after calls, so a call is
    refused once what was settled reaches the limit (calls in flight then may still complete)."""
    for dim in DIMENSIONS:
        limit = limits.get(dim)
        if limit is None or (dim not in COST_DIMENSIONS and not new_task):
            continue
        if standing.used(dim) >= limit:
            return dim
    return None


def minute_of(now_ms: int) -> int:
    return now_ms // MINUTE_MS


def hour_of(now_ms: int) -> int:
    return now_ms // HOUR_MS


def window_sum(buckets: Mapping[int, int], current: int, width: int) -> int:
    """The sum of the buckets in (current - width, current]."""
    return sum(v for k, v in buckets.items() if current - width < k <= current)


def used_value(dim: str, standing: Standing) -> float:
    """What the rejection body and spans say was used (USD for cost)."""
    raw = standing.used(dim)
    return round(raw / NANO, 9) if dim in COST_DIMENSIONS else raw


def limit_value(dim: str, limit: int) -> float:
    return limit / NANO if dim in COST_DIMENSIONS else limit
