"""A call's context-economy counts as the ledger keeps them, and the record objects built from
the ledger's sums (core/tally.py)."""

from __future__ import annotations

from ragtoll.proxy.core.tally import Tallies, context_record, ledger_context, ledger_evidence


def test_only_nonzero_counts_go_to_the_ledger_and_an_llm_call_counts_its_input() -> None:
    assert Tallies().ledger_counts() == ()
    counts = Tallies(breakpoints_added=2, resent_tokens=30).ledger_counts(llm_input_tokens=1200)
    assert counts == (("context.breakpoints_added", 2), ("evidence.resent_tokens", 30), ("context.llm_calls", 1),
                      ("context.input_tokens", 1200))
    for name, _ in counts:  # settle.lua reads 'name n name n': a name never holds a space
        assert " " not in name


def test_the_ledgers_sums_make_the_records_objects_and_none_when_it_holds_none() -> None:
    ledger = {"steps": 3, "cached_input_tokens": 600, "context.llm_calls": 2, "context.input_tokens": 1000,
              "evidence.prompt_tokens": 90}
    ctx = ledger_context(ledger)
    assert ctx is not None and ctx == context_record({"llm_calls": 2, "input_tokens": 1000,
                                                      "cached_input_tokens": 600})
    assert ctx["cached_input_share"] == 0.6 and ctx["results_trimmed"] == 0
    assert ledger_evidence(ledger) == {"prompt_tokens": 90, "resent_tokens": 0}
    assert ledger_context({"steps": 3, "cached_input_tokens": 600}) is None
    assert ledger_evidence({"evidence": 2}) is None  # the fruitful-evidence count is another thing
