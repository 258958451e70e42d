"""The conversation of an untracked call (core/conversation.py): fingerprint, anchor, tool-call match."""

from __future__ import annotations

import orjson
from ragtoll.proxy.core import conversation as cv

TOOLS = [{"type": "function", "function": {"name": "retrieve", "parameters": {"type": "object"}}}]


def chat(*messages: dict, tools: list | None = TOOLS) -> bytes:
    return orjson.dumps({"model": "gpt-4o", "messages": list(messages), "tools": tools})


SYSTEM = {"role": "system", "content": "You answer from the documents."}
ASK = {"role": "user", "content": "What is the refund window?"}


def turn(call_id: str, query: str) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "retrieve", "arguments": orjson.dumps({"query": query}).decode()},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "[]"},
    ]


def test_a_loop_keeps_its_fingerprint_and_names_its_first_answer() -> None:
    first = cv.thread_of("chat", chat(SYSTEM, ASK), "caller-1")
    later = cv.thread_of(
        "chat", chat(SYSTEM, ASK, *turn("call_a", "refund"), *turn("call_b", "window")), "caller-1"
    )
    assert first is not None and later is not None
    assert first.fingerprint == later.fingerprint
    assert first.anchor is None  # the loop's first call
    assert later.anchor == cv.call_anchor("call_a")  # its first answer, not its latest


def test_what_tells_conversations_apart() -> None:
    base = cv.thread_of("chat", chat(SYSTEM, ASK), "caller-1")
    other_question = cv.thread_of("chat", chat(SYSTEM, {"role": "user", "content": "Who signs?"}), "caller-1")
    other_caller = cv.thread_of("chat", chat(SYSTEM, ASK), "caller-2")
    other_tools = cv.thread_of("chat", chat(SYSTEM, ASK, tools=[]), "caller-1")
    other_system = cv.thread_of("chat", chat({"role": "system", "content": "Be brief."}, ASK), "caller-1")
    prints = {t.fingerprint for t in (base, other_question, other_caller, other_tools, other_system) if t}
    assert len(prints) == 5


def test_anthropic_messages_and_responses_api() -> None:
    body = orjson.dumps(
        {
            "model": "claude",
            "system": "Answer.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Q?"}]},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "toolu_1", "name": "retrieve", "input": {}}],
                },
            ],
        }
    )
    t = cv.thread_of("chat", body, "c")
    assert t is not None and t.anchor == cv.call_anchor("toolu_1")
    resp = cv.thread_of(
        "chat", orjson.dumps({"model": "gpt-4o", "input": "Q?", "previous_response_id": "resp_9"}), "c"
    )
    assert resp is not None and resp.previous == "resp_9"
    named = cv.thread_of(
        "chat", orjson.dumps({"model": "gpt-4o", "input": [], "conversation": {"id": "conv_1"}}), "c"
    )
    assert named is not None and named.named == "conv_1"
    items = orjson.dumps(
        {
            "model": "gpt-4o",
            "instructions": "x",
            "input": [
                {"role": "user", "content": "Q?"},
                {"type": "function_call", "call_id": "fc_1", "name": "r", "arguments": "{}"},
            ],
        }
    )
    t2 = cv.thread_of("chat", items, "c")
    assert t2 is not None and t2.anchor == cv.call_anchor("fc_1")


def test_nothing_to_go_by_is_none() -> None:
    assert cv.thread_of("chat", b"not json", "c") is None
    assert cv.thread_of("chat", orjson.dumps([1, 2]), "c") is None
    assert cv.thread_of("chat", chat(SYSTEM), "c") is None  # no user message
    assert cv.thread_of("chat", b"", "c") is None


def test_a_search_matches_the_oldest_open_tool_call_it_answers() -> None:
    older = cv.Pending("t-old", tuple(cv.argument_texts('{"query": "Refund  Window"}')), "k1")
    newer = cv.Pending("t-new", tuple(cv.argument_texts('{"query": "refund window", "top_k": 5}')), "k2")
    other = cv.Pending("t-other", tuple(cv.argument_texts('{"query": "who signs the contract"}')), "k3")
    assert cv.match_pending("refund window", [newer, other, older]) == cv.Match("t-old", "exact", 1.0, "k1:0")
    assert cv.match_pending("refund window", [newer, other, older], {"k1:0"}) == cv.Match(
        "t-new", "exact", 1.0, "k2:0"
    )
    assert cv.match_pending("who signs", [newer, other]) == cv.Match("t-other", "contained", 0.7, "k3:0")
    assert cv.match_pending("who", [other]) is None  # too short to match by containment
    assert cv.match_pending("unrelated", [newer, other]) is None
    assert cv.match_pending(None, [newer]) is None
    assert cv.argument_texts("not json at all") == ["not json at all"]


def test_identical_searches_of_identical_agents_each_find_their_own() -> None:
    """Two users' agents ask the same search at once: the first search answers the older
    conversation's tool call (its answer came first), the second the other's."""
    a = cv.Pending("t-a", ("refund window",), "ka")
    b = cv.Pending("t-b", ("refund window",), "kb")
    first = cv.match_pending("refund window", [b, a])
    assert first is not None and first.task_id == "t-a"
    second = cv.match_pending("refund window", [b, a], {first.token})
    assert second is not None and second.task_id == "t-b"
    again = cv.match_pending("refund window", [b, a], {first.token, second.token})  # a repeated search
    assert again is not None and again.task_id == "t-b"


def test_what_is_kept_of_an_answer_is_bounded() -> None:
    """A hostile model answer (huge arguments, thousands of values) keeps at most MAX_TEXTS texts
    of at most MAX_TEXT characters; a long query still matches its own (cut) argument."""
    long_query = "refund " * 500
    texts = cv.argument_texts(orjson.dumps({"query": long_query, "more": ["x" * 10_000] * 1000}).decode())
    assert len(texts) <= cv.MAX_TEXTS and all(len(t) <= cv.MAX_TEXT for t in texts)
    found = cv.match_pending(
        long_query, [cv.Pending("t", tuple(cv.argument_texts(orjson.dumps({"q": long_query}).decode())), "k")]
    )
    assert found is not None and found.rule == "exact"
