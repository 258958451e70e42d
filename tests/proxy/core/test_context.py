"""The context rewrites (core/context.py): prefix stability over random conversations, no chunk
text lost to a reference the model never saw, and Anthropic's breakpoint limit."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragtoll.proxy.core import context

MIN = 64
POOL = [f"chunk {i}: " + " ".join(f"word{i}x{j}" for j in range(20 + 3 * i)) for i in range(8)]
REF = re.compile(r"\[same text as (?:chunk (\S+)|a chunk) in (message|input item) (\d+); not repeated\]")


def _tool(ids: list[int], pretty: bool) -> str:
    out = {"chunks": [{"id": f"c{i}", "text": POOL[i], "score": 1.0 / (1 + i)} for i in ids]}
    return orjson.dumps(out, option=orjson.OPT_INDENT_2 if pretty else 0).decode()


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    """A system prompt, a question, then turns: an assistant tool call, one or two tool results
    (each some chunks of a small pool, so repeats are common), sometimes plain text or a
    non-JSON tool result."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "preamble " * 30},
                                      {"role": "user", "content": draw(st.text(max_size=40))}]
    for turn in range(draw(st.integers(0, 7))):
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call{turn}", "type": "function", "function": {"name": "retrieve", "arguments": "{}"}}]})
        for _ in range(draw(st.integers(1, 2))):
            kind = draw(st.sampled_from(["json", "json", "json", "plain", "pretty"]))
            if kind == "plain":
                content = POOL[draw(st.integers(0, 7))]  # not JSON: never touched
            else:
                content = _tool(draw(st.lists(st.integers(0, 7), max_size=5)), kind == "pretty")
            messages.append({"role": "tool", "tool_call_id": f"call{turn}", "content": content})
    return messages


def _rewritten(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], context.Rewrite]:
    doc = {"model": "gpt-4o", "messages": copy.deepcopy(messages)}
    rw = context.Rewrite()
    context.openai_evidence_once(doc, rw, MIN)
    return doc["messages"], rw


def _texts(message: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(id, text) of the chunks a message carries in full."""
    try:
        doc = orjson.loads(message.get("content") or "")
    except orjson.JSONDecodeError:
        return []
    return [(c.get("id"), c["text"]) for c in (doc.get("chunks") or []) if not REF.fullmatch(c["text"])] \
        if isinstance(doc, dict) else []


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(conversations())
def test_each_rewrite_keeps_the_prefix_byte_identical(messages: list[dict[str, Any]]) -> None:
    """The conversation grows a message at a time, as an agent loop sends it: what was sent for
    the shorter conversation is, byte for byte, the start of what is sent for the longer one (so
    a provider's prefix cache keeps matching), and only tool results ever change."""
    sent_before: bytes | None = None
    for n in range(1, len(messages) + 1):
        out, _rw = _rewritten(messages[:n])
        sent = orjson.dumps(out)
        if sent_before is not None:
            assert sent.startswith(sent_before[:-1])  # the array's closing bracket aside
        sent_before = sent
        for original, new in zip(messages[:n], out, strict=True):
            if original.get("role") != "tool":
                assert new == original


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(conversations())
def test_no_chunk_text_is_lost_to_a_reference_the_model_never_saw(messages: list[dict[str, Any]]) -> None:
    """Every chunk text of the conversation reaches the model in full at least once, and every
    reference names a chunk and a message before it that holds that very text in full."""
    out, rw = _rewritten(messages)
    full = [_texts(m) for m in out]
    sent_texts = {text for pieces in full for _cid, text in pieces} | {
        m["content"] for m in out if m.get("role") == "tool"}
    original = {text for m in messages for _cid, text in _texts(m)}
    assert original <= sent_texts
    refs = 0
    for i, m in enumerate(out):
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        for match in REF.finditer(content):
            refs += 1
            cid, where = match.group(1), int(match.group(3))
            assert where <= i
            orig_chunk = next(c for c in orjson.loads(messages[i]["content"])["chunks"] if c["id"] == cid)
            assert (cid, orig_chunk["text"]) in full[where]
    assert refs == rw.chunks_referenced


def test_a_repeated_chunk_becomes_a_reference_to_where_it_was_sent() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": "a", "content": _tool([1, 2], False)},
                {"role": "tool", "tool_call_id": "b", "content": _tool([2, 3], False)}]
    out, rw = _rewritten(messages)
    assert out[1] == messages[1]
    chunks = orjson.loads(out[2]["content"])["chunks"]
    assert chunks[0] == {"id": "c2", "text": "[same text as chunk c2 in message 1; not repeated]", "score": 1 / 3}
    assert chunks[1]["text"] == POOL[3]
    assert rw.chunks_referenced == 1 and rw.referenced_ids == ["c2"] and rw.chars_saved > 0


def test_a_short_or_edited_text_is_never_replaced() -> None:
    """A text under the minimum, or one that differs by a character from the earlier copy, is sent as it is."""
    short = orjson.dumps({"chunks": [{"id": "s", "text": "tiny"}]}).decode()
    edited = orjson.dumps({"chunks": [{"id": "c1", "text": POOL[1] + "."}]}).decode()
    messages = [{"role": "tool", "content": short}, {"role": "tool", "content": _tool([1], False)},
                {"role": "tool", "content": short}, {"role": "tool", "content": edited}]
    out, rw = _rewritten(messages)
    assert out == messages and rw.chunks_referenced == 0


def test_responses_api_function_call_outputs() -> None:
    doc = {"model": "gpt-4o", "input": [
        {"type": "function_call_output", "call_id": "a", "output": _tool([4], False)},
        {"type": "function_call_output", "call_id": "b", "output": _tool([4, 5], False)}]}
    rw = context.Rewrite()
    context.openai_evidence_once(doc, rw, MIN)
    assert "[same text as chunk c4 in input item 0; not repeated]" in doc["input"][1]["output"]
    assert rw.chunks_referenced == 1


def test_anthropic_tool_results_string_and_text_blocks() -> None:
    first = _tool([6], False)
    doc = {"messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": first}]},
        {"role": "assistant", "content": [{"type": "text", "text": "more"}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b",
                                      "content": [{"type": "text", "text": _tool([6, 7], False)}]}]}]}
    rw = context.Rewrite()
    context.anthropic_evidence_once(doc, rw, MIN)
    assert doc["messages"][0]["content"][0]["content"] == first
    later = orjson.loads(doc["messages"][2]["content"][0]["content"][0]["text"])["chunks"]
    assert later[0]["text"] == "[same text as chunk c6 in message 0; not repeated]" and later[1]["text"] == POOL[7]


