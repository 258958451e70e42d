"""Progress verdicts: reworded queries that bring back what the task has are fruitless; a new hop is fruitful."""

from __future__ import annotations

import pytest
from ragtoll.proxy.core import progress
from ragtoll.proxy.core.progress import ProgressRules, judge_rerank, judge_retrieval, lexical_similarity
from ragtoll.proxy.model import Chunk

RULES = ProgressRules()


def results(*ids: str, scores: bool = True) -> list[Chunk]:
    return [Chunk(id=i, text=f"text of {i}", score=(0.9 - 0.05 * n) if scores else None) for n, i in enumerate(ids)]


def judge(chunks: list[Chunk] | None, seen: set[str], query: str, earlier: list[str]) -> progress.Verdict:
    return judge_retrieval(chunks, seen, query, lexical_similarity(query, earlier), RULES.lexical_similarity, RULES)


def test_first_retrieval_is_fruitful() -> None:
    v = judge(results("a", "b", "c", "d"), set(), "What is the refund window for annual plans?", [])
    assert v.fruitful is True and v.reason == progress.NEW_TOP and v.new_top == 3 and v.top == 3


def test_reworded_query_with_a_new_tail_is_fruitless() -> None:
    """The runaway's shape: the same question in other words; the top is what the task has, the tail is new."""
    seen = {"a", "b", "c", "d"}
    earlier = ["What is the refund window for annual plans?"]
    v = judge(results("a", "b", "c", "x", "y", "z"), seen, "refund window annual plans exact", earlier)
    assert v.fruitful is False and v.reason == progress.REWORDED
    assert v.similarity >= RULES.lexical_similarity and v.similar_to == earlier[0]
    assert v.new_top == 0


def test_reworded_query_with_one_new_result_low_in_the_top_is_fruitless() -> None:
    seen = {"a", "b", "d"}
    v = judge(results("a", "b", "x", "d"), seen, "annual plans refund window",
              ["What is the refund window for annual plans?"])
    assert v.new_top == 1 and v.fruitful is False and v.reason == progress.REWORDED


def test_new_hop_is_fruitful() -> None:
    """A multi-hop agent's second hop names what the first found: a different query, new results on top."""
    seen = {"svc-1", "svc-2", "svc-3"}
    earlier = ["Which service stores invoices?"]
    v = judge(results("team-7", "svc-1", "team-2"), seen, "Which team owns Ledger?", earlier)
    assert v.fruitful is True and v.reason == progress.NEW_TOP
    assert v.similarity < RULES.lexical_similarity


def test_a_new_query_whose_top_is_all_seen_is_fruitless() -> None:
    v = judge(results("a", "b", "c", "new-tail"), {"a", "b", "c"}, "Who leads Data Platform?", ["parental leave weeks"])
    assert v.fruitful is False and v.reason == progress.TOP_SEEN


def test_exact_repeat_and_empty_and_unread() -> None:
    q = "What is the refund window?"
    assert judge(results("a"), {"a"}, "what is the REFUND window", [q]).reason == progress.REPEATED
    empty = judge([], set(), q, [])
    assert empty.fruitful is False and empty.reason == progress.NO_RESULTS
    unread = judge(None, set(), q, [])
    assert unread.fruitful is None and unread.reason == progress.UNREAD


def test_reworded_query_bringing_a_new_best_result_is_fruitful() -> None:
    v = judge(results("x", "a", "b"), {"a", "b"}, "refund window annual plans", ["What is the refund window for annual plans?"])
    assert v.fruitful is True and v.reason == progress.REWORDED_NEW_TOP


@pytest.mark.parametrize("scores", [[0.9, 0.8, 0.1], [0.1, 0.2, 3.0]])  # similarity falling, distance rising
def test_a_new_result_that_scored_far_behind_counts_little(scores: list[float]) -> None:
    chunks = [Chunk(id=i, score=s) for i, s in zip(("a", "b", "x"), scores)]
    nov, new, n = progress.novelty(chunks, {"a", "b"}, 3)
    flat, _, _ = progress.novelty([Chunk(id=c.id) for c in chunks], {"a", "b"}, 3)
    assert (new, n) == (1, 3) and nov < flat / 2


