"""Query-complexity classifier: labelled-set accuracy floors, rule reasons, totality."""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ragtoll.proxy.core.classifier import CLASSES, MAX_CHARS, classify


def rows(split: str) -> list[dict[str, str]]:
    text = resources.files("ragtoll.proxy.data").joinpath("classifier_questions.jsonl").read_text("utf-8")
    every = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [r for r in every if split == "all" or r["split"] == split]


def accuracy(split: str) -> float:
    data = rows(split)
    return sum(classify(r["q"])[0] == r["label"] for r in data) / len(data)


def test_labelled_set_is_large_varied_and_well_formed() -> None:
    data = rows("all")
    assert len(data) >= 400
    assert len({r["q"] for r in data}) == len(data)
    assert {r["label"] for r in data} == set(CLASSES)
    assert {r["split"] for r in data} == {"dev", "test", "holdout"}
    assert len({r["domain"] for r in data}) >= 15
    per_class = Counter(r["label"] for r in rows("test"))
    assert min(per_class.values()) >= 30


# Floors are the measured accuracy (bench/eval_classifier.py) minus a small margin, so a rule
# change that loses ground on held-out questions fails here. Measured: test 0.977 (177 questions
# from the 8 domains the rules were tuned on), holdout 0.835 (85 questions, 7 domains written
# after the rules were frozen). Neither split was used for tuning.
@pytest.mark.parametrize(("split", "floor"), [("test", 0.95), ("holdout", 0.80)])
def test_accuracy_on_held_out_questions(split: str, floor: float) -> None:
    assert accuracy(split) >= floor


def test_every_class_is_recalled_on_the_test_split() -> None:
    data = rows("test")
    for label in CLASSES:
        gold = [r for r in data if r["label"] == label]
        recall = sum(classify(r["q"])[0] == label for r in gold) / len(gold)
        assert recall >= 0.9, label


@pytest.mark.parametrize(
    ("query", "label", "reason"),
    [
        ("What's the refund window for annual plans?", "simple_fact", "single lookup"),
        ("Where can I find the API key page?", "simple_fact", "single lookup"),
        ("How long does the warranty last on refurbished phones?", "simple_fact", "single lookup"),
        ("How do I rotate the signing secret?", "procedural", "how-to opener 'how do i'"),
        ("Steps to export my workspace data", "procedural", "how-to opener 'steps to'"),
        ("Walk me through closing the books for March.", "procedural", "how-to opener 'walk me through'"),
        ("Configure SAML for the admin console", "procedural", "how-to opener 'configure'"),
        ("Compare the Team and Business plans", "multi_hop", "comparison of 2 items 'compare'"),
        ("Postgres vs MySQL for the audit store?", "multi_hop", "comparison of 2 items 'vs'"),
        ("If I cancel mid-cycle, what happens to my credits?", "multi_hop", "conditional chain 'if'"),
        ("Which plans include both SSO and audit logs?", "multi_hop", "aggregation over facts 'both'"),
        ("What did the 2023 policy say compared to 2025?", "multi_hop", "comparison"),
        (
            "Did the limits in v2.1 carry over into v3.0?",
            "multi_hop",
            "2 dates/versions to line up (v2.1, v3.0)",
        ),
        ("Investigate the timeouts on the export job", "investigative", "analysis cue 'investigat"),
        ("Why have refund requests doubled since May?", "investigative", "why + observed change"),
        ("What's driving the churn in small accounts?", "investigative", "open-ended cause/trend cue"),
        ("Find the root cause of the failed payouts", "investigative", "analysis cue 'root cause'"),
    ],
)
def test_hand_picked_examples_and_their_reasons(query: str, label: str, reason: str) -> None:
    got_label, got_reason = classify(query)
    assert got_label == label
    assert reason in got_reason


def test_a_how_to_opener_outranks_later_comparison_words() -> None:
    assert classify("How do I compare two invoices side by side?")[0] == "procedural"
    assert classify("Assess which plan is better for us across all teams")[0] == "investigative"


def test_nouns_that_look_like_analysis_verbs_do_not_fire() -> None:
    assert classify("Is the audit firm still the same?") == (
        "simple_fact",
        "no procedural, comparison, chaining or analysis cue: single lookup",
    )


def test_empty_and_oversized_queries() -> None:
    assert classify("   \n ") == ("simple_fact", "empty query")
    # Only the head is read: a cue buried after MAX_CHARS is not seen.
    assert classify("What is the notice period? " + "x " * MAX_CHARS + "investigate")[0] == "simple_fact"


def test_a_control_character_in_the_query_stays_out_of_the_reason() -> None:
    _label, reason = classify("?\x1b?")  # hypothesis found it: the reason is a span attribute
    assert reason.isprintable()


@given(st.text(max_size=3000))
def test_total_and_deterministic(query: str) -> None:
    label, reason = classify(query)
    assert label in CLASSES
    assert reason and reason.isprintable()
    assert classify(query) == (label, reason)
