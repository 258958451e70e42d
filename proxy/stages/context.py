"""Context stage: make an LLM call's prompt cheaper without taking anything from the model
(proxy/core/context.py does the rewriting; this stage applies the route's `context:` policy).

On an OpenAI-style route it sets a stable `prompt_cache_key` when the client set none (and, on
models that take it, a `prompt_cache_breakpoint` at the end of the system prefix); on an
Anthropic route it adds `cache_control` breakpoints where the stable prefix ends; on both, a chunk
a tool result repeats from earlier in the same conversation is sent as a reference to that
earlier copy, and (opt-in) the prompt ends with a note of what the task has left. On retrieval
routes it cuts results (adaptive depth) and, opt-in, widens a task's search after a weak first
pass. It runs before the budget, which then charges the call as it will be sent.

What each call's rewrites did it counts on the exchange (`tallies`), which the budget settles
into the task's ledger with the call, so the task record's `context` object covers every
replica's calls; it also keeps the same numbers per task in this process (dropped when the task
ends), the record's fallback when the store holds none. It never answers or fails a call: a body
it cannot read goes on as it came.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from ragtoll.instrumentation import semconv as sc

from ..config import CACHE_KEY_HOSTS, ContextRoute, Settings
from ..core import context
from ..core.tally import RECORD_COUNTS, Tallies, context_record
from ..model import NAMED_SOURCES, Call
from ..request.exchange import Exchange, Stage, contract

MAX_TASKS = 10_000
# first passes judged per task (widening): later new queries are not; with MAX_TASKS, a bound
# of about 10 MB on what widening keeps
MAX_QUERIES = 16
DEPTH_HEADER = b"x-ragtoll-depth"
_LLM = frozenset({"chat", "text_completion"})


@dataclass(slots=True)
class Tally:
    """One task's context numbers (the `context` part of its record)."""

    llm_calls: int = 0
    input_tokens: int = 0  # as the upstream reported them (uncached + cache reads + cache writes)
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cache_keys_set: int = 0
    breakpoints_added: int = 0
    chunks_referenced: int = 0
    evidence_chars_saved: int = 0
    results_trimmed: int = 0  # retrieval results adaptive depth did not pass on
    budget_notes: int = 0  # LLM calls that got the budget note
    # widening: "" (no weak first pass yet), "pending" (the next search asks for more), "done";
    # `widened` is the widened search's call while it is in flight (its answer is not cut)
    widen: str = ""
    widened: Call | None = None
    queries: set[int] = field(default_factory=set)  # hashes of the queries judged (first passes), bounded
    budget_left: dict[str, float] | None = None  # as the budget said on the task's latest call

    @property
    def searches_widened(self) -> int:
        return int(self.widen == "done")

    def record(self) -> dict[str, Any]:
        return context_record({k: getattr(self, k) for k in RECORD_COUNTS})


def _policy_key(settings: Settings, policy: ContextRoute, url: str) -> str:
    mode = policy.prompt_cache_key or "off"
    if mode == "auto":
        return "task" if (urlsplit(url).hostname or "") in CACHE_KEY_HOSTS else "off"
    return mode


def _count(t: Tally | Tallies, rewrite: context.Rewrite) -> None:
    t.cache_keys_set += rewrite.cache_key is not None
    t.breakpoints_added += rewrite.breakpoints_added
    t.chunks_referenced += rewrite.chunks_referenced
    t.evidence_chars_saved += rewrite.chars_saved
    t.budget_notes += rewrite.note_chars > 0


