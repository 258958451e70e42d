"""Budget baggage: unsigned limits that may only lower, HMAC-SHA256 signed limits that may raise,
a signed profile choice (`ragtoll.budget.profile` covered by the signature), and signed task
verdicts (`ragtoll.outcome`).

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
PROFILE_KEY = PREFIX + "profile"
SIG_KEY = PREFIX + "sig"
EXP_KEY = PREFIX + "exp"
# Members under the prefix that are not limits: the signature pair, and profile selection
# (read by the budget stage, not here).
RESERVED = frozenset({SIG_KEY, EXP_KEY, PROFILE_KEY})
CANONICAL_VERSION = "ragtoll-budget-v1"
OUTCOME_KEY = "ragtoll.outcome"
OUTCOME_SIG_KEY = OUTCOME_KEY + ".sig"
OUTCOME_VERSION = "ragtoll-outcome-v1"
_VERDICTS = {"correct": True, "true": True, "incorrect": False, "false": False}
MAX_VALUE = 1e12  # far above any sane limit, far below where float integers lose precision
MAX_VALUE_CHARS = 32
MIN_KEY_BYTES = 16
# Costs are fractional; every other dimension counts whole things.
FRACTIONAL = frozenset({"max_cost_usd"})

_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_EXP = re.compile(r"^\d{1,12}$")
_PROFILE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a baggage value needing no percent-encoding
_SIG = re.compile(r"^[A-Za-z0-9_-]{43}={0,1}$")  # 32 bytes, base64url, padding optional


def canonical(task_id: str, limits: Mapping[str, float], expires_at: int, profile: str | None = None) -> bytes:
    """The signed string: version, task id (length-prefixed, so no separator can be forged inside
    it), expiry in unix seconds, then `dimension=value` pairs sorted by dimension, then (only when
    a profile is signed) the profile name, length-prefixed. Without a profile the string is the
    one earlier releases signed, so their signatures still verify."""
    task = task_id.encode("utf-8", "surrogatepass")
    pairs = ";".join(f"{d}={_format(limits[d])}" for d in sorted(limits))
    parts = [CANONICAL_VERSION.encode(), b"%d:%s" % (len(task), task), str(expires_at).encode(), pairs.encode()]
    if profile is not None:
        name = profile.encode("utf-8", "surrogatepass")
        parts.append(b"profile %d:%s" % (len(name), name))
    return b"\n".join(parts)


def sign_budget(task_id: str, limits: Mapping[str, float], key: bytes, expires_at: float,
                profile: str | None = None) -> str:
    """Baggage members granting `limits` (and, when given, `profile`) to `task_id` until
    `expires_at` (unix seconds), e.g. `ragtoll.budget.max_steps=20,ragtoll.budget.exp=1790000000,
    ragtoll.budget.sig=...`.

    For operators: append the result to the agent's `baggage` header. Raises ValueError on
    unknown dimensions, bad values, a non-finite expiry or a key shorter than MIN_KEY_BYTES.
    """
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"HMAC key must be at least {MIN_KEY_BYTES} bytes")
    if not task_id:
        raise ValueError("task id must not be empty")
    if profile is not None and not _PROFILE.match(profile):
        raise ValueError(f"profile {profile!r}: expected letters, digits, '_', '-' or '.' (at most 64)")
    if not limits and profile is None:
        raise ValueError("no limits (or profile) to sign")
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
    if profile is not None:
        members.append(f"{PROFILE_KEY}={profile}")
    members.append(f"{EXP_KEY}={exp}")
    members.append(f"{SIG_KEY}={_mac(key, canonical(task_id, clean, exp, profile))}")
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
        limits, notes, _profile = _verify(members, task_id, key, now)
    except Exception as exc:  # noqa: BLE001 - baggage is attacker-controlled; never fail the call
        return {}, [f"signed budget ignored: unverifiable ({type(exc).__name__})"]
    return limits, notes


def signed_profile(members: Mapping[str, str], task_id: str, key: bytes | None, now: float) -> bool:
    """True when `ragtoll.budget.profile` is covered by a valid, unexpired signature for `task_id`
    (`sign_budget(..., profile=...)`): the operator chose that profile, so it may be more generous
    than the one the task would otherwise get."""
    if members.get(PROFILE_KEY) is None:
        return False
    try:
        return _verify(members, task_id, key, now)[2]
    except Exception:  # noqa: BLE001 - attacker-controlled baggage: unverifiable is unsigned
        return False


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
) -> tuple[dict[str, float], list[str], bool]:
    """(signed limits, notes, whether the signature also covers the profile member)."""
    sig, exp_raw = members.get(SIG_KEY), members.get(EXP_KEY)
    if sig is None and exp_raw is None:
        return {}, [], False
    problem = _signature_problem(sig, exp_raw, key)
    if problem:
        return {}, [f"signed budget ignored: {problem}"], False
    assert isinstance(sig, str) and isinstance(exp_raw, str) and key is not None  # checked above
    limits: dict[str, float] = {}
    for name, raw in members.items():
        if not isinstance(name, str) or not name.startswith(PREFIX) or name in RESERVED:
            continue
        dimension = name[len(PREFIX):]
        if dimension not in DIMENSIONS:
            continue  # not covered by the signature, and `requested_limits` notes it
        value, problem = _check(dimension, raw)
        if value is None:
            return {}, [f"signed budget ignored: {dimension} {problem}"], False
        limits[dimension] = value
    exp = int(exp_raw)
    given = sig.rstrip("=").encode("ascii")
    profile = members.get(PROFILE_KEY)
    # With a profile member: signed over it (the operator chose the profile), or over the limits
    # alone (an unsigned profile beside signed limits, as before profiles could be signed).
    # Compare before looking at expiry, so timing says nothing about which check failed.
    covers_profile = isinstance(profile, str) and hmac.compare_digest(
        _mac(key, canonical(task_id, limits, exp, profile)).encode("ascii"), given)
    valid = covers_profile or hmac.compare_digest(_mac(key, canonical(task_id, limits, exp)).encode("ascii"), given)
    if not valid:
        return {}, ["signed budget ignored: bad signature"], False
    if not (math.isfinite(now) and now < exp):
        return {}, [f"signed budget ignored: expired at {exp}"], False
    return limits, [], covers_profile


def _signature_problem(sig: object, exp_raw: object, key: bytes | None) -> str:
    """Why the signature pair cannot be checked, or "" when it can."""
    if sig is None:
        return "ragtoll.budget.exp without ragtoll.budget.sig"
    if key is None:
        return "no HMAC key configured"
    if exp_raw is None:
        return "ragtoll.budget.sig without ragtoll.budget.exp"
    if not isinstance(exp_raw, str) or not _EXP.match(exp_raw):
        return "malformed ragtoll.budget.exp"
    if not isinstance(sig, str) or not _SIG.match(sig):
        return "malformed ragtoll.budget.sig"
    return ""


def sign_outcome(task_id: str, correct: bool, key: bytes) -> str:
    """Baggage members recording the verdict `correct` on `task_id`, e.g.
    `ragtoll.outcome=correct,ragtoll.outcome.sig=...` (for `ragtoll sign-outcome`). A verdict
    feeds `report` and `recommend`, so only the operator's key may write one from baggage."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"HMAC key must be at least {MIN_KEY_BYTES} bytes")
    if not task_id:
        raise ValueError("task id must not be empty")
    verdict = "correct" if correct else "incorrect"
    return f"{OUTCOME_KEY}={verdict},{OUTCOME_SIG_KEY}={_mac(key, _outcome_canonical(task_id, correct))}"