# --- prompt_cache_key -----------------------------------------------------------------------------


def test_cache_key_is_stable_hashed_and_never_overrides_the_clients() -> None:
    a = context.cache_key("system", task_id="t1", caller_id="alice", system="S")
    assert a == context.cache_key("system", task_id="t2", caller_id="alice", system="S")  # per agent, not task
    assert a != context.cache_key("system", task_id="t1", caller_id="bob", system="S")
    assert a != context.cache_key("system", task_id="t1", caller_id="alice", system="S2")
    t = context.cache_key("task", task_id="t1", caller_id="alice", system="S")
    assert t != context.cache_key("task", task_id="t2", caller_id="alice", system="S")
    assert "alice" not in a and "t1" not in t
    doc: dict[str, Any] = {"prompt_cache_key": "mine"}
    assert not context.set_cache_key(doc, a) and doc["prompt_cache_key"] == "mine"
    assert context.openai_system({"messages": [{"role": "developer", "content": "D"}]}) == "D"
    assert context.openai_system({"instructions": "I", "input": "x"}) == "I"


# --- Anthropic breakpoints --------------------------------------------------------------------------


def _positions(doc: dict[str, Any]) -> list[tuple[str, int, int]]:
    out = [("tools", i, 0) for i, t in enumerate(doc.get("tools") or []) if "cache_control" in t]
    if isinstance(doc.get("system"), list):
        out += [("system", i, 0) for i, b in enumerate(doc["system"]) if "cache_control" in b]
    for i, m in enumerate(doc.get("messages") or []):
        if isinstance(m["content"], list):
            out += [("messages", i, j) for j, b in enumerate(m["content"]) if "cache_control" in b]
    return out


