"""Budget arithmetic, profile selection and charges, as plain calls (the stage: tests/proxy/stages)."""

from __future__ import annotations

import http_sfv
import pytest
from ragtoll.proxy.config import BudgetsConfig, Profile, ProfileRule
from ragtoll.proxy.core import budget as bm
from ragtoll.proxy.core.budget import Charge, Ledger

LLM = Charge(steps=1, context_tokens=100, prompt_tokens=100, completion_reserve=50)
RETRIEVAL = Charge(retrieval_calls=1, query_key="q1")


def ledger(**counters: int) -> Ledger:
    return Ledger("t", "p", started_ms=1_000, last_ms=1_000, counters=dict(counters))


@pytest.mark.parametrize(("dim", "counter", "charge"), [
    ("max_steps", "steps", LLM),
    ("max_calls", "calls", LLM),
    ("max_retrieval_calls", "retrieval_calls", RETRIEVAL),
    ("max_rerank_calls", "rerank_calls", Charge(rerank_calls=1)),
])
def test_count_limit_of_n_admits_n(dim: str, counter: str, charge: Charge) -> None:
    limits = {dim: 3}
    assert bm.first_exceeded(limits, ledger(**{counter: 2}), charge, False, 1_000) is None
    assert bm.first_exceeded(limits, ledger(**{counter: 3}), charge, False, 1_000) == dim


def test_count_limit_ignores_calls_that_do_not_charge_it() -> None:
    assert bm.first_exceeded({"max_retrieval_calls": 0}, ledger(), LLM, False, 1_000) is None
    assert bm.first_exceeded({"max_steps": 0}, ledger(), RETRIEVAL, False, 1_000) is None


def test_unique_queries_only_new_queries_count() -> None:
    limits = {"max_unique_queries": 2}
    full = ledger(unique_queries=2)
    assert bm.first_exceeded(limits, full, RETRIEVAL, True, 1_000) == "max_unique_queries"
    assert bm.first_exceeded(limits, full, RETRIEVAL, False, 1_000) is None  # a repeat is not a new intent
    assert bm.first_exceeded(limits, ledger(unique_queries=1), RETRIEVAL, True, 1_000) is None


def test_context_tokens_sum_and_prompt_tokens_per_call() -> None:
    assert bm.first_exceeded({"max_context_tokens": 1000}, ledger(context_tokens=900), LLM, False, 0) is None
    assert bm.first_exceeded({"max_context_tokens": 999}, ledger(context_tokens=900), LLM, False, 0) == \
        "max_context_tokens"
    assert bm.first_exceeded({"max_prompt_tokens": 100}, ledger(), LLM, False, 0) is None
    assert bm.first_exceeded({"max_prompt_tokens": 99}, ledger(), LLM, False, 0) == "max_prompt_tokens"


def test_completion_tokens_admit_until_used_up() -> None:
    limits = {"max_completion_tokens": 100}
    assert bm.first_exceeded(limits, ledger(completion_tokens=99), LLM, False, 0) is None
    assert bm.first_exceeded(limits, ledger(completion_tokens=100), LLM, False, 0) == "max_completion_tokens"
    assert bm.first_exceeded(limits, ledger(completion_tokens=100), RETRIEVAL, False, 0) is None


def test_cost_refuses_when_the_known_part_would_cross_the_limit() -> None:
    limits = bm.to_units({"max_cost_usd": 0.002})
    per_call = Charge(retrieval_calls=1, cost_certain=round(0.0005 * bm.NANO))
    # four calls of 0.0005 fit in 0.002 exactly: float drift would refuse the fourth
    assert bm.first_exceeded(limits, ledger(cost_nusd=3 * 500_000), per_call, False, 0) is None
    assert bm.first_exceeded(limits, ledger(cost_nusd=4 * 500_000), per_call, False, 0) == "max_cost_usd"
    llm = Charge(steps=1, completion_reserve=100, cost_certain=1000, cost_reserve=10**7)
    assert bm.first_exceeded(limits, ledger(cost_nusd=0), llm, False, 0) is None  # admitted for what is left ...
    assert bm.granted_output(limits, ledger(cost_nusd=0), llm) == (19, 1_900_000)  # ... and reserved only that
    dear = Charge(steps=1, completion_reserve=100, cost_certain=1000, cost_reserve=10**9)
    # what is left does not pay for one output token: refused (it used to be admitted and overshoot)
    assert bm.first_exceeded(limits, ledger(cost_nusd=0), dear, False, 0) == "max_cost_usd"
    assert bm.first_exceeded(limits, ledger(cost_nusd=2_000_000), llm, False, 0) == "max_cost_usd"


