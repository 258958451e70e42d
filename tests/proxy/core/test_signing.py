"""Signed and unsigned budget baggage: parsing and HMAC verification (key loading: test_secrets.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ragtoll.proxy.config import DIMENSIONS
from ragtoll.proxy.core.signing import (
    EXP_KEY,
    FRACTIONAL,
    MAX_VALUE,
    PREFIX,
    SIG_KEY,
    canonical,
    requested_limits,
    sign_budget,
    verify_budget_baggage,
)
from ragtoll.proxy.errors import ConfigError
from ragtoll.proxy.request.identify import parse_baggage

KEY = b"k" * 32
NOW = 1_800_000_000.0
EXP = 1_800_000_600


def members_of(baggage: str) -> dict[str, str]:
    """Decode baggage the way the identify stage does, so tests cover the real wire format."""
    members, notes = parse_baggage(baggage)
    assert notes == []
    return dict(members)


def signed(
    limits: dict[str, float], task: str = "task-1", exp: float = EXP, key: bytes = KEY
) -> dict[str, str]:
    return members_of(sign_budget(task, limits, key, exp))


# --- signing and verifying ------------------------------------------------------------------------


def test_signed_raise_verifies_and_is_also_a_valid_request() -> None:
    baggage = sign_budget("task-1", {"max_steps": 40, "max_cost_usd": 1.5}, KEY, EXP)
    assert baggage.startswith("ragtoll.budget.max_cost_usd=1.5,ragtoll.budget.max_steps=40,")
    assert f"{EXP_KEY}={EXP}" in baggage and f"{SIG_KEY}=" in baggage
    members = members_of(baggage)
    assert verify_budget_baggage(members, "task-1", KEY, NOW) == (
        {"max_steps": 40.0, "max_cost_usd": 1.5},
        [],
    )
    assert requested_limits(members) == ({"max_steps": 40.0, "max_cost_usd": 1.5}, [])


def test_numbers_are_normalised_so_equal_values_verify() -> None:
    members = signed({"max_steps": 40})
    members[PREFIX + "max_steps"] = "40.000"
    assert verify_budget_baggage(members, "task-1", KEY, NOW)[0] == {"max_steps": 40.0}
    assert canonical("t", {"max_steps": 5}, 9) == canonical("t", {"max_steps": 5.0}, 9)


def test_canonical_string_covers_task_expiry_and_sorted_limits() -> None:
    text = canonical("a\nb", {"max_steps": 3, "max_cost_usd": 0.25}, 123)
    assert text == b"ragtoll-budget-v1\n3:a\nb\n123\nmax_cost_usd=0.25;max_steps=3"


@pytest.mark.parametrize(
    ("change", "note"),
    [
        (lambda m: m.update({PREFIX + "max_steps": "41"}), "bad signature"),
        (lambda m: m.update({PREFIX + "max_calls": "100"}), "bad signature"),
        (lambda m: m.pop(PREFIX + "max_cost_usd"), "bad signature"),
        (lambda m: m.update({EXP_KEY: str(EXP + 3600)}), "bad signature"),
        (
            lambda m: m.update({SIG_KEY: m[SIG_KEY][:-1] + ("A" if m[SIG_KEY][-1] != "A" else "B")}),
            "bad signature",
        ),
        (lambda m: m.update({SIG_KEY: "not base64!"}), "malformed ragtoll.budget.sig"),
        (lambda m: m.update({EXP_KEY: "soon"}), "malformed ragtoll.budget.exp"),
        (lambda m: m.update({PREFIX + "max_steps": "-1"}), "max_steps negative value"),
        (lambda m: m.pop(EXP_KEY), "sig without ragtoll.budget.exp"),
    ],
)
def test_modified_baggage_never_verifies(change: object, note: str) -> None:
    members = signed({"max_steps": 40, "max_cost_usd": 1.5})
    change(members)  # type: ignore[operator]
    limits, notes = verify_budget_baggage(members, "task-1", KEY, NOW)
    assert limits == {}
    assert len(notes) == 1 and notes[0].startswith("signed budget ignored:") and note in notes[0]


def test_signature_is_bound_to_task_and_key() -> None:
    members = signed({"max_steps": 40})
    assert verify_budget_baggage(members, "task-2", KEY, NOW) == (
        {},
        ["signed budget ignored: bad signature"],
    )
    other = b"x" * 32
    assert verify_budget_baggage(members, "task-1", other, NOW) == (
        {},
        ["signed budget ignored: bad signature"],
    )


def test_expired_signature_is_ignored_with_a_note() -> None:
    members = signed({"max_steps": 40})
    assert verify_budget_baggage(members, "task-1", KEY, EXP) == (
        {},
        [f"signed budget ignored: expired at {EXP}"],
    )
    assert verify_budget_baggage(members, "task-1", KEY, EXP - 1)[0] == {"max_steps": 40.0}
    assert verify_budget_baggage(members, "task-1", KEY, math.nan)[0] == {}


def test_missing_key_and_unsigned_baggage() -> None:
    members = signed({"max_steps": 40})
    assert verify_budget_baggage(members, "task-1", None, NOW) == (
        {},
        ["signed budget ignored: no HMAC key configured"],
    )
    assert verify_budget_baggage({PREFIX + "max_steps": "3"}, "task-1", KEY, NOW) == ({}, [])
    assert verify_budget_baggage({EXP_KEY: "5"}, "task-1", KEY, NOW)[1] == [
        "signed budget ignored: ragtoll.budget.exp without ragtoll.budget.sig"
    ]


def test_unknown_members_are_outside_the_signature() -> None:
    members = signed({"max_steps": 40})
    members[PREFIX + "max_bananas"] = "9"
    members[PREFIX + "profile"] = "wide"
    members["other.vendor"] = "x"
    assert verify_budget_baggage(members, "task-1", KEY, NOW) == ({"max_steps": 40.0}, [])


@pytest.mark.parametrize(
    ("limits", "key", "exp", "message"),
    [
        ({"max_steps": 4}, b"short", EXP, "at least 16 bytes"),
        ({}, KEY, EXP, "no limits"),
        ({"max_bananas": 4}, KEY, EXP, "unknown dimension"),
        ({"max_steps": 2.5}, KEY, EXP, "not a whole number"),
        ({"max_steps": -1}, KEY, EXP, "negative"),
        ({"max_cost_usd": math.inf}, KEY, EXP, "finite"),
        ({"max_steps": 4}, KEY, math.nan, "expires_at"),
    ],
)
def test_sign_budget_rejects_bad_input(
    limits: dict[str, float], key: bytes, exp: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        sign_budget("task-1", limits, key, exp)


# --- unsigned requests --------------------------------------------------------------------------------


def test_requested_limits_accepts_good_values_and_explains_the_rest() -> None:
    members = {
        PREFIX + "max_steps": "3",
        PREFIX + "max_cost_usd": "0.02",
        PREFIX + "max_calls": " 7 ",
        PREFIX + "max_latency_ms": "-5",
        PREFIX + "max_context_tokens": "NaN",
        PREFIX + "max_prompt_tokens": "1e999",
        PREFIX + "max_rerank_calls": "1e13",
        PREFIX + "max_retrieval_calls": "2.5",
        PREFIX + "max_unique_queries": "lots",
        PREFIX + "max_completion_tokens": "1" * 40,
        PREFIX + "max_widgets": "1",
        PREFIX + "profile": "wide",
        SIG_KEY: "x",
        EXP_KEY: "y",
        "ragtoll.task.id": "t",
    }
    limits, notes = requested_limits(members)
    assert limits == {"max_steps": 3.0, "max_cost_usd": 0.02, "max_calls": 7.0}
    assert sorted(notes) == sorted(
        [
            "baggage ragtoll.budget.max_latency_ms ignored: negative value",
            "baggage ragtoll.budget.max_context_tokens ignored: malformed value",
            "baggage ragtoll.budget.max_prompt_tokens ignored: not a finite number",
            "baggage ragtoll.budget.max_rerank_calls ignored: value above 1e+12",
            "baggage ragtoll.budget.max_retrieval_calls ignored: not a whole number",
            "baggage ragtoll.budget.max_unique_queries ignored: malformed value",
            "baggage ragtoll.budget.max_completion_tokens ignored: malformed value",
            "baggage ragtoll.budget.max_widgets ignored: unknown dimension",
        ]
    )


def test_notes_name_hostile_keys_printably() -> None:
    _, notes = requested_limits({PREFIX + "max_\n\x00é" + "x" * 100: "1"})
    assert notes == ["baggage ragtoll.budget.max_\\n\\x00\\xe9" + "x" * 39 + "... ignored: unknown dimension"]


# --- properties -------------------------------------------------------------------------------------------

_names = st.one_of(
    st.sampled_from([PREFIX + d for d in DIMENSIONS] + [SIG_KEY, EXP_KEY, PREFIX + "profile", PREFIX + "x"]),
    st.text(max_size=30),
)
_values = st.one_of(
    st.text(max_size=50),
    st.sampled_from(["1", "0", "-0", "1e3", "inf", "nan", "0x10", "1_000", "٣", "", " 5 ", "1e-400"]),
    st.floats(allow_nan=True).map(repr),
)
_limits = st.dictionaries(
    st.sampled_from(DIMENSIONS),
    st.integers(min_value=0, max_value=int(MAX_VALUE)).map(float),
    min_size=1,
).map(lambda d: {k: (v / 1000 if k in FRACTIONAL else v) for k, v in d.items()})
_tasks = st.text(min_size=1, max_size=40)
_exp = st.integers(min_value=1, max_value=10**11)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    members=st.dictionaries(_names, _values, max_size=12),
    task=st.text(max_size=40),
    key=st.one_of(st.none(), st.binary(min_size=16, max_size=64)),
    now=st.floats(allow_nan=True),
)
@pytest.mark.slow
def test_no_input_raises_and_results_are_sane(
    members: dict[str, str], task: str, key: bytes | None, now: float
) -> None:
    for limits, notes in (verify_budget_baggage(members, task, key, now), requested_limits(members)):
        assert set(limits) <= set(DIMENSIONS)
        assert all(math.isfinite(v) and 0 <= v <= MAX_VALUE for v in limits.values())
        assert all(isinstance(n, str) and n.isprintable() and "unverifiable" not in n for n in notes)


@pytest.mark.slow
@settings(max_examples=200)
@given(limits=_limits, task=_tasks, exp=_exp, key=st.binary(min_size=16, max_size=64))
def test_sign_then_verify_round_trips(limits: dict[str, float], task: str, exp: int, key: bytes) -> None:
    members = members_of(sign_budget(task, limits, key, exp))
    assert verify_budget_baggage(members, task, key, exp - 1) == (limits, [])
    assert requested_limits(members) == (limits, [])


@pytest.mark.slow
@settings(max_examples=200)
@given(limits=_limits, task=_tasks, exp=_exp, now_past_exp=st.floats(min_value=0, max_value=1e6))
def test_expired_never_verifies(limits: dict[str, float], task: str, exp: int, now_past_exp: float) -> None:
    members = members_of(sign_budget(task, limits, KEY, exp))
    assert verify_budget_baggage(members, task, KEY, exp + now_past_exp)[0] == {}


@pytest.mark.slow
@settings(max_examples=300)
@given(limits=_limits, task=_tasks, exp=_exp, data=st.data())
def test_any_modified_member_never_verifies(
    limits: dict[str, float], task: str, exp: int, data: st.DataObject
) -> None:
    members = members_of(sign_budget(task, limits, KEY, exp))
    original = dict(members)
    name = data.draw(st.sampled_from(sorted(set(members) | {PREFIX + d for d in DIMENSIONS})))
    new_value = data.draw(st.one_of(st.none(), _values, st.integers(0, 10**6).map(str)))
    if new_value is None:
        members.pop(name, None)
    else:
        members[name] = new_value
    verified, _ = verify_budget_baggage(members, task, KEY, exp - 1)
    if verified:
        # The only way through is a change that means the same thing ("40" -> "40.0"): the
        # verified limits are then exactly what the operator signed.
        assert verified == limits
        assert members[SIG_KEY].rstrip("=") == original[SIG_KEY].rstrip("=")
        assert int(members[EXP_KEY]) == exp