@st.composite
def anthropic_requests(draw: Any) -> dict[str, Any]:
    big = "x" * draw(st.sampled_from([10, 3000, 9000]))
    marked = st.booleans()
    doc: dict[str, Any] = {"model": draw(st.sampled_from(["claude-sonnet-4-5", "claude-3-5-haiku", "claude-haiku-4-5"]))}
    if draw(st.booleans()):
        doc["tools"] = [{"name": f"t{i}", "description": big, "input_schema": {},
                         **({"cache_control": {"type": "ephemeral"}} if draw(marked) else {})}
                        for i in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        doc["system"] = big if draw(st.booleans()) else [
            {"type": "text", "text": big, **({"cache_control": {"type": "ephemeral"}} if draw(marked) else {})}
            for _ in range(draw(st.integers(1, 2)))]
    messages = []
    for i in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            content: Any = big
        else:
            content = [{"type": draw(st.sampled_from(["text", "text", "thinking"])), "text": big, "thinking": big,
                        **({"cache_control": {"type": "ephemeral"}} if draw(marked) else {})}
                       for _ in range(draw(st.integers(1, 2)))]
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
    doc["messages"] = messages
    return doc


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(anthropic_requests())
def test_cache_control_never_exceeds_the_providers_limit_nor_moves_the_clients(doc: dict[str, Any]) -> None:
    before = copy.deepcopy(doc)
    client = _positions(doc)
    added, counted = context.add_breakpoints(doc, doc["model"])
    after = _positions(doc)
    assert counted == len(client)
    assert len(after) == len(client) + added
    assert len(after) <= context.ANTHROPIC_MAX_BREAKPOINTS or added == 0  # a client past the limit: its problem, not ours
    assert set(client) <= set(after)  # the client's stay where they were
    for kind, i, j in set(after) - set(client):  # and none of ragtoll's sits on a block that cannot take one
        block = doc[kind][i] if kind != "messages" else doc["messages"][i]["content"][j]
        assert block.get("type") not in ("thinking", "redacted_thinking")
    if added == 0:
        assert doc == before


def test_breakpoints_close_the_conversation_and_the_system_prompt() -> None:
    long = "word " * 1200  # ~6000 characters: past 1024 tokens at 4 characters a token
    doc = {"model": "claude-sonnet-4-5", "system": long, "tools": [{"name": "retrieve", "input_schema": {}}],
           "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
               {"type": "tool_use", "id": "a", "name": "retrieve", "input": {}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r"}]}]}
    assert context.add_breakpoints(doc, doc["model"]) == (2, 0)
    assert doc["messages"][2]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert doc["system"] == [{"type": "text", "text": long, "cache_control": {"type": "ephemeral"}}]
    assert "cache_control" not in doc["tools"][0]  # the system breakpoint already covers the tools
    assert doc["messages"][0] == {"role": "user", "content": "q"}


def test_no_breakpoint_below_the_minimum_cacheable_length() -> None:
    doc = {"model": "claude-3-5-haiku", "system": "word " * 1000,  # ~1250 tokens: under Haiku's 2048
           "messages": [{"role": "user", "content": "q"}]}
    assert context.add_breakpoints(doc, doc["model"]) == (0, 0)
    assert context.anthropic_min_tokens("claude-sonnet-4-5") == 1024
    assert context.anthropic_min_tokens("claude-3-5-haiku-20241022") == 2048
    assert context.anthropic_min_tokens("claude-haiku-4-5") == 4096


# --- adaptive depth ---------------------------------------------------------------------------------


def test_depth_cuts_at_the_largest_drop_or_under_the_floor() -> None:
    assert context.depth([0.9, 0.85, 0.3, 0.25, 0.2], gap=0.3, floor=0.0) == (2, "gap")
    assert context.depth([0.9, 0.85, 0.8, 0.75], gap=0.3, floor=0.0) == (4, "")  # no drop big enough
    assert context.depth([1.0, 0.7, 0.45, 0.4], gap=0.0, floor=0.5) == (2, "floor")
    assert context.depth([1.0, 0.1], gap=0.3, floor=0.0, min_keep=2) == (2, "")


def test_depth_never_cuts_results_it_cannot_rank() -> None:
    assert context.depth([0.2, 0.5, 0.9], gap=0.1, floor=0.5) == (3, "")  # distances: lower is better
    assert context.depth([0.9, None, 0.1], gap=0.1, floor=0.5) == (3, "")
    assert context.depth([0.0, 0.0], gap=0.1, floor=0.5) == (2, "")
    assert context.depth([], gap=0.1, floor=0.5) == (0, "")


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=20),
       st.floats(0, 1), st.floats(0, 1), st.integers(1, 3))
def test_depth_keeps_a_ranked_prefix_of_at_least_min_keep(scores: list[float], gap: float, floor: float,
                                                          min_keep: int) -> None:
    ranked = sorted(scores, reverse=True)
    keep, reason = context.depth(ranked, gap=gap, floor=floor, min_keep=min_keep)
    assert min(min_keep, len(ranked)) <= keep <= len(ranked)
    assert (keep < len(ranked)) == (reason != "")


def test_hostile_tool_results_pass_unchanged() -> None:
    """Nesting past what a JSON parser takes, odd encodings and non-object results: sent as they came."""
    deep = "[" * 5000 + "]" * 5000
    odd = '{"chunks": [{"id": "x", "text": "\\ud800 lone surrogate ' + "y" * 300 + '"}]}'
    messages = [{"role": "tool", "content": c} for c in (deep, deep, odd, odd, "[1, 2, 3]" + " " * 300, "null" * 100)]
    out, rw = _rewritten(messages)
    assert out[:2] == messages[:2] and out[4:] == messages[4:]
    assert rw.chunks_referenced <= 1