class ContextStage(Stage):
    contract = contract(reads="route method target headers call body task caller span proposal filing",
                        # a widened search's miss is filed under the top_k it asked for (filing.lookup)
                        writes="body call filing tallies",
                        # adaptive depth also narrows `observation.chunks` to the results passed on, for
                        # the stages after it (budget, evidence); the cache before it files the whole
                        # answer on purpose, and a hit of a named task is cut here as the live answer was
                        response_reads="route call observation response_body task span",
                        response_writes="response_body response_headers tallies",
                        end_reads="task status call observation span budget_left")

    def __init__(self, settings: Settings) -> None:
        self.policies = {u.name: settings.context.for_route(u.name) for u in settings.upstreams}
        self.keys = {u.name: _policy_key(settings, self.policies[u.name], u.url) for u in settings.upstreams}
        self._tasks: OrderedDict[str, Tally] = OrderedDict()
        self.notes = any(p.budget_note for p in self.policies.values())  # keep what the budget says is left

    async def on_request(self, ex: Exchange) -> None:
        api = ex.route.upstream.api
        if ex.call.operation == "retrieval":
            self.widen(ex)
            return
        if ex.call.operation not in _LLM or not ex.body or api not in ("openai", "anthropic") or ex.call.parse_error:
            return  # a body the adapter could not read goes on as it came
        name = ex.route.upstream.name
        policy = self.policies[name]
        # chat completions and Responses take prompt_cache_key; legacy completions are left alone
        chat = api == "openai" and ex.call.operation == "chat"
        key_mode = self.keys[name] if chat else "off"
        marks = bool(policy.breakpoints) and (api == "anthropic" or (
            chat and context.takes_breakpoints(ex.call.model, policy.breakpoint_models or ())))
        tally = self._tasks.get(ex.task.id) if ex.task is not None else None
        note = context.budget_note(tally.budget_left) if (
            policy.budget_note and tally is not None and tally.budget_left and (api == "anthropic" or chat)) else None
        if key_mode == "off" and not marks and not policy.evidence_once and note is None:
            return
        started = time.perf_counter()
        rewrite = self.rewrite(ex, api, key_mode, marks, policy, note)
        if rewrite is None:
            return
        if rewrite.chunks_referenced or rewrite.note_chars:  # the budget charges the prompt as sent
            ex.call = ex.route.adapter.parse_request(ex.method, ex.target.split("?", 1)[0], ex.headers, ex.body)
        _count(ex.tallies, rewrite)  # the call's: settled into the task's ledger
        if ex.task is not None:
            _count(self._task(ex.task.id), rewrite)  # this process's
        if ex.span is not None:
            attrs: dict[str, Any] = {sc.CONTEXT_REWRITE_US: round((time.perf_counter() - started) * 1e6, 1)}
            if rewrite.cache_key is not None:
                attrs[sc.CONTEXT_CACHE_KEY] = key_mode
            if marks:
                attrs[sc.CONTEXT_BREAKPOINTS_ADDED] = rewrite.breakpoints_added
                attrs[sc.CONTEXT_BREAKPOINTS_CLIENT] = rewrite.breakpoints_client
            if rewrite.note_chars:
                attrs[sc.CONTEXT_BUDGET_NOTE] = rewrite.note_chars
            if rewrite.chunks_referenced:
                attrs[sc.CONTEXT_CHUNKS_REFERENCED] = rewrite.chunks_referenced
                attrs[sc.CONTEXT_CHARS_SAVED] = rewrite.chars_saved
            ex.span.set_attributes(attrs)
        return

    def rewrite(self, ex: Exchange, api: str, key_mode: str, marks: bool, policy: ContextRoute,
                note: str | None = None) -> context.Rewrite | None:
        """Rewrite `ex.body` in place; the rewrite's account, or None when the body is not a JSON object."""
        try:
            doc = orjson.loads(ex.body or b"")
        except orjson.JSONDecodeError:
            return None
        if not isinstance(doc, dict):
            return None
        try:
            return self._rewrite(ex, doc, api, key_mode, marks, policy, note)
        except (TypeError, AttributeError, KeyError, ValueError):
            # a shape the rewrites do not expect (`"messages": 5`, a message that is a string): the
            # body goes on as it came; `doc` is a copy, so nothing half-rewritten reaches the upstream
            return None

    def _rewrite(self, ex: Exchange, doc: dict[str, Any], api: str, key_mode: str, marks: bool,
                 policy: ContextRoute, note: str | None) -> context.Rewrite:
        rewrite = context.Rewrite()
        min_chars = policy.min_chunk_chars or 200
        if api == "openai":
            if policy.evidence_once:
                context.openai_evidence_once(doc, rewrite, min_chars)
            if key_mode != "off":
                key = context.cache_key(key_mode, task_id=ex.task.id if ex.task else "",
                                        caller_id=ex.caller.id if ex.caller else "", system=context.openai_system(doc))
                if context.set_cache_key(doc, key):
                    rewrite.cache_key = key
            if marks:
                rewrite.breakpoints_added, rewrite.breakpoints_client = context.add_openai_breakpoints(doc)
        else:
            if policy.evidence_once:
                context.anthropic_evidence_once(doc, rewrite, min_chars)
            if marks:
                rewrite.breakpoints_added, rewrite.breakpoints_client = context.add_breakpoints(doc, ex.call.model)
        # last, after every breakpoint: the note is never part of a prefix the client sends again
        if note is not None:
            if api == "openai" and marks and not rewrite.breakpoints_client:
                rewrite.breakpoints_added += context.mark_conversation_end(doc)
            if context.append_note(doc, api, note):
                rewrite.note_chars = len(note)
        if rewrite.changed:
            ex.body = orjson.dumps(doc)
        return rewrite

    def widen(self, ex: Exchange) -> None:
        """A search of a task whose first pass on a query looked weak asks for `widen_top_k`
        results instead of the client's fewer, once per task. It is the task's own next search:
        no call is added, and the budget (after this stage) admits and charges it as it is sent."""
        policy = self.policies[ex.route.upstream.name]
        tally = self._tasks.get(ex.task.id) if ex.task is not None else None
        top_k, wide = ex.call.top_k, policy.widen_top_k or 0
        widen = getattr(ex.route.adapter, "with_top_k", None)
        if (not policy.widen or tally is None or tally.widen != "pending" or ex.proposal is not None
                or top_k is None or top_k >= wide or not ex.body or widen is None):
            return  # a cache hit is answered as it is; the widening waits for a search that goes upstream
        body = widen(ex.body, wide)
        if body is None:
            return
        ex.body = body
        ex.call = ex.route.adapter.parse_request(ex.method, ex.target.split("?", 1)[0], ex.headers, body)
        tally.widen, tally.widened = "done", ex.call
        ex.tallies.searches_widened = 1
        if ex.filing is not None and ex.filing.lookup is not None:
            # the cache files this miss as the answer to the top_k it asked for, so it serves a
            # later search for fewer results trimmed, as it does any larger answer
            ex.filing.lookup.query.top_k = ex.call.top_k
        if ex.span is not None:
            ex.span.set_attribute(sc.CONTEXT_DEPTH_WIDENED_FROM, top_k)

    async def on_response(self, ex: Exchange) -> None:
        """Adaptive depth: a retrieval answer read whole loses the results past its largest score
        drop or under the floor; `x-ragtoll-depth` and the span say what was cut. With `widen`,
        a task's first pass on a query that looks weak is passed on whole and widens the task's
        next search, and the widened search's answer is passed on whole too."""
        chunks = ex.observation.chunks
        policy = self.policies.get(ex.route.upstream.name)
        trim = getattr(ex.route.adapter, "keep_results", None)
        if (policy is None or ex.call.operation != "retrieval" or chunks is None or ex.response_body is None
                or trim is None):
            return
        if policy.widen and ex.task is not None and ex.proposal is None:  # a hit is cut, never judged
            reason = self._judge(ex, policy, chunks)
            if reason:
                self._depth(ex, len(chunks), len(chunks), reason)
                return
        if not policy.depth or not chunks:
            return
        if ex.proposal is not None and (ex.task is None or ex.task.source not in NAMED_SOURCES):
            # a hit of a guessed task goes whole, as it always did: a crowd's tasks are told apart by
            # their conversations, and a search filed under the wrong one whose cut answer holds only
            # what that task has seen reads as fruitless there (eval_agents.crowd lost answers)
            return
        keep, reason = context.depth([c.score for c in chunks], gap=policy.depth_gap or 0.0,
                                     floor=policy.depth_floor or 0.0)
        if keep >= len(chunks):
            return
        body = trim(ex.response_body, keep)
        if body is None:
            return
        ex.response_body = body
        ex.observation.chunks = chunks[:keep]
        ex.tallies.results_trimmed = len(chunks) - keep
        if ex.task is not None:
            self._task(ex.task.id).results_trimmed += len(chunks) - keep
        self._depth(ex, keep, len(chunks), reason)

    def _judge(self, ex: Exchange, policy: ContextRoute, chunks: list[Any]) -> str:
        """`widened` for the task's widened search; `weak-low` / `weak-tie` for a first pass on a
        query that looks weak (the task's next search is widened); '' otherwise."""
        assert ex.task is not None
        tally = self._task(ex.task.id)
        if tally.widened is ex.call:
            tally.widened = None
            return "widened"
        query = ex.call.query_key or ex.call.query
        if tally.widen or not query or hash(query) in tally.queries or len(tally.queries) >= MAX_QUERIES:
            return ""
        tally.queries.add(hash(query))
        weak = context.weak([c.score for c in chunks], floor=policy.widen_floor or 0.0,
                            margin=policy.widen_margin or 0.0)
        if not weak:
            return ""
        tally.widen = "pending"
        return f"weak-{weak}"

    def _depth(self, ex: Exchange, kept: int, returned: int, reason: str) -> None:
        ex.response_headers.append((DEPTH_HEADER, f"kept={kept}, returned={returned}, reason={reason}".encode()))
        if ex.span is not None:
            ex.span.set_attributes({sc.CONTEXT_DEPTH_KEPT: kept, sc.CONTEXT_DEPTH_RETURNED: returned,
                                    sc.CONTEXT_DEPTH_REASON: reason})

    async def on_end(self, ex: Exchange) -> None:
        if self.notes and ex.task is not None and ex.budget_left:
            self._task(ex.task.id).budget_left = dict(ex.budget_left)
        if ex.task is None or ex.status != 200 or ex.call.operation not in _LLM:
            return
        u = ex.observation.usage
        if u is None or not u.input_tokens:
            return
        tally = self._task(ex.task.id)
        tally.llm_calls += 1
        tally.input_tokens += u.input_tokens
        tally.cached_input_tokens += u.cached_input_tokens or 0
        tally.cache_write_tokens += u.cache_write_tokens or 0
        if ex.span is not None:
            ex.span.set_attribute(sc.CONTEXT_CACHED_SHARE, round((u.cached_input_tokens or 0) / u.input_tokens, 4))

    def annotate(self, record: dict[str, Any]) -> None:
        """A task ended: its record's `context` object is the task ledger's (every replica's calls,
        `task_record`); where the ledger holds none, this process's numbers (before it is written)."""
        tally = self._tasks.get(str(record.get("task_id")))
        if tally is not None and record.get("context") is None:
            record["context"] = tally.record()

    def on_task_end(self, task_id: str) -> None:
        self._tasks.pop(task_id, None)

    def _task(self, task_id: str) -> Tally:
        tally = self._tasks.get(task_id)
        if tally is None:
            tally = self._tasks[task_id] = Tally()
            while len(self._tasks) > MAX_TASKS:
                self._tasks.popitem(last=False)
        else:
            self._tasks.move_to_end(task_id)
        return tally