def verify_outcome(members: Mapping[str, str], task_id: str, key: bytes | None) -> tuple[bool | None, str]:
    """(the verdict, "") when `ragtoll.outcome` is signed for `task_id` with the operator key;
    (None, why it was ignored) otherwise; (None, "") when the baggage carries no verdict."""
    raw = members.get(OUTCOME_KEY)
    if raw is None:
        return None, ""
    verdict = _VERDICTS.get(raw.strip().lower()) if isinstance(raw, str) else None
    if verdict is None:
        return None, f"baggage {OUTCOME_KEY}={str(raw)[:32]!r} ignored: expected correct or incorrect"
    sig = members.get(OUTCOME_SIG_KEY)
    if sig is None:
        return None, f"baggage {OUTCOME_KEY} ignored: unsigned (ragtoll sign-outcome signs a verdict)"
    if key is None:
        return None, f"baggage {OUTCOME_KEY} ignored: no HMAC key configured"
    if not isinstance(sig, str) or not _SIG.match(sig):
        return None, f"baggage {OUTCOME_KEY} ignored: malformed {OUTCOME_SIG_KEY}"
    expected = _mac(key, _outcome_canonical(task_id, verdict))
    if not hmac.compare_digest(expected.encode("ascii"), sig.rstrip("=").encode("ascii")):
        return None, f"baggage {OUTCOME_KEY} ignored: bad signature"
    return verdict, ""


def _outcome_canonical(task_id: str, correct: bool) -> bytes:
    task = task_id.encode("utf-8", "surrogatepass")
    return b"\n".join((OUTCOME_VERSION.encode(), b"%d:%s" % (len(task), task),
                       b"correct" if correct else b"incorrect"))


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