def test_deadline_counts_from_the_first_call() -> None:
    limits = {"max_latency_ms": 500}
    assert bm.first_exceeded(limits, ledger(), LLM, False, 1_499) is None
    assert bm.first_exceeded(limits, ledger(), LLM, False, 1_500) == "max_latency_ms"
    fresh = Ledger("t")  # no first call yet
    assert bm.first_exceeded(limits, fresh, LLM, False, 10**12) is None


def test_stalled_retrievals_stop_retrieval_but_not_answering() -> None:
    limits = {"max_stalled_retrievals": 2}
    assert bm.first_exceeded(limits, ledger(stalled=1), RETRIEVAL, False, 0) is None
    assert bm.first_exceeded(limits, ledger(stalled=2), RETRIEVAL, False, 0) == "max_stalled_retrievals"
    assert bm.first_exceeded(limits, ledger(stalled=2), LLM, False, 0) is None


def test_first_dimension_in_design_order_is_reported() -> None:
    limits = {"max_cost_usd": 0, "max_steps": 0, "max_calls": 0}
    assert bm.first_exceeded(limits, ledger(), Charge(steps=1, cost_certain=1), False, 0) == "max_steps"


def test_apply_charge_adds_every_counter() -> None:
    led = ledger()
    res = bm.apply_charge(led, Charge(steps=1, context_tokens=10, completion_reserve=5, cost_certain=7,
                                      cost_reserve=3), False, 0)
    assert led.counters == {"steps": 1, "calls": 1, "context_tokens": 10, "completion_tokens": 5, "cost_nusd": 10}
    assert res == bm.Reservation(10, 5, 10, False)
    bm.apply_charge(led, Charge(calls=1, cache_hit=True), False, 0)
    assert led.counters["cache_hits"] == 1 and led.counters["calls"] == 2 and led.counters["steps"] == 1


def test_remaining_and_warnings() -> None:
    limits = bm.to_units({"max_steps": 8, "max_cost_usd": 0.05, "max_latency_ms": 1000, "max_prompt_tokens": 500})
    led = ledger(steps=7, cost_nusd=round(0.0377 * bm.NANO))
    left = bm.remaining(limits, led, None, 1_250)
    assert left["max_steps"] == 1 and left["max_latency_ms"] == 750 and left["max_prompt_tokens"] == 500
    assert left["max_cost_usd"] == pytest.approx(0.0123)
    warn = bm.standing(limits, led, None, 1_250, 0.8)[1]
    assert set(warn) == {"max_steps"}
    assert bm.remaining({"max_steps": 1}, ledger(steps=5), None, 0) == {"max_steps": 0}


def test_remaining_header_is_an_rfc8941_dictionary() -> None:
    raw = bm.sf_dictionary({"max_steps": 3, "max_cost_usd": 0.0123, "max_latency_ms": 0})
    parsed = http_sfv.Dictionary()
    parsed.parse(raw)
    assert parsed["max_steps"].value == 3
    assert float(parsed["max_cost_usd"].value) == 0.012  # rounded down, never more than is left
    assert parsed["max_cost_usd"].params["micros"] == 12300
    assert parsed["max_latency_ms"].value == 0
    warn = http_sfv.Dictionary()
    warn.parse(bm.sf_dictionary({"max_steps": 0.875, "max_calls": 1.0}))
    assert float(warn["max_steps"].value) == 0.875 and not warn["max_steps"].params
    assert warn["max_calls"].value == 1


# --- profile selection and baggage -----------------------------------------------------------------

CFG = BudgetsConfig(
    default_profile="bounded",
    classes={"simple_fact": "tight", "multi_hop": "wide"},
    profiles={"bounded": Profile(max_steps=8), "tight": Profile(max_steps=2), "wide": Profile(max_steps=20),
              "locked": Profile(max_steps=1, allow_selection=False)},
    rules=[ProfileRule(profile="wide", header="x-tier", equals="gold"), ProfileRule(profile="tight", route="docs")],
)


def fake_classify(query: str) -> tuple[str, str]:
    return ("multi_hop", "compares two things") if " and " in query else ("simple_fact", "one fact")


def test_selection_order_baggage_rule_classifier_default() -> None:
    assert bm.select_profile(CFG, "openai", {}, {"ragtoll.budget.profile": "wide"}, "x", fake_classify).source == \
        "baggage"
    sel = bm.select_profile(CFG, "openai", {"x-tier": "gold"}, {}, "what is x", fake_classify)
    assert (sel.profile, sel.source) == ("wide", "rule")
    assert bm.select_profile(CFG, "docs", {}, {}, "x", fake_classify).profile == "tight"
    sel = bm.select_profile(CFG, "openai", {}, {}, "compare a and b", fake_classify)
    assert (sel.profile, sel.source, sel.cls, sel.reason) == ("wide", "classifier", "multi_hop", "compares two things")
    sel = bm.select_profile(CFG, "openai", {}, {}, None, fake_classify)
    assert (sel.profile, sel.source) == ("bounded", "default")