def test_chunks_without_ids_are_known_by_their_text() -> None:
    seen = {progress.chunk_key(Chunk(id="", text="Refunds are possible within 30 days."))}
    chunks = [Chunk(id="", text="refunds are possible   within 30 days.")]
    assert progress.novelty(chunks, seen, 3)[1] == 0


def test_rerank_of_documents_already_ranked_is_fruitless() -> None:
    first, fps = judge_rerank(["alpha doc", "beta doc"], set())
    assert first.fruitful is True and first.reason == progress.RERANK_NEW
    again, _ = judge_rerank(["Beta doc", "alpha  doc"], fps)
    assert again.fruitful is False and again.reason == progress.RERANK_SEEN
    more, _ = judge_rerank(["alpha doc", "gamma doc"], fps)
    assert more.fruitful is True and more.new_top == 1


def test_repeated_tool_calls_compare_arguments_as_json() -> None:
    calls = [("retrieve", '{"query": "a", "top_k": 5}'), ("retrieve", '{"top_k":5,"query":"a"}'),
             ("retrieve", '{"query": "b"}'), ("rerank", "not json")]
    assert progress.repeated_tool_calls(calls) == 1


def test_verdict_attributes_say_why() -> None:
    v = judge(results("a", "b", "c"), {"a", "b", "c"}, "refund window", ["What is the refund window?"])
    attrs = v.attributes()
    assert attrs["reason"] == progress.REWORDED and attrs["fruitful"] is False
    assert attrs["similar_to"] == "What is the refund window?" and attrs["new_top"] == 0


def test_a_query_asks_for_the_question_or_what_its_evidence_named() -> None:
    """Novelty is not progress: a new, unrelated question brings new results (fruitful) but is not
    evidence for the task's question; the next hop of a multi-hop question, naming what the last
    hop found, is."""
    from ragtoll.proxy.core.progress import ProgressRules, RecentQueries
    from ragtoll.proxy.model import Chunk

    q = RecentQueries()
    q.asked("t", "Which office does the lead of the team that owns the invoices service work from?")
    rules = ProgressRules()
    hop1 = q.judge("t", [Chunk("a", "The invoices service is owned by team Atlas.", 0.9)], set(), "invoices service owner", rules)
    hop2 = q.judge("t", [Chunk("b", "Team Atlas is led by Priya Raman.", 0.9)], {"a"}, "who leads team atlas", rules)
    hop3 = q.judge("t", [Chunk("c", "Priya Raman works from the Lisbon office.", 0.9)], {"a", "b"}, "priya raman", rules)
    unrelated = q.judge("t", [Chunk("d", "The carnival began in 1723.", 0.9)], {"a", "b", "c"},
                        "history of the rio carnival", rules)
    assert [v.evidence for v in (hop1, hop2, hop3)] == [True, True, True]
    assert unrelated.fruitful is True and unrelated.for_question is False and not unrelated.evidence


def test_what_a_task_keeps_of_its_queries_is_bounded_however_long_they_are() -> None:
    """40 searches of 4,000 characters each: the task keeps its last MAX_QUERIES, each as SHOWN_CHARS
    of text, a hash and MAX_QUERY_WORDS words; a repeat is still known as one; all is freed at the end."""
    recent = progress.RecentQueries()
    words = [f"w{i:05d}x" for i in range(20_000)]
    queries = [" ".join(words[i * 500:(i + 1) * 500]) for i in range(40)]
    for q in queries:
        recent.judge("t", [Chunk(id="a", text="a")], set(), q, RULES)
    kept = recent._tasks["t"].queries
    assert len(kept) == progress.MAX_QUERIES
    assert all(len(shown) <= progress.SHOWN_CHARS and len(key) == 32 and len(ws) <= progress.MAX_QUERY_WORDS
               for shown, key, ws in kept)
    again = recent.judge("t", [Chunk(id="a", text="a")], {"a"}, queries[-1], RULES)
    assert again.reason == progress.REPEATED
    recent.forget("t")
    assert "t" not in recent._tasks
