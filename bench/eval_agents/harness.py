"""Runs the workload through ragtoll: the stack, ragtoll's config per run, the agents, and what each
run leaves behind (task records, per-call spans, the agents' own logs).

The stack is the demo's (ragtoll.proxy.tools.demo.services) on loopback: BM25 retrieval over the
demo corpus plus data/corpus_extra.jsonl, the Cohere-shaped reranker, and the OpenAI-compatible
scripted LLM, here answering with `policies.decide`. ragtoll runs in-process (`build_app`) in front
of it with the demo's routes, prices and identity mode; budgets and cache come from the config
under test. Per call, ragtoll's own span (read from an in-memory exporter) gives the call's cost,
so the harness can price a prefix of a task (the oracle) in ragtoll's numbers.
"""

from __future__ import annotations

import contextlib
import copy
import os
import secrets
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import orjson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.tools import report
from ragtoll.proxy.tools.demo import scoring as demo_scoring
from ragtoll.proxy.tools.demo import services
from ragtoll.proxy.tools.demo.corpus import PRINCIPALS
from ragtoll.proxy.tools.demo.runner import PRICING
from ragtoll.proxy.tools.demo.serving import serve

from . import agents, anthropic_side, policies, provider
from .workload import Gold, Task, load_chunks

CALL_OPERATIONS = ("chat", "retrieval", "rerank")


@dataclass
class Stack:
    llm: str
    docs: str
    rerank: str
    # the context eval's stack: the LLM behind a prompt cache (its per-task ledger), agents with a
    # fixed preamble, chunks of realistic size (provider.py); None: the plain stack
    ledger: provider.Ledger | None = None
    preamble: str = ""
    api: str = "openai"  # the LLM's API: openai, or anthropic (anthropic_side.py)


def write_results(path: str, out: dict[str, Any]) -> None:
    """An evaluation's JSON results at `path` (its folder made if missing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")


@contextlib.contextmanager
def stack_up(prompt_cache: provider.OpenAIPromptCache | provider.AnthropicPromptCache | None = None,
             chunk_tokens: int = 0) -> Iterator[Stack]:
    """The stack; with `prompt_cache`, the context eval's (the LLM behind that cache, OpenAI's or
    Claude's API by the cache's kind, agents with provider.PREAMBLE, retrieved chunks padded to
    `chunk_tokens`)."""
    ledger = provider.Ledger() if prompt_cache is not None else None
    llm_app: Any = services.llm_app(policies.decide)
    docs_app: Any = services.retrieval_app(load_chunks())
    api = "anthropic" if isinstance(prompt_cache, provider.AnthropicPromptCache) else "openai"
    if isinstance(prompt_cache, provider.AnthropicPromptCache) and ledger is not None:
        llm_app = anthropic_side.llm_app(prompt_cache, ledger, agents_preamble_tokens())
    elif prompt_cache is not None and ledger is not None:
        llm_app = provider.openai_provider(llm_app, prompt_cache, ledger, agents_preamble_tokens())
    if prompt_cache is not None and chunk_tokens:
        docs_app = provider.padded_retrieval(docs_app, chunk_tokens)
    with (
        serve(llm_app) as llm,
        serve(docs_app) as docs,
        serve(services.rerank_app()) as rr,
    ):
        yield Stack(llm, docs, rr, ledger, provider.PREAMBLE if prompt_cache is not None else "", api)


def agents_preamble_tokens() -> int:
    from ragtoll.proxy.core import tokens

    return tokens.count(provider.PREAMBLE)


def routes(stack: Stack) -> list[dict[str, Any]]:
    """The demo's three routes (docs/evaluations.md, "The config the demo builds")."""
    return [
        {"name": "llm", "kind": "llm", "api": stack.api, "url": stack.llm, "prefix": "/llm"},
        {
            "name": "docs", "kind": "retrieval", "api": "json", "url": stack.docs, "prefix": "/docs",
            "fields": {"query": "query", "top_k": "top_k", "results": "results", "id": "id", "text": "text",
                       "score": "score", "acl": "metadata.groups", "version_header": "x-index-version"},
        },
        {"name": "rerank", "kind": "rerank", "api": "cohere", "url": stack.rerank, "prefix": "/rerank"},
    ]


def settings_for(
    stack: Stack, raw: Mapping[str, Any], *, shadow: bool, records_file: str, token_file: str
) -> config.Settings:
    """ragtoll's settings for one run: the config under test (`raw`, a parsed YAML mapping; empty =
    the embedded defaults), with the harness's routes, admin token, records file, identity mode and
    the demo's prices for what the config does not price. Shadow: every profile in `mode: shadow`,
    the evidence cache off (the baseline). Enforced: as configured."""
    doc = copy.deepcopy(dict(raw))
    doc["upstreams"] = routes(stack)
    doc["server"] = {**doc.get("server", {}), "host": "127.0.0.1"}
    doc["admin"] = {"token_file": token_file}
    doc["tasks"] = {"untracked": "reject", "idle_timeout_s": 300}
    doc["identity"] = {"mode": "header"}
    doc["pricing"] = {**copy.deepcopy(PRICING), **doc.get("pricing", {})}
    budgets = doc.setdefault("budgets", {})
    budgets["records_file"] = records_file
    if shadow:
        budgets["mode"] = "shadow"
        for profile in (budgets.get("profiles") or {}).values():
            if isinstance(profile, dict):
                profile.pop("mode", None)
        doc["cache"] = {**doc.get("cache", {}), "enabled": False}
        doc.setdefault("context", {"enabled": False})  # the baseline rewrites nothing either
    return config.parse(doc)


