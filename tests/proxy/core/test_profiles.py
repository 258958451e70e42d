"""Profiles by trust: what unsigned baggage may choose, what needs the operator's signature."""

from __future__ import annotations

from collections.abc import Mapping

from ragtoll.proxy.config import BudgetsConfig, Profile, ProfileRule
from ragtoll.proxy.core.profiles import Profiles, more_generous
from ragtoll.proxy.core.signing import sign_budget, signed_profile, verify_budget_baggage

CFG = BudgetsConfig(
    default_profile="small",
    classes={"simple_fact": "small", "multi_hop": "wide"},
    profiles={"small": Profile(max_steps=3, max_cost_usd=1.0), "wide": Profile(max_steps=20, max_cost_usd=5.0),
              "smaller": Profile(max_steps=1, max_cost_usd=0.5, max_calls=9), "steps_only": Profile(max_steps=2),
              "quiet": Profile(max_steps=1, max_cost_usd=0.1, mode="shadow")},
    rules=[ProfileRule(profile="wide", header="x-tier", equals="gold")],
)
KEY = b"k" * 32


def test_more_generous_names_each_looser_limit_a_missing_one_and_shadow_mode() -> None:
    p = CFG.profiles
    assert more_generous(p["wide"], p["small"], "enforce") == ["max_steps", "max_cost_usd"]
    assert more_generous(p["steps_only"], p["small"], "enforce") == ["max_cost_usd"]  # no limit: unlimited
    assert more_generous(p["smaller"], p["small"], "enforce") == []  # an extra limit only tightens
    assert more_generous(p["small"], p["small"], "enforce") == []
    assert more_generous(p["quiet"], p["small"], "enforce") == ["mode"]


class Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, query: str) -> tuple[str, str]:
        self.calls += 1
        return ("multi_hop", "two things") if " and " in query else ("simple_fact", "one fact")


def choose(profiles: Profiles, baggage: Mapping[str, str], task: str = "t", query: str = "what is x",
           headers: Mapping[str, str] | None = None) -> tuple[str, str, tuple[str, ...]]:
    sel = profiles.choose(task, "openai", headers or {}, baggage, [], query, None)
    return sel.profile, sel.source, sel.notes


def test_unsigned_baggage_gets_the_profile_it_asks_only_when_no_more_generous() -> None:
    profiles = Profiles(CFG, Counting())
    assert choose(profiles, {"ragtoll.budget.profile": "smaller"}, "a")[:2] == ("smaller", "baggage")
    profile, source, notes = choose(profiles, {"ragtoll.budget.profile": "wide"}, "b")
    assert (profile, source) == ("small", "classifier")
    assert "'wide' ignored: more generous than 'small' (max_steps, max_cost_usd)" in notes[-1]
    # measured against what the task would otherwise get: a gold-tier rule gives `wide` itself
    assert choose(profiles, {"ragtoll.budget.profile": "wide"}, "c", headers={"x-tier": "gold"})[:2] == \
        ("wide", "baggage")


def test_a_refused_choice_is_not_tried_again_on_every_call() -> None:
    classify = Counting()
    profiles = Profiles(CFG, classify)
    for _ in range(5):
        assert choose(profiles, {"ragtoll.budget.profile": "wide"})[0] == "small"
    assert classify.calls == 1


def test_a_signed_profile_may_be_more_generous() -> None:
    profiles = Profiles(CFG, Counting(), signed=lambda baggage, task: task == "ok")
    assert choose(profiles, {"ragtoll.budget.profile": "wide"}, "ok")[:2] == ("wide", "baggage")
    assert choose(profiles, {"ragtoll.budget.profile": "wide"}, "other")[0] == "small"


def members(baggage: str) -> dict[str, str]:
    return dict(m.split("=", 1) for m in baggage.split(","))


def test_the_signature_covers_the_profile_and_older_signatures_still_verify() -> None:
    grant = members(sign_budget("t", {"max_steps": 9}, KEY, 2e9, profile="wide"))
    assert signed_profile(grant, "t", KEY, 1e9)
    assert verify_budget_baggage(grant, "t", KEY, 1e9) == ({"max_steps": 9}, [])
    assert not signed_profile({**grant, "ragtoll.budget.profile": "other"}, "t", KEY, 1e9)
    assert not signed_profile(grant, "t", KEY, 2e9 + 1)  # expired
    assert not signed_profile(grant, "t", None, 1e9)
    # limits signed without a profile, an unsigned profile beside them: the limits hold, the profile does not
    plain = {**members(sign_budget("t", {"max_steps": 9}, KEY, 2e9)), "ragtoll.budget.profile": "wide"}
    assert verify_budget_baggage(plain, "t", KEY, 1e9) == ({"max_steps": 9}, [])
    assert not signed_profile(plain, "t", KEY, 1e9)
