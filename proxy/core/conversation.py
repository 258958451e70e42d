"""Which conversation an untracked call belongs to (DESIGN.md "Task identity": conversation).

Pure: a request body in, a `Thread` out; tool-call arguments in, a match out. No store, no clock.

An agent loop resends what stays fixed on every call: the system prompt, the first user message,
the tool set. Their hash, with the caller, is the conversation's *fingerprint*: the same question
asked by two users of one key has the same fingerprint, so the loop's later calls also name the
*anchor*: the first answer the model gave in it (its first tool call's id, which the API makes
unique, else the hash of its text). The first call of a loop has no anchor yet: the resolver
(request/conversation.py) opens a task for it and, when the answer arrives, files that answer's
anchor under the task, where the loop's later calls find it. The Responses API names its chain
instead: `previous_response_id` (the task of that response) or `conversation` (an id).

A search or rerank call carries none of this: it is matched to the conversation whose latest
answer asked for a tool call with these arguments (`match_pending`); a search that answers no tool
call and holds a loop's question (one made before the loop's first call) is found by `query_key`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

MAX_BODY_BYTES = 4 << 20  # a larger body is not fingerprinted (the caller's session stands)
_SPACE = re.compile(r"\s+")
MIN_CONTAINED = 8  # characters a query must have to match by containment (not exact)
MAX_TEXT = 200  # characters of one tool-call argument kept to match searches by (a query is shorter)
MAX_TEXTS = 8  # argument texts kept per answer (its tool calls' queries, ids...)


@dataclass(frozen=True, slots=True)
class Thread:
    """What an LLM call says about its conversation.

    `fingerprint`: the conversation's fixed part (with the caller). `anchor`: the first answer of
    the loop as the request repeats it (None: this is the loop's first call). `previous`: a
    Responses API `previous_response_id`; `named`: a Responses API `conversation` id."""

    fingerprint: str
    anchor: str | None = None
    previous: str | None = None
    named: str | None = None
    question: str = (
        ""  # the first user message's key (`query_key`): a search made before the loop's first call
    )


def _text(content: Any) -> str:
    """A message content as text: a string, or the text of its parts/blocks (images left out)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                t = part.get("text")
                if isinstance(t, str):
                    parts.append(t)
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def _tool_names(tools: Any) -> list[str]:
    names: list[str] = []
    if isinstance(tools, list):
        for tool in tools:
            if isinstance(tool, dict):
                fn = tool.get("function")
                name = fn.get("name") if isinstance(fn, dict) else tool.get("name", tool.get("type"))
                names.append(str(name))
    return sorted(names)


def text_anchor(text: str) -> str:
    """The anchor of an answer without tool calls: its opening text (the request repeats it whole)."""
    return "t:" + xxhash.xxh3_64_hexdigest(_SPACE.sub(" ", text[:512]).strip().encode())


def call_anchor(call_id: str) -> str:
    return "c:" + call_id[:128]


def _chat_anchor(messages: Sequence[Any]) -> str | None:
    """The first assistant turn of an OpenAI chat or Anthropic messages list."""
    for m in messages:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        for tc in m.get("tool_calls") or []:  # OpenAI
            if isinstance(tc, dict) and isinstance(tc.get("id"), str) and tc["id"]:
                return call_anchor(tc["id"])
        content = m.get("content")
        if isinstance(content, list):  # Anthropic: tool_use blocks
            for block in content:
                if (
                    isinstance(block, dict)
                    and block.get("type") == "tool_use"
                    and isinstance(block.get("id"), str)
                ):
                    return call_anchor(block["id"])
        return text_anchor(_text(content))
    return None


def _fingerprint(caller: str, system: str, first_user: str, tools: list[str]) -> str:
    h = xxhash.xxh3_128()
    for piece in (caller, system, first_user, *tools):
        h.update(piece.encode("utf-8", "replace"))
        h.update(b"\x00")
    return h.hexdigest()


def thread_of(operation: str, body: bytes | None, caller: str) -> Thread | None:
    """The conversation of an LLM request body (`operation` as the adapter parsed it: chat or
    responses), or None when the body says nothing about one (unreadable, no user message)."""
    if not body or len(body) > MAX_BODY_BYTES:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    tools = _tool_names(doc.get("tools"))
    if isinstance(doc.get("input"), (str, list)) and "messages" not in doc:
        return _responses(doc, caller, tools)
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return None
    system = _text(doc.get("system"))  # Anthropic; OpenAI's system is a message
    first_user = None
    for m in messages:
        if not isinstance(m, dict):
            continue
        role = m.get("role")
        if role in ("system", "developer") and first_user is None:
            system += "\n" + _text(m.get("content"))
        elif role == "user":
            first_user = _text(m.get("content"))
            break
    if first_user is None:
        return None
    return Thread(
        _fingerprint(caller, system, first_user, tools),
        _chat_anchor(messages),
        question=query_key(first_user),
    )


def _responses(doc: dict[str, Any], caller: str, tools: list[str]) -> Thread | None:
    named = doc.get("conversation")
    if isinstance(named, dict):
        named = named.get("id")
    previous = doc.get("previous_response_id")
    items = doc.get("input")
    system = _text(doc.get("instructions"))
    first_user = items if isinstance(items, str) else None
    anchor = None
    if isinstance(items, list):
        for item in items:
            if not isinstance(item, dict):
                continue
            role, kind = item.get("role"), item.get("type")
            if role in ("system", "developer") and first_user is None:
                system += "\n" + _text(item.get("content"))
            elif role == "user" and first_user is None:
                first_user = _text(item.get("content"))
            elif kind == "function_call" and anchor is None and isinstance(item.get("call_id"), str):
                anchor = call_anchor(item["call_id"])
            elif role == "assistant" and anchor is None:
                anchor = text_anchor(_text(item.get("content")))
    if first_user is None and not previous and not named:
        return None
    return Thread(
        _fingerprint(caller, system, first_user or "", tools),
        anchor,
        previous if isinstance(previous, str) and previous else None,
        named if isinstance(named, str) and named else None,
        query_key(first_user or ""),
    )


def normalize(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


def query_key(text: str) -> str:
    """A search query or a first user message, as the key a search made before a loop's first
    call is found by (retrieve-then-reason agents search with the question first)."""
    return xxhash.xxh3_64_hexdigest(normalize(text).encode("utf-8", "replace"))


def argument_texts(arguments: str) -> list[str]:
    """The string values of a tool call's arguments (JSON), normalized and cut to MAX_TEXT; the
    whole text if not JSON; at most MAX_TEXTS (what a store keeps per answer stays small)."""
    try:
        doc = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return [normalize(arguments)[:MAX_TEXT]] if arguments.strip() else []
    out: list[str] = []
    stack = [doc]
    while stack and len(out) < MAX_TEXTS:
        v = stack.pop()
        if isinstance(v, str):
            if v.strip():
                out.append(normalize(v)[:MAX_TEXT])
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return out


@dataclass(frozen=True, slots=True)
class Pending:
    """A conversation's latest answer: the tool calls it asked for (their argument texts, normalized).
    `key` names this answer (its first tool call's id, or a random id), so a search can consume the
    tool call it answers: two users' identical agents asking the same search each get their own."""

    task_id: str
    texts: tuple[str, ...]
    key: str = ""


@dataclass(frozen=True, slots=True)
class Match:
    task_id: str
    rule: str  # exact | contained
    confidence: float
    token: str  # the tool call it answers (Pending.key and the argument's place): consumed once matched


def match_pending(
    query: str | None, pending: Iterable[Pending], consumed: Collection[str] = ()
) -> Match | None:
    """The conversation whose pending tool calls (`pending`: newest first) hold this query: `exact`
    (an argument equals it: 1.0), else `contained` (one holds the other: 0.7). A tool call no search
    has answered yet comes first (the oldest such: two users' identical agents asking the same
    search each get their own, in the order their answers came); an answered one matches still (a
    repeated search: the newest), after them."""
    if not query:
        return None
    q = normalize(query)[:MAX_TEXT]  # compared as the store keeps arguments
    if not q:
        return None
    found: dict[tuple[bool, str], Match] = {}  # (already consumed, rule) -> the match kept
    for p in pending:
        for i, text in enumerate(p.texts):
            token = f"{p.key}:{i}"
            used = token in consumed
            if text == q:
                match = Match(p.task_id, "exact", 1.0, token)
            elif min(len(q), len(text)) >= MIN_CONTAINED and (q in text or text in q):
                match = Match(p.task_id, "contained", 0.7, token)
            else:
                continue
            # an answered tool call: the newest (a search repeated); one still open: the oldest, as
            # agents run their tool calls in the order their answers came
            if used:
                found.setdefault((used, match.rule), match)
            else:
                found[(used, match.rule)] = match
    for rank in ((False, "exact"), (True, "exact"), (False, "contained"), (True, "contained")):
        if rank in found:
            return found[rank]
    return None
