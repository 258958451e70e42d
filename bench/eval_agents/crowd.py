"""Many users behind one key, no task ids: does ragtoll still tell their tasks apart? (issue 31)

    python -m bench.eval_agents.crowd [--users 8] [--quick] [--styles lean,runaway] [--out FILE]

The workload of `python -m bench.eval_agents` (its agent styles, tasks and scripted model) runs
three ways against ragtoll's embedded defaults:
  * traced: each task in its own trace (baggage), one at a time: the harness's shadow run (the
    baseline cost) and its enforced run (the savings to match);
  * crowd: N users share one process, one API key and one ragtoll, each running tasks one after
    another, all at once; no trace context, no task header; the model client sends nothing per
    user (the app's search client names the user's groups to the index, as a gateway would);
  * before: the same crowd under the old default (`tasks.untracked: session`, every limit enforced).
Per call, the harness knows the task it belongs to (ground truth) and reads the task ragtoll gave
it (the `x-ragtoll-task-id` response header). Attributed right: the call carries its task's main
ragtoll id, and no other task's calls carry that id more than its own do.
Prints the numbers and writes them as JSON.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import copy
import os
import queue
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.tools.demo import scoring as demo_scoring
from ragtoll.proxy.tools.demo.corpus import PRINCIPALS
from ragtoll.proxy.tools.demo.runner import PRICING
from ragtoll.proxy.tools.demo.serving import serve

from . import agents, harness
from .workload import STYLES, Task, load_gold, load_tasks

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "eval_crowd.json")
KEY = "sk-one-key-for-every-user"


@dataclass
class Seen:
    """One call as the harness saw it: the task it belongs to, and what ragtoll answered."""

    truth: str
    inferred: str
    path: str
    status: int
    finished: bool  # x-ragtoll-budget-finished: ragtoll asked the model to answer now
    source: str = ""


@dataclass
class Log:
    calls: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    local: threading.local = field(default_factory=threading.local)

    def hook(self, response: httpx.Response) -> None:
        truth = getattr(self.local, "task", None)
        if truth is None:
            return
        with self.lock:
            self.calls.append(
                Seen(
                    truth,
                    response.headers.get("x-ragtoll-task-id", ""),
                    response.request.url.path,
                    response.status_code,
                    "x-ragtoll-budget-finished" in response.headers,
                )
            )


class CrowdTools(agents.LoggedTools):
    """The demo's tools as one app serving many users: the model client sends nothing per user
    (`headers` is empty, so `agents.run` adds nothing to model calls); the search client names the
    user to the index (its gateway's identity headers)."""

    def __init__(self, http: httpx.Client, base: str, identity: dict[str, str]) -> None:
        super().__init__(http, base, {})
        self._identity = identity

    def _post(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        self.headers = self._identity
        try:
            return super()._post(path, body)
        finally:
            self.headers = {}


def crowd_settings(stack: harness.Stack, records: str, token_file: str, untracked: str) -> config.Settings:
    """ragtoll's embedded defaults with the harness's routes, prices and identity mode; no task ids."""
    doc: dict[str, Any] = {
        "upstreams": harness.routes(stack),
        "server": {"host": "127.0.0.1"},
        "admin": {"token_file": token_file},
        "identity": {"mode": "header"},
        "pricing": copy.deepcopy(PRICING),
        "budgets": {"records_file": records},
        "tasks": {
            "untracked": untracked,
            "idle_timeout_s": 300,
            **({"session_budgets": "full"} if untracked == "session" else {}),
        },
    }
    return config.parse(doc)


@dataclass
class CrowdRun:
    label: str
    seconds: float
    calls: list[Seen]
    correct: dict[str, bool]  # task id -> judged correct
    cost_usd: float  # every call span's cost


def run_crowd(
    stack: harness.Stack, label: str, tasks: list[Task], users: int, workdir: str, untracked: str
) -> CrowdRun:
    token_file = os.path.join(workdir, "admin-token")
    with open(token_file, "w") as fh:
        fh.write("crowd-admin-token-0123456789abcdef")
    settings = crowd_settings(stack, os.path.join(workdir, f"{label}.jsonl"), token_file, untracked)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gold = load_gold()
    log = Log()
    todo: queue.Queue[Task] = queue.Queue()
    for t in tasks:
        todo.put(t)
    correct: dict[str, bool] = {}
    app = build_app(settings, tracer_provider=provider)
    t0 = time.perf_counter()

    def user(n: int) -> None:
        with (
            openai.OpenAI(
                base_url=f"{base}/llm/v1",
                api_key=KEY,
                timeout=60,
                http_client=openai.DefaultHttpxClient(event_hooks={"response": [log.hook]}),
            ) as llm,
            httpx.Client(timeout=60, event_hooks={"response": [log.hook]}) as http,
        ):
            while True:
                try:
                    task = todo.get_nowait()
                except queue.Empty:
                    return
                log.local.task = task.id
                identity = {
                    "x-auth-subject": task.principal,
                    "x-auth-groups": ",".join(PRINCIPALS[task.principal]),
                }
                result = agents.run(task.style, llm, CrowdTools(http, base, identity), task.question)
                log.local.task = None
                correct[task.id] = demo_scoring.judge(result.answer, gold[task.id].answer)

    with serve(app) as base, concurrent.futures.ThreadPoolExecutor(users) as pool:
        for f in [pool.submit(user, n) for n in range(users)]:
            f.result()
    provider.shutdown()
    cost = sum(
        float((s.attributes or {}).get("ragtoll.cost.usd", 0.0))
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("gen_ai.operation.name") in harness.CALL_OPERATIONS
    )
    sources = {}
    for s in exporter.get_finished_spans():
        a = s.attributes or {}
        if a.get("gen_ai.operation.name") in harness.CALL_OPERATIONS:
            sources.setdefault(str(a.get("ragtoll.task.id")), collections.Counter())[
                str(a.get("ragtoll.task.source"))
            ] += 1
    return CrowdRun(label, time.perf_counter() - t0, log.calls, correct, cost)


def attribution(calls: list[Seen]) -> tuple[int, int]:
    """(calls attributed to their own task, calls): a call is right when it carries its task's
    main ragtoll id (the one most of its calls carry), and that id is no other task's main id
    with more of that task's calls (two tasks merged: the smaller one's calls are wrong)."""
    by_truth: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for c in calls:
        by_truth[c.truth][c.inferred] += 1
    main = {t: ids.most_common(1)[0][0] for t, ids in by_truth.items()}
    owner: dict[str, tuple[int, str]] = {}
    for t, inferred in main.items():
        n = by_truth[t][inferred]
        if inferred not in owner or n > owner[inferred][0]:
            owner[inferred] = (n, t)
    right = sum(1 for c in calls if c.inferred == main[c.truth] and owner[main[c.truth]][1] == c.truth)
    return right, len(calls)


def summary(
    run: CrowdRun,
    tasks: list[Task],
    shadow_ok: dict[str, bool],
    shadow_cost: float,
    shadow_llm: dict[str, int],
) -> dict[str, Any]:
    right, n = attribution(run.calls)
    refused = [c for c in run.calls if c.status in (402, 429)]
    style = {t.id: t.style for t in tasks}
    lost = sorted(t for t, ok in shadow_ok.items() if ok and not run.correct.get(t))
    llm = collections.Counter(c.truth for c in run.calls if c.path.endswith("/chat/completions"))
    runaways = [t.id for t in tasks if t.style == "runaway"]
    stopped = [
        t for t in runaways if any(c.finished or c.status in (402, 429) for c in run.calls if c.truth == t)
    ]
    return {
        "calls": n,
        "attributed": right,
        "attributed_pct": round(100 * right / n, 2) if n else 0.0,
        "ragtoll_tasks": len({c.inferred for c in run.calls}),
        "true_tasks": len({c.truth for c in run.calls}),
        "refused_calls": len(refused),
        "refused_calls_by_style": dict(collections.Counter(style[c.truth] for c in refused)),
        "correct": sum(run.correct.values()),
        "correct_traced_shadow": sum(shadow_ok.values()),
        "lost_answers": lost,
        "runaway_tasks": len(runaways),
        "runaways_stopped": len(stopped),
        "runaway_llm_calls": sum(llm[t] for t in runaways),
        "runaway_llm_calls_shadow": sum(shadow_llm[t] for t in runaways),
        "cost_usd": round(run.cost_usd, 6),
        "savings_pct": round(100 * (1 - run.cost_usd / shadow_cost), 2),
        "seconds": round(run.seconds, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.eval_agents.crowd", description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=8, help="users sharing the key and the process (default 8)")
    ap.add_argument("--quick", action="store_true", help="the first 3 tasks of each style")
    ap.add_argument(
        "--styles", default=",".join(STYLES), help=f"comma-separated subset of {','.join(STYLES)}"
    )
    ap.add_argument("--no-before", action="store_true", help="skip the run under the old default (session)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="JSON results (default bench/results/eval_crowd.json)")
    args = ap.parse_args(argv)
    styles = tuple(s for s in args.styles.split(",") if s)
    tasks, gold = load_tasks(args.quick, styles), load_gold()
    w = sys.stdout.write
    w(
        f"eval_agents.crowd: {len(tasks)} tasks, {args.users} users behind one key, ragtoll's embedded defaults\n"
    )
    out: dict[str, Any] = {"tasks": len(tasks), "users": args.users, "quick": args.quick}
    with tempfile.TemporaryDirectory(prefix="ragtoll-crowd-") as tmp, harness.stack_up() as stack:
        shadow, _ = harness.run_workload(stack, "shadow", tasks, gold, {}, shadow=True, workdir=tmp)
        traced, _ = harness.run_workload(stack, "enforced", tasks, gold, {}, shadow=False, workdir=tmp)
        shadow_cost = sum(c.cost_usd for r in shadow for c in r.calls)
        traced_cost = sum(c.cost_usd for r in traced for c in r.calls)
        shadow_ok = {r.task.id: r.correct for r in shadow}
        shadow_llm = {r.task.id: sum(1 for c in r.calls if c.operation == "chat") for r in shadow}
        out["traced"] = {
            "correct": sum(r.correct for r in traced),
            "correct_shadow": sum(shadow_ok.values()),
            "lost_answers": sorted(r.task.id for r in traced if shadow_ok[r.task.id] and not r.correct),
            "cost_usd": round(traced_cost, 6),
            "shadow_cost_usd": round(shadow_cost, 6),
            "savings_pct": round(100 * (1 - traced_cost / shadow_cost), 2),
        }
        runs = [("crowd", "conversation")] + ([] if args.no_before else [("before", "session")])
        for label, untracked in runs:
            run = run_crowd(stack, label, tasks, args.users, tmp, untracked)
            out[label] = {"untracked": untracked, **summary(run, tasks, shadow_ok, shadow_cost, shadow_llm)}
    for label in ("traced", "crowd", "before"):
        if label in out:
            w(f"{label}: {orjson.dumps(out[label]).decode()}\n")
    harness.write_results(args.out, out)
    w(f"wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
