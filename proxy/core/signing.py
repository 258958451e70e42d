"""Budget baggage: unsigned limits that may only lower, HMAC-SHA256 signed limits that may raise.

Pure core (`sign_budget`, `verify_budget_baggage`, `requested_limits`) works on the decoded W3C
baggage members. Pure: the key is given (ragtoll.proxy.secrets reads it).
Nothing here raises for bad baggage: it is ignored and explained in the returned notes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
from collections.abc import Mapping

from ..config import DIMENSIONS

PREFIX = "ragtoll.budget."
SIG_KEY = PREFIX + "sig"
EXP_KEY = PREFIX + "exp"
# Members under the prefix that are not limits: the signature pair, and profile selection
# (read by the budget stage, not here).
RESERVED = frozenset({SIG_KEY, EXP_KEY, PREFIX + "profile"})
CANONICAL_VERSION = "ragtoll-budget-v1"
MAX_VALUE = 1e12  # far above any sane limit, far below where float integers lose precision
MAX_VALUE_CHARS = 32
MIN_KEY_BYTES = 16
# Costs are fractional; every other dimension counts whole things.
FRACTIONAL = frozenset({"max_cost_usd"})

_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_EXP = re.compile(r"^\d{1,12}$")
_SIG = re.compile(r"^[A-Za-z0-9_-]{43}={0,1}$")  # 32 bytes, base64url, padding optional


def canonical(task_id: str, limits: Mapping[str, float], expires_at: int) -> bytes:
    """The signed string: version, task id (length-prefixed, so no separator can be forged inside
    it), expiry in unix seconds, then `dimension=value` pairs sorted by dimension."""
    task = task_id.encode("utf-8", "surrogatepass")
    pairs = ";".join(f"{d}={_format(limits[d])}" for d in sorted(limits))
    return b"\n".join(
        (CANONICAL_VERSION.encode(), b"%d:%s" % (len(task), task), str(expires_at).encode(), pairs.encode())
    )


def sign_budget(task_id: str, limits: Mapping[str, float], key: bytes, expires_at: float) -> str:
    """Baggage members granting `limits` to `task_id` until `expires_at` (unix seconds), e.g.
    `ragtoll.budget.max_steps=20,ragtoll.budget.exp=1790000000,ragtoll.budget.sig=...`.

    For operators: append the result to the agent's `baggage` header. Raises ValueError on
    unknown dimensions, bad values, a non-finite expiry or a key shorter than MIN_KEY_BYTES.
    """
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"HMAC key must be at least {MIN_KEY_BYTES} bytes")
    if not task_id:
        raise ValueError("task id must not be empty")
    if not limits:
        raise ValueError("no limits to sign")
    if not (_is_number(expires_at) and math.isfinite(expires_at) and 0 < expires_at < 1e12):
        raise ValueError(f"expires_at must be unix seconds, got {expires_at!r}")
    clean: dict[str, float] = {}
    for dimension, value in limits.items():
        if _is_number(value) and not math.isfinite(value):
            raise ValueError(f"{dimension}: not a finite number")
        parsed, problem = _check(dimension, _format(value) if _is_number(value) else str(value))
        if parsed is None:
            raise ValueError(f"{dimension}: {problem}")
        clean[dimension] = parsed
    exp = int(expires_at)
    members = [f"{PREFIX}{d}={_format(clean[d])}" for d in sorted(clean)]
    members.append(f"{EXP_KEY}={exp}")
    members.append(f"{SIG_KEY}={_mac(key, canonical(task_id, clean, exp))}")
    return ",".join(members)


def verify_budget_baggage(
    members: Mapping[str, str], task_id: str, key: bytes | None, now: float
) -> tuple[dict[str, float], list[str]]:
    """The signed limits that may RAISE the profile, and notes on anything ignored.

    Limits come back only when a signature is present, the key is configured, the expiry is in
    the future and the HMAC over task id, every `ragtoll.budget.<dimension>` member and the
    expiry matches; otherwise `{}`. Adding, dropping or changing any limit member, the expiry or
    the task id breaks the signature. With no signature and no expiry there is nothing to verify:
    `({}, [])`. The same members still count as unsigned requests (`requested_limits`).
    """
    try:
        return _verify(members, task_id, key, now)
    except Exception as exc:  # noqa: BLE001 - baggage is attacker-controlled; never fail the call
        return {}, [f"signed budget ignored: unverifiable ({type(exc).__name__})"]


def requested_limits(members: Mapping[str, str]) -> tuple[dict[str, float], list[str]]:
    """Unsigned `ragtoll.budget.<dimension>=N` members and notes on the ones rejected.

    The caller applies these with `min(profile limit, requested)`: they may only lower. Rejected
    (with a note): unknown dimensions, malformed, negative, non-finite, oversized, or fractional
    values for counting dimensions.
    """
    limits: dict[str, float] = {}
    notes: list[str] = []
    for name, raw in members.items():
        if not isinstance(name, str) or not name.startswith(PREFIX) or name in RESERVED:
            continue
        dimension = name[len(PREFIX):]
        value, problem = _check(dimension, raw)
        if value is None:
            notes.append(f"baggage {_printable(name)} ignored: {problem}")
        else:
            limits[dimension] = value
    return limits, notes


def _verify(
    members: Mapping[str, str], task_id: str, key: bytes | None, now: float
) -> tuple[dict[str, float], list[str]]:
    sig, exp_raw = members.get(SIG_KEY), members.get(EXP_KEY)
    if sig is None and exp_raw is None:
        return {}, []
    if sig is None:
        return {}, ["signed budget ignored: ragtoll.budget.exp without ragtoll.budget.sig"]
    if key is None:
        return {}, ["signed budget ignored: no HMAC key configured"]
    if exp_raw is None:
        return {}, ["signed budget ignored: ragtoll.budget.sig without ragtoll.budget.exp"]
    if not isinstance(exp_raw, str) or not _EXP.match(exp_raw):
        return {}, ["signed budget ignored: malformed ragtoll.budget.exp"]
    if not isinstance(sig, str) or not _SIG.match(sig):
        return {}, ["signed budget ignored: malformed ragtoll.budget.sig"]
    limits: dict[str, float] = {}
    for name, raw in members.items():
        if not isinstance(name, str) or not name.startswith(PREFIX) or name in RESERVED:
            continue
        dimension = name[len(PREFIX):]
        if dimension not in DIMENSIONS:
            continue  # not covered by the signature, and `requested_limits` notes it
        value, problem = _check(dimension, raw)
        if value is None:
            return {}, [f"signed budget ignored: {dimension} {problem}"]
        limits[dimension] = value
    exp = int(exp_raw)
    expected = _mac(key, canonical(task_id, limits, exp))
    # Compare before looking at expiry, so timing says nothing about which check failed.
    valid = hmac.compare_digest(expected.encode("ascii"), sig.rstrip("=").encode("ascii"))
    if not valid:
        return {}, ["signed budget ignored: bad signature"]
    if not (math.isfinite(now) and now < exp):
        return {}, [f"signed budget ignored: expired at {exp}"]
    return limits, []


def _check(dimension: str, raw: object) -> tuple[float | None, str]:
    """(value, "") for an acceptable limit, else (None, why)."""
    if dimension not in DIMENSIONS:
        return None, "unknown dimension"
    if not isinstance(raw, str):
        return None, "malformed value"
    raw = raw.strip()
    if len(raw) > MAX_VALUE_CHARS or not _NUMBER.match(raw):
        return None, "malformed value"
    value = float(raw)
    if not math.isfinite(value):
        return None, "not a finite number"
    if value < 0:
        return None, "negative value"
    if value > MAX_VALUE:
        return None, f"value above {MAX_VALUE:.0e}"
    if dimension not in FRACTIONAL and value != int(value):
        return None, "not a whole number"
    return value + 0.0, ""  # + 0.0 folds -0.0 into 0.0


def _format(value: float) -> str:
    """One spelling per number: 5, 5.0 and "5.00" all become "5"; 0.25 stays "0.25"."""
    value = float(value) + 0.0
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mac(key: bytes, message: bytes) -> str:
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _printable(name: str) -> str:
    """Baggage keys are attacker-chosen: keep notes short and printable."""
    shown = name if len(name) <= 64 else name[:61] + "..."
    return shown.encode("unicode_escape").decode("ascii")
