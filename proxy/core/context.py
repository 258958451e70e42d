"""The context economy, pure: rewrites of an LLM request body that make its prompt cheaper
without taking anything from the model.

* `cache_key`: a stable `prompt_cache_key` for OpenAI-style requests that set none, so a
  task's (or an agent's) calls reach the provider machine that holds their prefix.
* `add_breakpoints`: Anthropic `cache_control` breakpoints where the stable prefix ends (the
  conversation up to the latest turn, the system prompt, the tools), within the provider's limit
  of 4 and only past its minimum cacheable length; the client's own breakpoints stay where they are.
* `evidence_once`: in a tool result, a retrieved chunk the conversation already holds in full
  is replaced by a short reference to where it appeared.
* `add_openai_breakpoints`: OpenAI's `prompt_cache_breakpoint` at the end of the system prefix,
  on models that take it (GPT-5.6 and later).
* `depth` and `weak`: where to cut a retrieval's results, and whether a first pass looks weak.
* `budget_note` and `append_note`: what the task has left, as the prompt's very last part.

Every rewrite is a pure function of the request and each message's rewrite depends only on that
message and those before it, so the messages a client sends again go upstream exactly as they
went the first time: the provider's prefix cache keeps matching. No I/O, no state.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import xxhash

ANTHROPIC_MAX_BREAKPOINTS = 4  # the Messages API refuses a request with more cache_control blocks
EPHEMERAL = {"type": "ephemeral"}
CHARS_PER_TOKEN = 4  # a cheap, deliberately low-side token estimate for the minimum-length check
# keys under which JSON tool results hold a chunk's text and its id (LangChain, LlamaIndex, most APIs)
TEXT_KEYS = ("text", "content", "page_content", "chunk", "passage")
ID_KEYS = ("id", "chunk_id", "doc_id", "_id", "document_id")
_NOT_CACHEABLE = frozenset({"thinking", "redacted_thinking"})  # cache_control cannot sit on these


def anthropic_min_tokens(model: str | None) -> int:
    """The shortest prefix Anthropic caches for `model`: 4096 tokens for Opus 4.5 and Haiku 4.5,
    2048 for the older Haiku models, 1024 for the rest (a shorter one is silently not cached)."""
    m = (model or "").lower()
    if "opus-4-5" in m or "haiku-4-5" in m:
        return 4096
    if "haiku" in m:
        return 2048
    return 1024


@dataclass(slots=True)
class Rewrite:
    """What the rewrites did to one request (spans, task records)."""

    cache_key: str | None = None  # the prompt_cache_key ragtoll set (None: none set)
    breakpoints_added: int = 0
    breakpoints_client: int = 0  # the client's own cache_control blocks (left where they were)
    chunks_referenced: int = 0  # chunk texts replaced by a reference
    chars_saved: int = 0  # characters of chunk text not sent again
    referenced_ids: list[str] = field(default_factory=list)
    note_chars: int = 0  # the budget note appended (0: none)

    @property
    def changed(self) -> bool:
        return (self.cache_key is not None or self.breakpoints_added > 0 or self.chunks_referenced > 0
                or self.note_chars > 0)


# --- prompt_cache_key ----------------------------------------------------------------------------


def cache_key(mode: str, *, task_id: str, caller_id: str, system: str) -> str:
    """A prompt_cache_key: per task (`task`), or per caller and system prompt (`system`: tasks of one
    agent share the preamble's cache). Hashed: the key says nothing about who is calling."""
    raw = task_id if mode == "task" else f"{caller_id}\x00{system}"
    return "ragtoll-" + xxhash.xxh3_64_hexdigest(f"{mode}\x00{raw}".encode("utf-8", "surrogatepass"))


def openai_system(doc: dict[str, Any]) -> str:
    """The system prompt of an OpenAI chat or Responses request (`instructions`, or the first
    system/developer message), as text; '' when there is none."""
    instructions = doc.get("instructions")
    if isinstance(instructions, str):
        return instructions
    items = doc.get("messages") if isinstance(doc.get("messages"), list) else doc.get("input")
    if isinstance(items, list):
        for m in items:
            if isinstance(m, dict) and m.get("role") in ("system", "developer"):
                content = m.get("content")
                return content if isinstance(content, str) else orjson.dumps(content).decode()
    return ""


def set_cache_key(doc: dict[str, Any], key: str) -> bool:
    """Set `prompt_cache_key` unless the client set one (its own routing wins). True: set."""
    if doc.get("prompt_cache_key") is not None:
        return False
    doc["prompt_cache_key"] = key
    return True


# --- Anthropic cache_control breakpoints ---------------------------------------------------------


def count_breakpoints(doc: dict[str, Any]) -> int:
    """cache_control blocks already in the request (tools, system blocks, message blocks)."""
    n = 0
    for tool in doc.get("tools") or []:
        n += isinstance(tool, dict) and "cache_control" in tool
    system = doc.get("system")
    if isinstance(system, list):
        n += sum(1 for b in system if isinstance(b, dict) and "cache_control" in b)
    for m in doc.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            n += sum(1 for b in content if isinstance(b, dict) and "cache_control" in b)
    return n


def _mark_last(container: dict[str, Any], key: str) -> bool:
    """Put a breakpoint on the last block of `container[key]` (a string becomes one text block);
    False when its last block cannot take one (thinking, empty text) or already has one."""
    value = container.get(key)
    if isinstance(value, str):
        if not value:
            return False
        container[key] = [{"type": "text", "text": value, "cache_control": dict(EPHEMERAL)}]
        return True
    if not isinstance(value, list) or not value:
        return False
    last = value[-1]
    if not isinstance(last, dict) or "cache_control" in last or last.get("type") in _NOT_CACHEABLE:
        return False
    if last.get("type") == "text" and not last.get("text"):
        return False
    value[-1] = {**last, "cache_control": dict(EPHEMERAL)}
    return True


def add_breakpoints(doc: dict[str, Any], model: str | None, *, min_tokens: int | None = None) -> tuple[int, int]:
    """Add cache_control breakpoints to an Anthropic Messages request; (added, the client's own).

    Where, most valuable first, while the request holds fewer than 4: the last block of the last
    message (the whole conversation: the next call of the loop reads it back at 0.1x), the end of
    the system prompt (tools and system: shared by every task of the agent), the last tool. A
    point is skipped when the prefix it closes is shorter than the model's minimum cacheable
    length (estimated low at 4 characters a token) or when a client breakpoint already sits at or
    after it in the same region (the client chose its prefix; ragtoll adds, never moves)."""
    floor = (min_tokens if min_tokens is not None else anthropic_min_tokens(model)) * CHARS_PER_TOKEN
    client = count_breakpoints(doc)
    room = ANTHROPIC_MAX_BREAKPOINTS - client
    if room <= 0:
        return 0, client
    tools = doc.get("tools") if isinstance(doc.get("tools"), list) else []
    messages = doc.get("messages") if isinstance(doc.get("messages"), list) else []
    # lengths of the serialised parts: a little over their text, and far cheaper to take
    tools_chars = len(orjson.dumps(tools)) if tools else 0
    system = doc.get("system")
    system_chars = tools_chars + (len(system) if isinstance(system, str) else len(orjson.dumps(system)) if system else 0)
    total_chars = system_chars + len(orjson.dumps(messages))
    client_in_messages = any(isinstance(b, dict) and "cache_control" in b for m in messages if isinstance(m, dict)
                             and isinstance(m.get("content"), list) for b in m["content"])
    added = 0
    last = messages[-1] if messages and isinstance(messages[-1], dict) else None
    last_client = last is not None and isinstance(last.get("content"), list) and any(
        isinstance(b, dict) and "cache_control" in b for b in last["content"])
    if last is not None and not last_client and total_chars >= floor and _mark_last(last, "content"):
        added += 1
    system_client = isinstance(system, list) and any(isinstance(b, dict) and "cache_control" in b for b in system)
    if (added < room and system and not system_client and not client_in_messages and system_chars >= floor
            and _mark_last(doc, "system")):
        added += 1
    tools_client = any(isinstance(t, dict) and "cache_control" in t for t in tools)
    if (added < room and tools and not tools_client and not system_client and not client_in_messages
            and tools_chars >= floor and isinstance(tools[-1], dict)):
        tools[-1] = {**tools[-1], "cache_control": dict(EPHEMERAL)}
        added += 1
    return added, client


# --- evidence sent once --------------------------------------------------------------------------


def reference(chunk_id: str | None, where: str) -> str:
    """The text that stands for a chunk sent before: stable (its id and the message it is in)."""
    return f"[same text as chunk {chunk_id} in {where}; not repeated]" if chunk_id else \
        f"[same text as a chunk in {where}; not repeated]"


def _chunks(root: Any, min_chars: int) -> list[tuple[dict[str, Any], str, str | None]]:
    """(holder, text key, id) of every chunk-like object in a parsed tool result, in document
    order: a dict with a text field of at least `min_chars` characters; its id from the usual id
    keys. (A loop over an explicit stack: this runs on every tool result of every LLM call.)"""
    out: list[tuple[dict[str, Any], str, str | None]] = []
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            key = None
            for k in TEXT_KEYS:
                v = node.get(k)
                if v.__class__ is str and len(v) >= min_chars:
                    key = k
                    break
            if key is None:
                stack.extend(reversed([v for v in node.values() if isinstance(v, (dict, list))]))
                continue
            cid = None
            for k in ID_KEYS:
                v = node.get(k)
                if v.__class__ is str or v.__class__ is int:
                    cid = str(v)
                    break
            out.append((node, key, cid))
    return out


def dedupe_result(text: str, where: str, seen: dict[str, str], rewrite: Rewrite, min_chars: int) -> str:
    """One tool result (a JSON string): chunks whose exact text `seen` holds (text -> where it was
    sent in full) become references; the rest are added to `seen`. Unchanged text is returned as
    it came (no re-serialisation); a result that is not JSON is never touched."""
    if len(text) < min_chars or text[:1] not in ("{", "["):
        return text
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    changed = False
    for holder, key, cid in _chunks(doc, min_chars):
        body = holder[key]
        first = seen.get(body)
        if first is None:
            seen[body] = where
            continue
        holder[key] = reference(cid, first)
        rewrite.chunks_referenced += 1
        rewrite.chars_saved += len(body) - len(holder[key])
        if cid is not None:
            rewrite.referenced_ids.append(cid)
        changed = True
    return orjson.dumps(doc).decode() if changed else text


def openai_evidence_once(doc: dict[str, Any], rewrite: Rewrite, min_chars: int) -> None:
    """Chat Completions (`messages`, role tool) and Responses (`input`, function_call_output)."""
    seen: dict[str, str] = {}
    _dedupe_texts(doc.get("messages"), ("role", "tool"), "content", "message", seen, rewrite, min_chars)
    _dedupe_texts(doc.get("input"), ("type", "function_call_output"), "output", "input item", seen, rewrite, min_chars)


def _dedupe_texts(items: Any, kind: tuple[str, str], field: str, label: str, seen: dict[str, str],
                  rewrite: Rewrite, min_chars: int) -> None:
    """Each item of `items` whose `kind[0]` is `kind[1]` has its text `field` deduplicated, in order."""
    if not isinstance(items, list):
        return
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get(kind[0]) == kind[1] and isinstance(item.get(field), str):
            new = dedupe_result(item[field], f"{label} {i}", seen, rewrite, min_chars)
            if new is not item[field]:
                items[i] = {**item, field: new}


def anthropic_evidence_once(doc: dict[str, Any], rewrite: Rewrite, min_chars: int) -> None:
    """Messages API: tool_result blocks (string content, or text blocks) in user turns."""
    seen: dict[str, str] = {}
    messages = doc.get("messages")
    if not isinstance(messages, list):
        return
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "tool_result":
                continue
            where = f"message {i}"
            inner = block.get("content")
            if isinstance(inner, str):
                new = dedupe_result(inner, where, seen, rewrite, min_chars)
                if new is not inner:
                    content[j] = {**block, "content": new}
            elif isinstance(inner, list):
                for k, part in enumerate(inner):
                    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                        new = dedupe_result(part["text"], where, seen, rewrite, min_chars)
                        if new is not part["text"]:
                            inner[k] = {**part, "text": new}


# --- adaptive depth ------------------------------------------------------------------------------


def depth(scores: list[float | None], *, gap: float, floor: float, min_keep: int = 1) -> tuple[int, str]:
    """How many of a retrieval's ranked results to pass on, and why: `floor` cuts the results
    scoring under that share of the top score; `gap` cuts after the largest drop between adjacent
    scores when it is at least that share of the top score ('' when nothing is cut). Results
    without scores, or scores that do not fall with rank (distances), are never cut."""
    n = len(scores)
    if n <= min_keep or any(s is None for s in scores):
        return n, ""
    vals = [float(s) for s in scores if s is not None]
    top = vals[0]
    if top <= 0 or any(b > a for a, b in itertools.pairwise(vals)):
        return n, ""
    keep, reason = n, ""
    if floor > 0:
        below = next((i for i, s in enumerate(vals) if s < floor * top), n)
        if max(below, min_keep) < keep:
            keep, reason = max(below, min_keep), "floor"
    if gap > 0 and keep > 1:
        drops = [(vals[i] - vals[i + 1]) / top for i in range(keep - 1)]
        i = max(range(len(drops)), key=drops.__getitem__)
        if drops[i] >= gap and max(i + 1, min_keep) < keep:
            keep, reason = max(i + 1, min_keep), "gap"
    return keep, reason


# --- widening a weak first pass ------------------------------------------------------------------


def weak(scores: list[float | None], *, floor: float, margin: float) -> str:
    """Why a search's results look like a weak first pass ('' when they do not): `low` when the
    top score is under `floor` (the retriever's own scale; 0: never), `tie` when the top result
    leads the second by less than `margin` x the top score (0: never). No results is `low`;
    results without scores, or scores that do not fall with rank (distances), are never judged."""
    if not scores:
        return "low" if floor > 0 else ""
    if any(s is None for s in scores):
        return ""
    vals = [float(s) for s in scores if s is not None]
    if any(b > a for a, b in itertools.pairwise(vals)):
        return ""
    if floor > 0 and vals[0] < floor:
        return "low"
    if margin > 0 and len(vals) > 1 and vals[0] > 0 and (vals[0] - vals[1]) < margin * vals[0]:
        return "tie"
    return ""


# --- the budget note -----------------------------------------------------------------------------

# what the note names, in its order: dimension -> (singular, plural)
_NOTE_UNITS = {"max_steps": ("model call", "model calls"), "max_retrieval_calls": ("search", "searches"),
               "max_rerank_calls": ("rerank", "reranks"), "max_context_tokens": ("prompt token", "prompt tokens")}


def budget_note(left: Mapping[str, float]) -> str | None:
    """The note a model reads at the end of its prompt: what its task has left (model calls,
    searches, reranks, prompt tokens, cost), from the budget's remaining-budget figures; None when
    the task has no limit the note names."""
    parts = []
    for dim, (one, many) in _NOTE_UNITS.items():
        if dim in left:
            n = int(left[dim])
            parts.append(f"{n} {one if n == 1 else many}")
    if "max_cost_usd" in left:
        parts.append(f"${float(left['max_cost_usd']):.4f}")
    if not parts:
        return None
    return ("[ragtoll budget note] This task has left: " + ", ".join(parts) +
            ". Answer from the evidence you have before it runs out; search again only if you must.")


def append_note(doc: dict[str, Any], api: str, note: str) -> bool:
    """Append `note` as the prompt's last part, after everything the client sent (so after every
    cache breakpoint: the client never sends it back, and the cached prefix never holds it). Chat
    Completions: a final user message; Responses: a final user input item (not on a conversation
    the server keeps, `previous_response_id` or `conversation`, which would store it); Anthropic: a
    text block at the end of the last user turn. False (nothing added) for any other shape."""
    if api == "anthropic":
        messages = doc.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        if not isinstance(last, dict) or last.get("role") != "user":
            return False
        content = last.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            return False
        messages[-1] = {**last, "content": [*blocks, {"type": "text", "text": note}]}
        return True
    if isinstance(doc.get("messages"), list):
        doc["messages"].append({"role": "user", "content": note})
        return True
    if isinstance(doc.get("input"), list) and doc.get("previous_response_id") is None \
            and doc.get("conversation") is None:
        doc["input"].append({"role": "user", "content": note})
        return True
    return False


# --- OpenAI prompt_cache_breakpoint --------------------------------------------------------------

OPENAI_MAX_BREAKPOINTS = 4  # breakpoints one request may write (the implicit one included)
BREAKPOINT = {"mode": "explicit"}


def takes_breakpoints(model: str | None, prefixes: tuple[str, ...]) -> bool:
    m = (model or "").lower()
    return bool(m) and any(m.startswith(p.lower()) for p in prefixes if p)


def _parts_with_breakpoint(content: Any, part_type: str) -> list[Any] | None:
    """`content` (a string or a list of parts) with a breakpoint on its last part; None when that
    part cannot take one (not text, empty) or the content has none."""
    if isinstance(content, str):
        return [{"type": part_type, "text": content, "prompt_cache_breakpoint": dict(BREAKPOINT)}] if content else None
    if not isinstance(content, list) or not content:
        return None
    last = content[-1]
    if not isinstance(last, dict) or last.get("type") not in ("text", "input_text") or not last.get("text"):
        return None
    return [*content[:-1], {**last, "prompt_cache_breakpoint": dict(BREAKPOINT)}]


def add_openai_breakpoints(doc: dict[str, Any], *, min_tokens: int = 1024) -> tuple[int, int]:
    """A `prompt_cache_breakpoint` where the stable prefix ends on an OpenAI Chat Completions or
    Responses request: the last part of the leading system / developer messages (the tools and
    instructions every task of the agent shares; the provider's own implicit breakpoint already
    covers the conversation's latest message). (added, the client's own). Nothing is added when
    the client placed any breakpoint (its choice stands; ragtoll never moves one: so a request
    holds at most 2 with the implicit one, within OpenAI's 4), or when the prefix is under the
    provider's 1,024-token minimum (estimated low)."""
    key, part_type = ("messages", "text") if isinstance(doc.get("messages"), list) else ("input", "input_text")
    items = doc.get(key)
    if not isinstance(items, list):
        return 0, 0
    client = sum(1 for m in items if isinstance(m, dict) and isinstance(m.get("content"), list)
                 for p in m["content"] if isinstance(p, dict) and "prompt_cache_breakpoint" in p)
    if client:  # the client chose its prefix; with none, one more keeps the request within the limit
        return 0, client
    end = 0
    while end < len(items) and isinstance(items[end], dict) and items[end].get("role") in ("system", "developer"):
        end += 1
    if not end:
        return 0, client
    tools = doc.get("tools")
    chars = (len(orjson.dumps(tools)) if tools else 0) + len(orjson.dumps(items[:end]))
    if chars < min_tokens * CHARS_PER_TOKEN:
        return 0, client
    marked = _parts_with_breakpoint(items[end - 1].get("content"), part_type)
    if marked is None:
        return 0, client
    items[end - 1] = {**items[end - 1], "content": marked}
    return 1, client


def mark_conversation_end(doc: dict[str, Any]) -> int:
    """Before the budget note goes on a model with explicit breakpoints: a breakpoint on the
    client's last message (user or tool; an assistant message cannot take one), so the
    conversation is cached where it ends without the note and not only with the note, which is
    never sent again. 1 when marked."""
    key, part_type = ("messages", "text") if isinstance(doc.get("messages"), list) else ("input", "input_text")
    items = doc.get(key)
    last = items[-1] if isinstance(items, list) and items else None
    if not isinstance(last, dict) or last.get("role") not in ("user", "tool"):
        return 0
    marked = _parts_with_breakpoint(last.get("content"), part_type)
    if marked is None:
        return 0
    items[-1] = {**last, "content": marked}
    return 1
