"""An unchanged agent (openai SDK + requests) in a subprocess, with and without the zero-code hook.

Under `opentelemetry-instrument` ragtoll's `opentelemetry_post_instrument` hook makes every call
carry the task: all calls, from the main thread, a thread pool and asyncio, form one ragtoll task.
Without it the proxy can only guess (tier 0: session heuristic).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from opentelemetry.trace import SpanKind
from ragtoll.proxy.request.identify import derived_span_id, derived_trace_id
from support.otlp import OtlpReceiver
from support.servers import serve_in_thread

AGENT = Path(__file__).parent / "agents" / "legacy_agent.py"
INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")
CALLS = ["chat", "search", "chat thread 0", "chat thread 1", "chat async", "echo"]
ADMIN = "zero-code-admin-token"
BUDGETS = {"default_profile": "bounded",
           "profiles": {"bounded": {"max_steps": 8}, "tight": {"max_steps": 6, "max_calls": 10}}}


@dataclass
class AgentRun:
    tasks: dict[str, str]  # call -> x-ragtoll-task-id
    stderr: str
    agent_spans: list[dict[str, Any]]


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    with serve_in_thread(receiver) as url:
        receiver.url = url  # type: ignore[attr-defined]
        yield receiver


def run_agent(base: str, otlp: OtlpReceiver, *, instrumented: bool, **extra: str) -> AgentRun:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAGTOLL_", "OPENAI_"))
           and k not in ("TRACEPARENT", "TRACESTATE", "BAGGAGE")}
    env.update(
        OPENAI_BASE_URL=f"{base}/openai/v1", OPENAI_API_KEY="sk-test",
        DOCS_URL=f"{base}/raw", TRUSTED_URL=f"{base}/trusted",
        # the agent's own spans go to a loopback receiver (what Jaeger would get)
        OTEL_SERVICE_NAME="legacy-agent", OTEL_EXPORTER_OTLP_ENDPOINT=otlp.url,  # type: ignore[attr-defined]
        OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
        OTEL_BSP_SCHEDULE_DELAY="50",
    )
    env.update(extra)
    cmd = [sys.executable, str(AGENT)]
    if instrumented:
        cmd = [INSTRUMENT, *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    tasks = {line["call"]: line["task"] for line in lines}
    assert sorted(tasks) == sorted(CALLS), done.stdout
    return AgentRun(tasks, done.stderr, list(otlp.spans))


def call_spans(telemetry: Telemetry) -> list[Any]:
    return [s for s in telemetry.spans()
            if "ragtoll.task.id" in (s.attributes or {}) and s.name != "ragtoll.task"]


@pytest.mark.slow
def test_agent_under_opentelemetry_instrument_is_one_task_with_env_budget(
    proxy: ProxyFactory, telemetry: Telemetry, upstream: Upstream, otlp: OtlpReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", ADMIN)  # read by the in-process proxy, not passed to the agent
    with proxy(budgets=BUDGETS) as base:
        run = run_agent(base, otlp, instrumented=True, RAGTOLL_TASK_ROOT="process",
                        RAGTOLL_BUDGET_PROFILE="tight", RAGTOLL_BUDGET_MAX_STEPS="4")
        ended = httpx.post(f"{base}/admin/tasks/{run.tasks['chat']}/end",
                           headers={"authorization": f"Bearer {ADMIN}"})
        assert ended.status_code == 200, ended.text
    assert len(set(run.tasks.values())) == 1, run.tasks
    task_id = run.tasks["chat"]
    spans = call_spans(telemetry)
    assert len(spans) == len(CALLS)
    assert {s.attributes["ragtoll.task.id"] for s in spans} == {task_id}
    assert {s.attributes["ragtoll.task.source"] for s in spans} <= {"baggage", "traceparent"}
    # the budget stage chose the env's profile and applied the env's lower max_steps to the task
    assert {s.attributes["ragtoll.budget.profile"] for s in spans} == {"tight"}
    assert {s.attributes["ragtoll.budget.profile.source"] for s in spans} == {"baggage"}
    assert {s.attributes["ragtoll.budget.max_steps.limit"] for s in spans} == {4}
    steps_used = sorted(s.attributes["ragtoll.budget.max_steps.used"] for s in spans
                        if s.attributes["gen_ai.operation.name"] == "chat")
    assert steps_used == [1, 2, 3, 4]  # four LLM calls, counted in one task from all threads
    # one trace: the process root's; the task id is that trace id (as a traceparent task would be)
    assert {f"{s.context.trace_id:032x}" for s in telemetry.spans()} == {task_id}
    # the profile and limit from env reached the proxy (the trusted upstream sees what arrived)
    echo = next(r for r in upstream.app.state.requests if r["path"] == "/echo")
    members = dict(m.split("=", 1) for m in echo["headers"]["baggage"].split(","))
    assert members["ragtoll.budget.profile"] == "tight"
    assert members["ragtoll.budget.max_steps"] == "4"
    assert members["ragtoll.task.id"] == task_id
    # the agent's spans and the proxy's join into one tree with one root, the proxy's task span:
    # ragtoll.task -> the agent's process span -> agent HTTP span -> proxy server span -> call span
    (summary,) = telemetry.by_name("ragtoll.task")
    assert summary.parent is None and f"{summary.context.trace_id:032x}" == task_id
    assert summary.context.span_id == derived_span_id(task_id)
    (process,) = [s for s in run.agent_spans if s["name"] == "task legacy_agent.py"]
    assert process["parent_span_id"] == f"{summary.context.span_id:016x}"
    clients = {s["span_id"]: s for s in run.agent_spans if s["name"] in ("POST", "GET")}
    assert len(clients) == len(CALLS)
    assert {s["parent_span_id"] for s in clients.values()} == {process["span_id"]}
    servers = [s for s in telemetry.spans() if s.kind == SpanKind.SERVER]
    assert {f"{s.parent.span_id:016x}" for s in servers} == set(clients)
    parents = {s["span_id"]: s["parent_span_id"] for s in run.agent_spans if s["trace_id"] == task_id}
    parents.update({f"{s.context.span_id:016x}": f"{s.parent.span_id:016x}" if s.parent else ""
                    for s in telemetry.spans()})
    roots = [span for span, parent in parents.items() if parent not in parents]
    assert roots == [f"{summary.context.span_id:016x}"]


@pytest.mark.slow
def test_task_id_from_env_puts_agent_spans_under_the_task_root(
    proxy: ProxyFactory, telemetry: Telemetry, otlp: OtlpReceiver
) -> None:
    with proxy() as base:
        run = run_agent(base, otlp, instrumented=True, RAGTOLL_TASK_ID="ticket-7")
    assert set(run.tasks.values()) == {"ticket-7"}
    spans = call_spans(telemetry)
    assert {s.attributes["ragtoll.task.source"] for s in spans} == {"baggage"}
    # the derived trace and virtual root the proxy uses for a named task, so the proxy's
    # ragtoll.task span (which takes the virtual root's id) is the parent of the agent's calls too
    assert {s.context.trace_id for s in telemetry.spans()} == {derived_trace_id("ticket-7")}
    clients = [s for s in run.agent_spans if s["name"] in ("POST", "GET")]
    assert len(clients) == len(CALLS)
    assert {s["parent_span_id"] for s in clients} == {f"{derived_span_id('ticket-7'):016x}"}


@pytest.mark.slow
def test_without_the_hook_the_proxy_falls_back_to_session_heuristics(
    proxy: ProxyFactory, telemetry: Telemetry, otlp: OtlpReceiver
) -> None:
    with proxy(budgets=BUDGETS, tasks={"untracked": "session"}) as base:
        run = run_agent(base, otlp, instrumented=False, RAGTOLL_BUDGET_PROFILE="tight")
    spans = call_spans(telemetry)
    assert {s.attributes["ragtoll.task.source"] for s in spans} == {"session"}
    # nothing carried the env's profile: every session got the default
    assert {s.attributes["ragtoll.budget.profile"] for s in spans} == {"bounded"}
    # tier 0 is a heuristic keyed on client, user agent and credential: the sync SDK's calls
    # (main thread and pool) are one session, but requests and the async SDK send other user
    # agents, so one run of the agent shows up as three "tasks"
    assert run.tasks["chat"] == run.tasks["chat thread 0"] == run.tasks["chat thread 1"]
    assert run.tasks["search"] == run.tasks["echo"]
    assert len(set(run.tasks.values())) == 3
    assert run.agent_spans == []


@pytest.mark.slow
def test_instrumented_without_ragtolls_hook_splits_every_call(
    proxy: ProxyFactory, telemetry: Telemetry, otlp: OtlpReceiver
) -> None:
    # opentelemetry-instrument alone (hook disabled): each call is a root span of its own trace,
    # so each becomes its own traceparent task - why a CLI agent wants RAGTOLL_TASK_ROOT=process
    with proxy() as base:
        run = run_agent(base, otlp, instrumented=True, OTEL_PYTHON_DISABLED_INSTRUMENTATIONS="ragtoll",
                        RAGTOLL_TASK_ROOT="process")
    assert len(set(run.tasks.values())) == len(CALLS)
    assert {s.attributes["ragtoll.task.source"] for s in call_spans(telemetry)} == {"traceparent"}


@pytest.mark.slow
def test_bad_env_values_are_reported_and_the_agent_still_runs(
    proxy: ProxyFactory, upstream: Upstream, otlp: OtlpReceiver
) -> None:
    with proxy() as base:
        run = run_agent(base, otlp, instrumented=True, RAGTOLL_TASK_ID="ticket-9",
                        RAGTOLL_BUDGET_MAX_STEPZ="4", RAGTOLL_BUDGET_MAX_CALLS="lots",
                        RAGTOLL_BUDGET_HMAC_KEY="never-sent")
    assert set(run.tasks.values()) == {"ticket-9"}
    assert "RAGTOLL_BUDGET_MAX_STEPZ ignored: not a budget dimension" in run.stderr
    assert "RAGTOLL_BUDGET_MAX_CALLS='lots' ignored: expected an integer >= 0" in run.stderr
    echo = next(r for r in upstream.app.state.requests if r["path"] == "/echo")
    assert echo["headers"]["baggage"] == "ragtoll.task.id=ticket-9"
    assert "never-sent" not in json.dumps(upstream.app.state.requests, default=str)
