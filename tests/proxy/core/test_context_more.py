"""The context rewrites added later (core/context.py): judging a weak first pass, the budget note
(always the prompt's last part, never in a prefix the client sends again) and OpenAI's
prompt_cache_breakpoint at the end of the system prefix."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from ragtoll.proxy.core import context
from test_context import MIN, conversations

LONG = "You answer questions about Northwind Cloud from its documents. " * 80  # over 1,024 tokens
NOTE = context.budget_note({"max_steps": 3, "max_retrieval_calls": 2, "max_cost_usd": 0.0123})


def test_weak_first_pass_low_top_score_or_near_tie() -> None:
    assert context.weak([0.2, 0.1], floor=0.5, margin=0.0) == "low"
    assert context.weak([0.9, 0.88, 0.5], floor=0.0, margin=0.05) == "tie"
    assert context.weak([0.9, 0.5], floor=0.5, margin=0.05) == ""
    assert context.weak([], floor=0.5, margin=0.05) == "low"
    assert context.weak([], floor=0.0, margin=0.05) == ""


def test_weak_never_judges_results_it_cannot_rank() -> None:
    assert context.weak([0.9, None], floor=5.0, margin=0.5) == ""  # a result without a score
    assert context.weak([0.1, 0.2, 0.3], floor=5.0, margin=0.5) == ""  # distances: rising with rank


def test_the_note_names_what_is_left_or_is_not_written() -> None:
    assert NOTE is not None and "3 model calls, 2 searches, $0.0123" in NOTE
    assert "1 search" in (context.budget_note({"max_retrieval_calls": 1}) or "")
    assert context.budget_note({"max_latency_ms": 900}) is None  # nothing the note names
    assert context.budget_note({}) is None


def test_the_note_goes_last_in_each_format() -> None:
    chat: dict[str, Any] = {"messages": [{"role": "user", "content": "q"}]}
    assert context.append_note(chat, "openai", "n") and chat["messages"][-1] == {"role": "user", "content": "n"}
    responses: dict[str, Any] = {"input": [{"role": "user", "content": "q"}]}
    assert context.append_note(responses, "openai", "n") and responses["input"][-1]["content"] == "n"
    claude: dict[str, Any] = {"messages": [{"role": "user", "content": "q"}]}
    assert context.append_note(claude, "anthropic", "n")
    assert claude["messages"] == [{"role": "user", "content": [{"type": "text", "text": "q"},
                                                                {"type": "text", "text": "n"}]}]


def test_no_note_where_it_would_be_stored_or_misplaced() -> None:
    """A Responses call chained to a stored one would keep the note in the server's conversation;
    an Anthropic request ending on an assistant turn (a prefill) has no user turn to end."""
    chained: dict[str, Any] = {"input": [{"role": "user", "content": "q"}], "previous_response_id": "resp_1"}
    assert not context.append_note(chained, "openai", "n") and len(chained["input"]) == 1
    prefill: dict[str, Any] = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A"}]}
    assert not context.append_note(copy.deepcopy(prefill), "anthropic", "n")
    assert not context.append_note({"input": "q"}, "openai", "n")


def _sent(messages: list[dict[str, Any]], note: bool) -> list[dict[str, Any]]:
    """What ragtoll sends for this conversation: evidence once, a breakpoint (gpt-5.6), the note."""
    doc = {"model": "gpt-5.6", "messages": copy.deepcopy(messages)}
    context.openai_evidence_once(doc, context.Rewrite(), MIN)
    context.add_openai_breakpoints(doc, min_tokens=64)
    if note:
        assert NOTE is not None and context.append_note(doc, "openai", NOTE)
    return doc["messages"]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(conversations())
def test_the_note_is_never_in_a_prefix_sent_again(messages: list[dict[str, Any]]) -> None:
    """The conversation grows a message at a time: each call ends with the note, and what the next
    call sends for the same messages is, byte for byte, what was sent before the note (the client
    resends its own messages, never ragtoll's note), so the cached prefix never holds it."""
    for n in range(1, len(messages)):
        now, later = _sent(messages[:n], True), _sent(messages[:n + 1], True)
        assert now[-1] == {"role": "user", "content": NOTE}
        assert orjson.dumps(later[:n]) == orjson.dumps(now[:-1]) == orjson.dumps(_sent(messages[:n], False))


def test_the_anthropic_note_sits_after_the_last_breakpoint() -> None:
    doc: dict[str, Any] = {"model": "claude-sonnet-4-5", "system": LONG, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x" * 100}]}]}
    context.add_breakpoints(doc, doc["model"])
    assert context.append_note(doc, "anthropic", "n")
    blocks = doc["messages"][-1]["content"]
    assert "cache_control" in blocks[0] and blocks[-1] == {"type": "text", "text": "n"}


def test_openai_breakpoint_closes_the_system_prefix_on_models_that_take_it() -> None:
    doc: dict[str, Any] = {"model": "gpt-5.6", "messages": [{"role": "system", "content": LONG},
                                                             {"role": "user", "content": "q"}]}
    assert context.add_openai_breakpoints(doc) == (1, 0)
    assert doc["messages"][0]["content"] == [{"type": "text", "text": LONG,
                                              "prompt_cache_breakpoint": {"mode": "explicit"}}]
    assert doc["messages"][1] == {"role": "user", "content": "q"}
    responses: dict[str, Any] = {"input": [{"role": "developer", "content": [{"type": "input_text", "text": LONG}]},
                                           {"role": "user", "content": "q"}]}
    assert context.add_openai_breakpoints(responses) == (1, 0)
    assert responses["input"][0]["content"][0]["prompt_cache_breakpoint"] == {"mode": "explicit"}
    assert context.takes_breakpoints("gpt-5.6-2026-07-01", ("gpt-5.6",))
    assert not context.takes_breakpoints("gpt-4.1", ("gpt-5.6",)) and not context.takes_breakpoints(None, ("",))


def test_openai_breakpoint_never_moves_the_clients_nor_marks_a_short_prefix() -> None:
    own = {"type": "text", "text": "q", "prompt_cache_breakpoint": {"mode": "explicit"}}
    doc: dict[str, Any] = {"messages": [{"role": "system", "content": LONG}, {"role": "user", "content": [own]}]}
    before = copy.deepcopy(doc)
    assert context.add_openai_breakpoints(doc) == (0, 1) and doc == before
    short: dict[str, Any] = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]}
    assert context.add_openai_breakpoints(short) == (0, 0)
    no_system: dict[str, Any] = {"messages": [{"role": "user", "content": LONG}]}
    assert context.add_openai_breakpoints(no_system) == (0, 0)
    image: dict[str, Any] = {"messages": [{"role": "system", "content": [{"type": "text", "text": LONG},
                                                                          {"type": "image_url", "image_url": {}}]}]}
    assert context.add_openai_breakpoints(image) == (0, 0)  # a part that is not text takes none from ragtoll


