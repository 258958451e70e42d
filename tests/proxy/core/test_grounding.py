"""Groundedness: an answer's claims against the chunks its task retrieved (hand-made answers)."""

from __future__ import annotations

import pytest
from ragtoll.proxy.core import grounding
from ragtoll.proxy.core.grounding import Grounding, TaskEvidence, citations, claims, content_words

REFUNDS = ("Refunds on annual plans are allowed within 30 days of purchase. "
           "Monthly plans renew on the first day of each month and are not refundable.")
COBALT = "The Security Engineering team owns Cobalt. The team is led by Dana Ortiz."


@pytest.fixture
def evidence() -> TaskEvidence:
    ev = TaskEvidence()
    ev.add("doc-1", REFUNDS)
    ev.add("doc-2", COBALT)
    return ev


def test_a_grounded_answer_paraphrasing_the_evidence_is_fully_supported(evidence: TaskEvidence) -> None:
    g = evidence.ground("Yes. Annual plans can be refunded within 30 days of the purchase.\n"
                        "Cobalt is owned by the Security Engineering team, led by Dana Ortiz.")
    assert g == Grounding(claims=2, supported=2, citations=0, citations_retrieved=0)
    assert g.share == 1.0  # "Yes." is no claim: fewer than MIN_CLAIM_WORDS content words


def test_a_partly_grounded_answer(evidence: TaskEvidence) -> None:
    g = evidence.ground("Annual plans are refundable within 30 days of purchase. "
                        "Refunds are paid out in bitcoin by the finance robot. "
                        "Enterprise customers receive a dedicated lawyer for disputes.")
    assert (g.claims, g.supported, g.share) == (3, 1, 0.3333)


def test_an_ungrounded_answer(evidence: TaskEvidence) -> None:
    g = evidence.ground("The moon is made of green cheese and orbits Jupiter every Tuesday.")
    assert (g.claims, g.supported, g.share) == (1, 0, 0.0)


def test_a_wrong_number_is_not_supported_even_with_every_word_there(evidence: TaskEvidence) -> None:
    assert evidence.ground("Annual plans are refundable within 60 days of purchase.").supported == 0
    assert evidence.ground("Annual plans are refundable within 30 days of purchase.").supported == 1


def test_citations_of_retrieved_chunks_count_and_must_back_the_claim(evidence: TaskEvidence) -> None:
    g = evidence.ground("Annual plans are refundable within 30 days of purchase [doc-1]. "
                        "The Security Engineering team owns Cobalt. [doc-2]")
    assert g == Grounding(claims=2, supported=2, citations=2, citations_retrieved=2)
    # cited, retrieved, but the cited chunk says nothing of it: another chunk does not rescue it
    g = evidence.ground("The Security Engineering team owns Cobalt [doc-1].")
    assert (g.supported, g.citations_retrieved) == (0, 1)


def test_a_citation_of_a_chunk_never_retrieved_makes_the_claim_unsupported(evidence: TaskEvidence) -> None:
    g = evidence.ground("The Security Engineering team owns Cobalt [doc-9].")
    assert g == Grounding(claims=1, supported=0, citations=1, citations_retrieved=0)
    g = evidence.ground("The Security Engineering team owns Cobalt [doc-2, doc-9].")
    assert (g.supported, g.citations, g.citations_retrieved) == (0, 2, 1)


def test_positional_markers_and_prose_brackets_are_not_citations() -> None:
    assert citations("Refunds within 30 days [1].") == ("Refunds within 30 days  .", [])
    assert citations("Plans [see the pricing page] renew.")[1] == []
    assert citations("As stated [sources: kb:7; kb:9].")[1] == ["kb:7", "kb:9"]


def test_abstentions_and_short_sentences_are_not_claims(evidence: TaskEvidence) -> None:
    assert claims("I could not find a supported answer in the documents available to me.") == []
    assert claims("Sure! Here it is:") == []
    assert evidence.ground("I don't know.").share is None  # no claim: no groundedness


def test_content_words_fold_case_plurals_synonyms_and_numbers() -> None:
    assert content_words("The SUBSCRIPTIONS cost $1,200.") == content_words("plan fees 1200")
    assert "the" not in content_words("The plan") and "on" not in content_words("on the plan")
    assert content_words("a 30-day window.") == content_words("The window: 30 days")


def test_each_chunk_is_indexed_once_and_the_task_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    ev = TaskEvidence()
    assert ev.add("doc-1", REFUNDS) > 0
    assert ev.add("doc-1", REFUNDS) == 0  # the same chunk from a reworded search
    assert ev.add("", COBALT) > 0 and ev.add("", COBALT) == 0  # no id: by its text
    monkeypatch.setattr(grounding, "MAX_CHUNKS", 3)
    assert ev.add("doc-3", "Support answers tickets within four business hours.") > 0
    assert ev.add("doc-4", "Backups are kept for ninety days.") == 0
    monkeypatch.setattr(grounding, "MAX_POSTINGS", ev.postings + 2)
    monkeypatch.setattr(grounding, "MAX_CHUNKS", 10)
    assert ev.add("doc-5", "Backups are kept for ninety days in three regions.") == 2
    assert ev.postings == grounding.MAX_POSTINGS


def test_an_answer_is_read_within_its_bounds(evidence: TaskEvidence) -> None:
    claim = "Annual plans are refundable within 30 days of purchase. "
    g = evidence.ground(claim * 1000)
    assert g.claims == grounding.MAX_CLAIMS and g.supported == grounding.MAX_CLAIMS
    assert len(claims("x " * grounding.MAX_ANSWER_CHARS + claim)) == 0  # past the cap: unread


def test_a_hostile_answer_stays_within_its_bounds(evidence: TaskEvidence) -> None:
    """Worst cases an answer can bring: thousands of citations, one endless sentence, nested brackets."""
    cited = claims("Annual plans are refundable within 30 days " + "[doc-1]" * 5000 + ".")
    assert len(cited) == 1 and len(cited[0].cited) == grounding.MAX_CITATIONS
    assert len(claims("alpha beta gamma " * 100_000)) == 1  # one sentence, read up to MAX_ANSWER_CHARS
    g = evidence.ground("[[[[" * 2000 + "Annual plans are refundable within 30 days of purchase." + "]]]]" * 2000)
    assert g.claims <= grounding.MAX_CLAIMS


def test_a_huge_chunk_is_read_and_keyed_by_its_first_part_only() -> None:
    from ragtoll.proxy.core.evidence_track import fingerprint
    from ragtoll.proxy.model import Chunk

    text = REFUNDS + " filler" * 300_000  # ~2 MB, no id
    ((key, words),) = grounding.chunk_words([Chunk("", text)], [text])
    assert key == "fp:" + fingerprint(text[: grounding.MAX_CHUNK_CHARS])
    assert "refund" in words and len(words) < 30
