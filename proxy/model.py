"""Value types passed between stages: who the call belongs to, what it is, and what it cost.

Pure data: frozen dataclasses, no I/O, no imports from the rest of ragtoll.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import xxhash

# task.source values: which DESIGN.md "Task identity" rule produced the id
SOURCE_BAGGAGE = "baggage"
SOURCE_TRACEPARENT = "traceparent"
SOURCE_HEADER = "header"
SOURCE_SESSION = "session"
SOURCE_PER_CALL = "per-call"
# untracked calls told apart by their conversation (core/conversation.py, request/conversation.py): an
# LLM call by its conversation's fingerprint; a search or rerank by the pending tool call it matches,
# else by its client's most recent conversation
SOURCE_CONVERSATION = "conversation"
SOURCE_CONVERSATION_TOOL = "conversation-tool-match"
SOURCE_CONVERSATION_RECENT = "conversation-recent"
SOURCE_CONVERSATION_QUERY = "conversation-query"  # a search no tool call asked for: the loop it opens
# sources that name a task ragtoll is sure of: their limits can refuse work. A session (one client's
# calls within the idle timeout: maybe many users) and a guess by recency or by question are heuristics
HEURISTIC_SOURCES = frozenset({SOURCE_SESSION, SOURCE_CONVERSATION_RECENT, SOURCE_CONVERSATION_QUERY})
# sources where the client named the task itself: its calls are its own, never another user's
NAMED_SOURCES = frozenset({SOURCE_BAGGAGE, SOURCE_TRACEPARENT, SOURCE_HEADER, SOURCE_PER_CALL})
TASK_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:~@/+=-]{1,128}$")  # what a task id may be (also admin paths)
OUTPUT_TEXT_KEEP = 16_384  # characters of generated text an observer keeps for content capture
MAX_TOOL_CALLS = 16  # tool calls of one answer an observer keeps (Observation.tool_calls)
TOOL_ARGS_KEEP = 2048  # characters of one tool call's arguments kept


@dataclass(frozen=True, slots=True)
class TaskRef:
    """The task a call belongs to.

    `trace_id` is the 128-bit trace the call's spans go to; for tasks named by baggage or header
    it is derived from the id, so every replica puts a task's calls in one trace.
    `baggage` holds the W3C baggage members the caller sent (already size-checked).
    """

    id: str
    source: str
    trace_id: int
    baggage: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()  # why a header or baggage member was ignored
    match: str = ""  # conversation sources: what tied the call to its conversation (span attribute)
    confidence: float | None = None  # conversation sources: how sure that rule is (1.0: exact)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a call is for, as the evidence cache's ACL decisions see it (request/caller.py resolves it)."""

    subject: str
    groups: frozenset[str] = frozenset()
    tenant: str = ""
    authenticated: bool = False

    @property
    def key(self) -> str:
        """The exact principal: subject, tenant and groups. Owner of entries with unknown ACLs."""
        raw = "\x00".join((self.tenant, self.subject, *sorted(self.groups)))
        return xxhash.xxh3_128_hexdigest(raw.encode())

    @property
    def view(self) -> frozenset[str]:
        """What an upstream that filters by caller can tell this caller by: its groups (within its
        tenant, which partitions the cache); an anonymous caller also by its credential (the subject)."""
        return self.groups if self.authenticated else self.groups | {self.subject}


@dataclass(frozen=True, slots=True)
class Chunk:
    """One retrieved piece of evidence."""

    id: str
    text: str = ""
    score: float | None = None
    source: str | None = None
    acl: tuple[str, ...] | None = None  # None: the response said nothing about access


@dataclass(slots=True)
class Call:
    """What an adapter read from a request body. Fields an API lacks stay at their defaults."""

    operation: str  # gen_ai.operation.name: chat, text_completion, embeddings, retrieval, rerank, other
    model: str | None = None
    stream: bool = False
    max_output_tokens: int | None = None
    prompt_tokens: int | None = None  # counted from the request before forwarding
    prompt_estimated: bool = False  # True when not counted with the model's own encoding
    prompt_texts: list[str] = field(default_factory=list)
    query: str | None = None  # retrieval / rerank query, as sent
    user_text: str | None = None  # LLM calls: the last user message (what the classifier reads)
    query_vector: list[float] | None = None
    filters: Any = None  # canonical filters (retrieval)
    top_k: int | None = None
    documents: int | None = None  # rerank: candidate count
    inputs: int | None = None  # embeddings: input count
    parse_error: str | None = None
    query_key: str | None = None  # retrieval: unique-intent key (queries.query_key: route, text/vector, filters)
    # retrieval: a hash of the body fields the adapter does not understand (None: there are none), so
    # two requests that differ in any of them never share cached evidence (cache.partition.selector)
    selector: str | None = None
    choices: int = 1  # n > 1 asks for several completions; max_output_tokens already covers all of them


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    reasoning_tokens: int | None = None
    cache_write_tokens: int | None = None  # prompt tokens written to the provider's cache (Anthropic)


@dataclass(slots=True)
class Observation:
    """What an adapter read from the response, possibly as it streamed past."""

    usage: Usage | None = None
    response_model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    chunks: list[Chunk] | None = None  # retrieval results, rerank results as ids
    output_tokens_seen: int = 0  # streamed output tokens counted so far (mid-stream enforcement)
    source_version: str | None = None
    parse_error: str | None = None
    unread: str | None = None  # why ragtoll stopped reading the response (inspection.Inspector)
    response_id: str | None = None  # the id a stream's closing event must repeat (OpenAI Responses)
    output_text: list[str] = field(default_factory=list)  # generated text, first OUTPUT_TEXT_KEEP chars
    output_kept: int = 0  # characters in output_text
    # LLM calls: the tool calls the answer asks for, as (call id, arguments text), bounded (MAX_TOOL_CALLS,
    # TOOL_ARGS_KEEP characters each): the conversation their searches belong to is matched by them
    tool_calls: list[tuple[str, str]] = field(default_factory=list)

    def saw_tool_call(self, call_id: str | None, arguments: str | None, index: int | None = None) -> None:
        """A tool call of the answer, or (a stream) a fragment of the one at `index`: appended to it."""
        if index is not None and 0 <= index < len(self.tool_calls):
            cid, args = self.tool_calls[index]
            self.tool_calls[index] = (cid or call_id or "", (args + (arguments or ""))[:TOOL_ARGS_KEEP])
        elif len(self.tool_calls) < MAX_TOOL_CALLS:
            self.tool_calls.append((call_id or "", (arguments or "")[:TOOL_ARGS_KEEP]))

    def keep_output(self, text: str) -> None:
        """Remember generated text for content capture (off by default), bounded per call."""
        if self.output_kept < OUTPUT_TEXT_KEEP and text:
            piece = text[: OUTPUT_TEXT_KEEP - self.output_kept]
            self.output_text.append(piece)
            self.output_kept += len(piece)