def test_classifier_is_skipped_without_classes() -> None:
    calls: list[str] = []

    def spy(q: str) -> tuple[str, str]:
        calls.append(q)
        return "multi_hop", ""

    cfg = BudgetsConfig(profiles=CFG.profiles, default_profile="bounded")
    assert bm.select_profile(cfg, "openai", {}, {}, "a and b", spy).profile == "bounded"
    assert calls == []


def test_baggage_profile_refused_when_not_selectable_or_unknown() -> None:
    sel = bm.select_profile(CFG, "openai", {}, {"ragtoll.budget.profile": "locked"}, None, None)
    assert sel.profile == "bounded" and "does not allow selection" in sel.notes[0]
    sel = bm.select_profile(CFG, "openai", {}, {"ragtoll.budget.profile": "nope"}, None, None)
    assert sel.profile == "bounded" and "no such profile" in sel.notes[0]


def test_baggage_can_only_lower_limits() -> None:
    prof = Profile(max_steps=8, max_cost_usd=0.05)
    limits, notes = bm.effective_limits(prof, {"ragtoll.budget.max_steps": "3", "ragtoll.budget.max_cost_usd": "1"})
    assert limits == {"max_steps": 3, "max_cost_usd": 0.05}
    assert any("can only lower" in n for n in notes)
    limits, _ = bm.effective_limits(prof, {"ragtoll.budget.max_calls": "4"})  # unlimited -> 4 is lower
    assert limits["max_calls"] == 4


@pytest.mark.parametrize("value", ["-1", "1e9", "nan", "inf", "3 ", "0x10", "", "1" * 30])
def test_malformed_budget_baggage_falls_back_to_policy(value: str) -> None:
    limits, notes = bm.effective_limits(Profile(max_steps=8), {"ragtoll.budget.max_steps": value})
    if value.strip() == "3":
        assert limits["max_steps"] == 3
    else:
        assert limits["max_steps"] == 8 and notes


def test_signed_raises_apply_before_plain_lowering() -> None:
    limits, notes = bm.effective_limits(Profile(max_steps=8), {"ragtoll.budget.max_steps": "20"}, {"max_steps": 20})
    assert limits["max_steps"] == 20 and not notes


def test_cache_hit_charges_only_a_call() -> None:
    c = bm.charge_for("retrieval", "retrieval", prompt_tokens=None, max_output_tokens=None,
                      default_max_output_tokens=1024, cost_certain_usd=0.1, cost_reserve_usd=0, query_key="q",
                      cache_hit=True)
    assert c == Charge(calls=1, cache_hit=True)


def test_llm_charge_reserves_requested_or_default_output() -> None:
    c = bm.charge_for("llm", "chat", prompt_tokens=120, max_output_tokens=None, default_max_output_tokens=1024,
                      cost_certain_usd=0.001, cost_reserve_usd=0.002, query_key=None, cache_hit=False)
    assert (c.steps, c.context_tokens, c.prompt_tokens, c.completion_reserve) == (1, 120, 120, 1024)
    assert (c.cost_certain, c.cost_reserve) == (1_000_000, 2_000_000)
    c = bm.charge_for("llm", "chat", prompt_tokens=None, max_output_tokens=64, default_max_output_tokens=1024,
                      cost_certain_usd=0, cost_reserve_usd=0, query_key=None, cache_hit=False)
    assert c.completion_reserve == 64
    r = bm.charge_for("retrieval", "retrieval", prompt_tokens=None, max_output_tokens=None,
                      default_max_output_tokens=1024, cost_certain_usd=0.0005, cost_reserve_usd=0, query_key="k",
                      cache_hit=False)
    assert (r.steps, r.retrieval_calls, r.query_key, r.cost_certain) == (0, 1, "k", 500_000)


def test_remaining_header_stays_within_rfc8941_for_huge_limits() -> None:
    raw = bm.sf_dictionary({"max_cost_usd": 5e12, "max_steps": 10**20, "max_latency_ms": 2.5e13})
    parsed = http_sfv.Dictionary()
    parsed.parse(raw)  # raises on numbers RFC 8941 does not allow
    assert parsed["max_steps"].value == 999_999_999_999_999
    assert parsed["max_cost_usd"].params["micros"] == 999_999_999_999_999