@settings(max_examples=50, deadline=None)
@given(conversations())
def test_openai_breakpoints_stay_within_the_limit(messages: list[dict[str, Any]]) -> None:
    sent = _sent(messages, True)
    marks = sum(1 for m in sent if isinstance(m.get("content"), list) for p in m["content"]
                if "prompt_cache_breakpoint" in p)
    assert marks <= 1 < context.OPENAI_MAX_BREAKPOINTS  # + the provider's implicit one: within 4


def _unmarked(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the model reads them: breakpoint markers off, one text part as its text."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = [{k: v for k, v in p.items() if k != "prompt_cache_breakpoint"} for p in content]
            if len(content) == 1 and content[0].get("type") == "text":
                content = content[0]["text"]
        out.append({**m, "content": content})
    return out


@settings(max_examples=50, deadline=None)
@given(conversations())
def test_with_explicit_breakpoints_the_note_follows_a_marked_conversation_end(messages: list[dict[str, Any]]) -> None:
    """On a model with explicit breakpoints the conversation's end is marked before the note, so
    the cache is written where the client's messages end; as with Anthropic's, the marker moves
    with the conversation and the content the model reads stays the same. Within OpenAI's 4 with
    the implicit breakpoint: the system prefix, the conversation end, the implicit one."""
    for n in range(1, len(messages) + 1):
        doc = {"model": "gpt-5.6", "messages": copy.deepcopy(messages[:n])}
        added, _ = context.add_openai_breakpoints(doc, min_tokens=64)
        added += context.mark_conversation_end(doc)
        assert NOTE is not None and context.append_note(doc, "openai", NOTE)
        sent = doc["messages"]
        marks = sum(1 for m in sent if isinstance(m.get("content"), list) for p in m["content"]
                    if "prompt_cache_breakpoint" in p)
        assert marks == added <= 2 and marks + 1 <= context.OPENAI_MAX_BREAKPOINTS
        if messages[n - 1]["role"] == "tool":
            assert "prompt_cache_breakpoint" in sent[-2]["content"][-1]
        assert _unmarked(sent[:-1]) == _unmarked(messages[:n])


def test_an_assistant_message_takes_no_breakpoint() -> None:
    doc: dict[str, Any] = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert context.mark_conversation_end(doc) == 0 and doc["messages"][-1] == {"role": "assistant", "content": "a"}
