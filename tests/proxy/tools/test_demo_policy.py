"""The demo's scripted LLM policy and its text analysis, called directly (pure functions)."""

from __future__ import annotations

import orjson
from ragtoll.proxy.tools.demo import corpus, policy, services, text


def _transcript(
    question: str, *steps: tuple[str, dict[str, object], dict[str, object]]
) -> list[dict[str, object]]:
    msgs: list[dict[str, object]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": question},
    ]
    for i, (tool, args, result) in enumerate(steps):
        msgs.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{i}",
                        "type": "function",
                        "function": {"name": tool, "arguments": orjson.dumps(args).decode()},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": orjson.dumps(result).decode()})
    return msgs


def _chunks(query: str, groups: tuple[str, ...] = ("public", "staff")) -> dict[str, object]:
    index = corpus.Index(corpus.load_corpus())
    return {"chunks": [{"id": c.id, "text": c.text, "score": s} for c, s in index.search(query, groups, 6)]}


def test_analyzer_keeps_meaning_and_drops_form() -> None:
    assert text.terms("How long is the refund period for yearly plans?") == [
        "refund",
        "window",
        "annual",
        "plan",
    ]
    assert text.terms("API keys expire after 180 days") == ["api", "key", "expir", "after", "180", "day"]
    assert (
        text.overlap("refund window annual plans", "The refund window for monthly plans is 7 days.")[0]
        == 0.75
    )


def test_first_step_searches_then_reranks_what_it_found() -> None:
    q = "What is the refund window for annual plans?"
    assert policy.decide(_transcript(q)) == policy.Action("retrieve", {"query": q, "top_k": 6})
    found = _chunks(q)
    action = policy.decide(_transcript(q, ("retrieve", {"query": q}, found)))
    assert action.tool == "rerank" and action.arguments["ids"] == [c["id"] for c in found["chunks"]]  # type: ignore[index]


def test_it_corroborates_an_answer_it_has_then_answers_from_evidence() -> None:
    q = "What is the refund window for annual plans?"
    steps = [("retrieve", {"query": q}, _chunks(q)), ("rerank", {"query": q}, {"ranked": []})]
    action = policy.decide(_transcript(q, *steps))
    assert action == policy.Action("retrieve", {"query": "refund window annual plans", "top_k": 6})
    steps += [
        ("retrieve", action.arguments, _chunks(q)),
        ("rerank", {}, {"ranked": []}),
        ("retrieve", {"query": q}, _chunks(q)),
        ("rerank", {}, {"ranked": []}),
    ]
    final = policy.decide(_transcript(q, *steps))
    assert (
        final.answer
        == "The refund window for annual plans is 30 days from the renewal date. [billing-policy#1]"
    )


def test_a_budget_error_makes_it_answer_with_what_it_has() -> None:
    q = "What is the refund window for annual plans?"
    steps = [
        ("retrieve", {"query": q}, _chunks(q)),
        ("rerank", {"query": q}, {"ranked": []}),
        ("retrieve", {"query": "refund window annual plans"}, {"error": "HTTP 429: budget exhausted"}),
    ]
    assert policy.decide(_transcript(q, *steps)).answer.startswith(
        "The refund window for annual plans is 30 days"
    )  # type: ignore[union-attr]
    unanswered = [("retrieve", {"query": q}, {"error": "HTTP 429: budget exhausted: max_steps"})]
    answer = policy.decide(_transcript(q, *unanswered)).answer
    assert answer is not None and answer.startswith(policy.ABSTAIN) and "max_steps" in answer


def test_two_hop_questions_ask_about_what_the_first_hop_named() -> None:
    q = "Which team owns Relay, and who leads it?"
    first = "Which team owns Relay?"
    assert policy.decide(_transcript(q)).arguments["query"] == first
    steps = [("retrieve", {"query": first}, _chunks(first)), ("rerank", {}, {"ranked": []})]
    assert policy.decide(_transcript(q, *steps)).arguments["query"] == "who leads Messaging?"
    assert (
        policy.bridge("Cobalt is owned by the Security Engineering team.", "Which team owns Cobalt?")
        == "Security Engineering"
    )


def test_without_access_it_abstains_instead_of_guessing() -> None:
    q = "Who is the escalation contact for Vault?"
    steps: list[tuple[str, dict[str, object], dict[str, object]]] = []
    for query in (q, "escalation contact Vault", "escalation contact Vault details"):
        steps += [("retrieve", {"query": query}, _chunks(query, ("public",))), ("rerank", {}, {"ranked": []})]
    assert policy.decide(_transcript(q, *steps)).answer == policy.ABSTAIN


def test_final_call_without_tools_forces_an_answer() -> None:
    q = "Investigate how the revenue of Northwind developed before 1990."
    steps = [("retrieve", {"query": q}, _chunks(q))]
    assert policy.decide(_transcript(q, *steps)).tool == "rerank"
    assert policy.decide(_transcript(q, *steps), final=True).answer == policy.ABSTAIN


def test_rerank_scores_coverage_of_the_query() -> None:
    good = services.rerank_score(
        "refund window annual plans", "The refund window for annual plans is 30 days."
    )
    near = services.rerank_score(
        "refund window annual plans", "The refund window for monthly plans is 7 days."
    )
    assert good > near > 0