class Attempts:
    """httpx request hook of the agents' SDK client: LLM requests sent per task, and how many of
    them were the SDK's retries (the openai SDK numbers each attempt in `x-stainless-retry-count`)."""

    def __init__(self) -> None:
        self.sent: Counter[str] = Counter()
        self.retries: Counter[str] = Counter()

    def __call__(self, request: httpx.Request) -> None:
        task = _baggage_task(request.headers.get("baggage", ""))
        self.sent[task] += 1
        if request.headers.get("x-stainless-retry-count", "0") not in ("", "0"):
            self.retries[task] += 1


def _baggage_task(baggage: str) -> str:
    for member in baggage.split(","):
        key, _, value = member.strip().partition("=")
        if key == "ragtoll.task.id":
            return value
    return ""


@dataclass(frozen=True)
class CallSpan:
    operation: str  # chat | retrieval | rerank
    cost_usd: float  # 0 when ragtoll rejected the call (no upstream call, nothing settled)
    resent_tokens: int = 0  # LLM calls: prompt tokens of evidence an earlier prompt already sent (the landfill)


@dataclass
class TaskRun:
    task: Task
    task_id: str
    answer: str | None
    stopped: str | None
    correct: bool
    tool_log: list[agents.ToolCall]
    tool_errors: list[str]
    llm_sent: int  # LLM requests the SDK sent (retries included)
    sdk_retries: int
    calls: list[CallSpan]  # ragtoll's call spans of the task, in order
    record: dict[str, Any]  # ragtoll's task record


def run_workload(
    stack: Stack, label: str, tasks: list[Task], gold: Mapping[str, Gold], raw: Mapping[str, Any], *,
    shadow: bool, workdir: str,
) -> tuple[list[TaskRun], str]:
    """Every task through ragtoll, one fresh ragtoll per style (so the evidence cache, when the
    config turns it on, serves a task what its own or an earlier task of its style fetched, never
    what another style's agent fetched: fatal and passes ask the same questions); returns the runs
    and the path of the task records."""
    records_file = os.path.join(workdir, f"{label}.jsonl")
    token_file = os.path.join(workdir, "admin-token")
    if not os.path.exists(token_file):
        with open(token_file, "w") as fh:
            fh.write(secrets.token_urlsafe(24))
    with open(token_file) as fh:
        token = fh.read().strip()
    settings = settings_for(stack, raw, shadow=shadow, records_file=records_file, token_file=token_file)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    attempts = Attempts()
    partial: list[tuple[Task, str, agents.Result, bool, agents.LoggedTools]] = []
    styles = list(dict.fromkeys(t.style for t in tasks))
    for style in styles:
        app = build_app(settings, tracer_provider=provider)
        with (
            serve(app) as base,
            openai.OpenAI(
                base_url=f"{base}/llm/v1", api_key="sk-eval-not-a-real-key", timeout=60,
                http_client=openai.DefaultHttpxClient(event_hooks={"request": [attempts]}),
            ) as llm,  # SDK defaults otherwise: max_retries=2
            httpx.Client(timeout=60) as http,
        ):
            for task in (t for t in tasks if t.style == style):
                task_id = f"eval-{label}-{task.id}"
                headers = {
                    "baggage": f"ragtoll.task.id={task_id}",
                    "x-auth-subject": task.principal,
                    "x-auth-groups": ",".join(PRINCIPALS[task.principal]),
                    "x-eval-task": task_id,  # ragtoll never forwards baggage to an untrusted upstream
                }
                tools = agents.LoggedTools(http, base, headers)
                if stack.api == "anthropic":
                    import anthropic  # only the Anthropic-style provider needs it (not in the demo extra)

                    with anthropic.Anthropic(base_url=f"{base}/llm", api_key="sk-ant-eval-not-a-real-key",
                                             timeout=60, max_retries=2) as claude:
                        result = anthropic_side.run(task.style, claude, tools, task.question, stack.preamble)
                else:
                    result = agents.run(task.style, llm, tools, task.question, stack.preamble)
                correct = demo_scoring.judge(result.answer, gold[task.id].answer)
                resp = http.post(f"{base}/admin/tasks/{task_id}/end", json={"correct": correct},
                                 headers={"authorization": f"Bearer {token}"})
                if resp.status_code != 200:
                    raise RuntimeError(f"ending task {task_id} failed: HTTP {resp.status_code} {resp.text[:300]}")
                partial.append((task, task_id, result, correct, tools))
    provider.shutdown()
    calls: dict[str, list[tuple[int, CallSpan]]] = {}
    for span in exporter.get_finished_spans():
        attrs = span.attributes or {}
        op = attrs.get("gen_ai.operation.name")
        if op in CALL_OPERATIONS and "ragtoll.task.id" in attrs:
            calls.setdefault(str(attrs["ragtoll.task.id"]), []).append(
                (span.start_time or 0, CallSpan(str(op), float(attrs.get("ragtoll.cost.usd", 0.0)),
                                                int(attrs.get("ragtoll.evidence.duplicate_tokens", 0)))))
    records = {r["task_id"]: r for r in report.read_jsonl(records_file)}
    runs = []
    for task, task_id, result, correct, tools in partial:
        if task_id not in records:
            raise RuntimeError(f"no task record for {task_id} in {records_file}")
        runs.append(TaskRun(
            task, task_id, result.answer, result.stopped, correct, tools.log, result.tool_errors,
            attempts.sent[task_id], attempts.retries[task_id],
            [c for _, c in sorted(calls.get(task_id, []), key=lambda sc: sc[0])], records[task_id],
        ))
    return runs, records_file
