"""Task identity of an untracked call from its conversation (`tasks.untracked: conversation`).

Runs after the body is read and parsed, before the call's spans start (so the call goes to its
conversation's trace). What it decides, and how sure it is, goes on the call span:
`ragtoll.task.source` (conversation, conversation-tool-match, conversation-recent),
`ragtoll.task.match` (the rule) and `ragtoll.task.confidence`.

  * an LLM call: its conversation (core/conversation.py): a named conversation or the response it
    continues (Responses API), else its fingerprint and anchor, looked up in the store; the loop's
    first call opens a task, and its answer's anchor is filed under it (`observe`);
  * a search, rerank or embeddings call: the conversation of this client whose latest answer
    asked for a tool call with these arguments; else, when it has a query, the loop that will ask
    that question (`conversation-query`: a search made before a loop's first call, which that call
    then joins); else the client's most recent conversation (`conversation-recent`). Both guesses
    are held to progress limits only, as a session is;
  * nothing to go by (no user message, a body not read, an unknown client, a failing store):
    None, and the client's session stands.
The store is asked at most once before the call and a few times after it, each bounded by
`store_timeout_ms`; a failure never fails the call.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import xxhash

from ..core import conversation as cv
from ..model import (
    SOURCE_CONVERSATION,
    SOURCE_CONVERSATION_QUERY,
    SOURCE_CONVERSATION_RECENT,
    SOURCE_CONVERSATION_TOOL,
    SOURCE_SESSION,
    TaskRef,
)
from ..stores.conversations import ConversationStore
from .identify import derived_trace_id

if TYPE_CHECKING:
    from .exchange import Exchange

LLM = frozenset({"chat", "text_completion", "messages"})
TOOLS = frozenset({"retrieval", "rerank", "embeddings"})
RECENT_CONFIDENCE = 0.3  # the client's most recent conversation: right when one user is active
PRESEARCH_CONFIDENCE = 0.5  # a search no tool call asked for: the loop that asks that question
MAX_CLAIMS = 4  # identical searches racing for one tool call: store round trips one search may make


def _h(*parts: str) -> str:
    return xxhash.xxh3_128_hexdigest("\x00".join(parts).encode("utf-8", "replace"))[:24]


class Conversations:
    def __init__(self, store: ConversationStore, timeout_s: float) -> None:
        self.store = store
        self.timeout_s = timeout_s

    @staticmethod
    def applies(task: TaskRef) -> bool:
        """Only a call nothing else identified (the session fallback) is looked at."""
        return task.source == SOURCE_SESSION

    @staticmethod
    def scope(ex: Exchange) -> str:
        """The client scope searches are matched in: its address and tenant. Not its credential or
        user agent: an agent's tools often call with other ones than its model client."""
        tenant = (
            ex.caller.principal.tenant if ex.caller is not None and ex.caller.principal is not None else ""
        )
        return _h(ex.client, tenant)

    async def resolve(self, ex: Exchange) -> tuple[TaskRef, cv.Thread | None] | None:
        """The call's conversation task (and an LLM call's thread, for `observe`), or None."""
        op = ex.call.operation
        try:
            async with asyncio.timeout(self.timeout_s):
                if op in LLM:
                    return await self._llm(ex)
                if op in TOOLS:
                    found = await self._tool(ex)
                    return (found, None) if found is not None else None
        except Exception:  # noqa: BLE001 - a slow or failing store: the session stands
            return None
        return None

    async def _llm(self, ex: Exchange) -> tuple[TaskRef, cv.Thread] | None:
        caller = ex.caller.id if ex.caller is not None else ex.client
        thread = cv.thread_of(ex.call.operation, ex.body, caller)
        if thread is None:
            return None
        if thread.named:
            return self._ref("conv-" + _h(caller, "named", thread.named), "conversation-id", 1.0), thread
        if thread.previous:
            found = await self.store.find("r:" + thread.previous)
            if found is not None:
                return self._ref(found, "previous-response", 1.0), thread
            # a response this store never saw (expired, another store): its chain is still one task
            return self._ref(
                "conv-" + _h(caller, "prev", thread.previous), "previous-response-unseen", 0.8
            ), thread
        anchored = f"a:{thread.fingerprint}:{thread.anchor}"
        if thread.anchor is not None and (found := await self.store.find(anchored)) is not None:
            return self._ref(found, "fingerprint", 1.0), thread
        # the loop's first call here: a search made with its question before it opened the task
        adopted = await self.store.take(f"q:{self.scope(ex)}:{thread.question}") if thread.question else None
        if adopted is not None:
            if thread.anchor is not None:  # a first call that names an answer (a forced first tool call)
                await self.store.link(anchored, adopted)
            return self._ref(adopted, "pre-search", 0.9), thread
        if thread.anchor is None:  # the loop's first call: a new task
            return self._ref(f"conv-{thread.fingerprint[:16]}-{uuid.uuid4().hex[:8]}", "opening", 1.0), thread
        # the opening's answer was never filed (it failed, the store lost it): the rest is one task
        return self._ref("conv-" + _h(thread.fingerprint, thread.anchor), "fingerprint-unseen", 0.8), thread

    async def _tool(self, ex: Exchange) -> TaskRef | None:
        call = ex.call
        query = call.query or (call.prompt_texts[0] if call.prompt_texts else None)
        scope = self.scope(ex)
        recent, consumed = await self.store.recent(scope)
        for _ in range(MAX_CLAIMS):
            matched = cv.match_pending(query, recent, consumed)
            if matched is None:
                break
            # the tool call this search answers; one an identical search claimed first is not it
            if matched.token in consumed or await self.store.consume(scope, matched.token):
                return self._ref(matched.task_id, matched.rule, matched.confidence, SOURCE_CONVERSATION_TOOL)
            consumed.add(matched.token)
        if query and query.strip():
            # no tool call asked for it: a search made before a loop's first call (retrieve-then-
            # reason), which opens the task that loop's first call then joins (`_llm`)
            key = f"q:{scope}:{cv.query_key(query)}"
            task_id = await self.store.find(key)
            if task_id is None:
                task_id = f"conv-q{cv.query_key(query)[:15]}-{uuid.uuid4().hex[:8]}"
                await self.store.link(key, task_id)
            return self._ref(task_id, "pre-search", PRESEARCH_CONFIDENCE, SOURCE_CONVERSATION_QUERY)
        if recent:  # no query to go by (a rerank by ids, a vector search): the client's latest
            return self._ref(recent[0].task_id, "most-recent", RECENT_CONFIDENCE, SOURCE_CONVERSATION_RECENT)
        return None

    @staticmethod
    def _ref(task_id: str, match: str, confidence: float, source: str = SOURCE_CONVERSATION) -> TaskRef:
        return TaskRef(task_id, source, derived_trace_id(task_id), match=match, confidence=confidence)

    async def observe(self, ex: Exchange, thread: cv.Thread) -> None:
        """After an LLM call of a conversation: file its opening's anchor, its response id, and the
        tool calls its answer asks for (what the searches that follow are matched by)."""
        if ex.task is None or ex.status is None or ex.status >= 400:
            return
        task_id, obs = ex.task.id, ex.observation
        try:
            async with asyncio.timeout(self.timeout_s):
                if thread.anchor is None:
                    anchor = None
                    if obs.tool_calls and obs.tool_calls[0][0]:
                        anchor = cv.call_anchor(obs.tool_calls[0][0])
                    elif obs.output_text:
                        anchor = cv.text_anchor("".join(obs.output_text))
                    if anchor is not None:
                        await self.store.link(f"a:{thread.fingerprint}:{anchor}", task_id)
                if obs.response_id:
                    await self.store.link("r:" + obs.response_id, task_id)
                texts = tuple(t for _id, args in obs.tool_calls for t in cv.argument_texts(args))[
                    : cv.MAX_TEXTS
                ]
                key = (obs.tool_calls[0][0] if obs.tool_calls else "") or uuid.uuid4().hex
                await self.store.pending(self.scope(ex), cv.Pending(task_id, texts, key[:128]))
        except Exception:  # noqa: BLE001, S110 - bookkeeping: a failing store never fails the call
            pass
