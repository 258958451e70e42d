"""The agent hook's parts in-process: env parsing, the propagator wrapper, install/uninstall."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from ragtoll.instrumentation import agent
from ragtoll.proxy.config import DIMENSIONS, TasksConfig
from ragtoll.proxy.request.identify import Identifier, derived_span_id, derived_trace_id, parse_baggage

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_env_gives_task_profile_and_limits_as_baggage_members() -> None:
    s = agent.settings_from_env({"RAGTOLL_TASK_ID": "ticket-1", "RAGTOLL_BUDGET_PROFILE": "tight",
                                 "RAGTOLL_BUDGET_MAX_STEPS": "4", "RAGTOLL_BUDGET_MAX_COST_USD": "0.02",
                                 "RAGTOLL_TASK_ROOT": "process"})
    assert dict(s.members) == {"ragtoll.task.id": "ticket-1", "ragtoll.budget.profile": "tight",
                               "ragtoll.budget.max_steps": "4", "ragtoll.budget.max_cost_usd": "0.02"}
    assert s.task_root and s.parent is None and not s.warnings


def test_bad_values_are_dropped_with_a_reason_and_secrets_never_become_members() -> None:
    s = agent.settings_from_env({"RAGTOLL_TASK_ID": "has space", "RAGTOLL_BUDGET_PROFILE": "Tight!",
                                 "RAGTOLL_BUDGET_MAX_STEPS": "4.5", "RAGTOLL_BUDGET_MAX_STEPZ": "4",
                                 "RAGTOLL_BUDGET_MAX_COST_USD": "-1", "RAGTOLL_BUDGET_HMAC_KEY": "secret",
                                 "RAGTOLL_BUDGETS__MODE": "shadow", "RAGTOLL_TASK_ROOT": "thread",
                                 "TRACEPARENT": "00-zz-01"})
    assert s.members == ()
    text = "\n".join(s.warnings)
    for fragment in ("RAGTOLL_TASK_ID ignored", "RAGTOLL_BUDGET_PROFILE='Tight!' ignored",
                     "RAGTOLL_BUDGET_MAX_STEPS='4.5' ignored: expected an integer",
                     "RAGTOLL_BUDGET_MAX_STEPZ ignored: not a budget dimension",
                     "RAGTOLL_BUDGET_MAX_COST_USD='-1' ignored: expected a number",
                     "RAGTOLL_TASK_ROOT='thread' ignored", "TRACEPARENT ignored"):
        assert fragment in text
    assert "secret" not in text and "HMAC" not in text


def test_dimensions_and_virtual_root_match_the_proxy() -> None:
    assert agent.DIMENSIONS == DIMENSIONS
    for task_id in ("ticket-7", "t/1+x", "é"):
        root = agent._virtual_root(task_id)
        assert (root.trace_id, root.span_id) == (derived_trace_id(task_id), derived_span_id(task_id))


def test_env_carriers_give_parent_and_baggage_and_ragtoll_env_wins() -> None:
    s = agent.settings_from_env({"TRACEPARENT": PARENT, "BAGGAGE": "ragtoll.task.id=from-parent,user=alice",
                                 "RAGTOLL_TASK_ID": "mine"})
    assert s.parent is not None and f"{s.parent.trace_id:032x}" == PARENT.split("-")[1]
    assert dict(s.members) == {"ragtoll.task.id": "mine"}
    assert s.carried_baggage == (("user", "alice"),)


def test_merge_baggage_keeps_present_members_and_escapes_values() -> None:
    merged = agent.merge_baggage("ragtoll.task.id=set-by-code,user=a", (("ragtoll.task.id", "env"),
                                                                         ("ragtoll.budget.profile", "a b")))
    assert merged == "ragtoll.task.id=set-by-code,user=a,ragtoll.budget.profile=a%20b"
    members, notes = parse_baggage(merged)
    assert dict(members)["ragtoll.budget.profile"] == "a b" and not notes


def test_the_proxy_identifies_what_the_wrapper_injects() -> None:
    wrapper = agent.RagtollPropagator(propagate.get_global_textmap(), (("ragtoll.task.id", "t/1+x"),))
    headers: dict[str, str] = {}
    wrapper.inject(headers)
    task = Identifier(TasksConfig()).identify(headers, "127.0.0.1")
    assert (task.id, task.source) == ("t/1+x", "baggage")


def test_wrapper_adds_members_and_a_fallback_traceparent_on_any_thread() -> None:
    fallback = SpanContext(0xABC, 0xDEF, is_remote=False, trace_flags=TraceFlags(1))
    wrapper = agent.RagtollPropagator(propagate.get_global_textmap(), (("ragtoll.task.id", "t1"),), fallback)
    seen: list[dict[str, str]] = []

    def call() -> None:  # a fresh thread: no OTel context at all
        headers: dict[str, str] = {}
        wrapper.inject(headers)
        seen.append(headers)

    worker = threading.Thread(target=call)
    worker.start()
    worker.join()
    assert seen[0]["baggage"] == "ragtoll.task.id=t1"
    assert seen[0]["traceparent"] == f"00-{0xABC:032x}-{0xDEF:016x}-01"
    # a valid current span wins over the fallback
    own = SpanContext(0x123, 0x456, is_remote=False, trace_flags=TraceFlags(1))
    headers: dict[str, str] = {}
    wrapper.inject(headers, trace.set_span_in_context(NonRecordingSpan(own)))
    assert headers["traceparent"].split("-")[1] == f"{0x123:032x}"
    assert {"traceparent", "baggage"} <= wrapper.fields


@pytest.fixture
def tracing() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _inject_from_thread() -> dict[str, str]:
    out: dict[str, str] = {}

    def run() -> None:
        propagate.inject(out)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return out


def test_install_with_task_id_parents_on_the_virtual_root_in_every_thread(
    tracing: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = tracing
    before = propagate.get_global_textmap()
    hook = agent.install({"RAGTOLL_TASK_ID": "ticket-3", "RAGTOLL_BUDGET_PROFILE": "tight"}, provider)
    try:
        assert hook.task_id == "ticket-3"
        for headers in (_inject_from_thread(), _inject_on_main()):
            _, trace_hex, span_hex, _ = headers["traceparent"].split("-")
            assert int(trace_hex, 16) == derived_trace_id("ticket-3")
            assert int(span_hex, 16) == derived_span_id("ticket-3")
            assert dict(parse_baggage(headers["baggage"])[0]) == {"ragtoll.task.id": "ticket-3",
                                                                 "ragtoll.budget.profile": "tight"}
        # a span the agent starts on another thread is in the task's trace too
        box: list[trace.Span] = []
        worker = threading.Thread(target=lambda: box.append(provider.get_tracer("t").start_span("work")))
        worker.start()
        worker.join()
        assert box[0].get_span_context().trace_id == derived_trace_id("ticket-3")
        box[0].end()
    finally:
        hook.uninstall()
    assert propagate.get_global_textmap() is before
    assert not trace.get_current_span().get_span_context().is_valid
    assert baggage.get_all() == {}


def _inject_on_main() -> dict[str, str]:
    out: dict[str, str] = {}
    propagate.inject(out)
    return out


def test_process_task_root_is_one_recorded_span_and_children_inherit_it(
    tracing: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider, exporter = tracing
    monkeypatch.setenv("RAGTOLL_TASK_ROOT", "process")  # install() hands the task on via os.environ
    # setenv (not delenv) so the undo removes what install() writes for child processes
    monkeypatch.setenv("TRACEPARENT", "")
    monkeypatch.setenv("BAGGAGE", "")
    hook = agent.install({"RAGTOLL_TASK_ROOT": "process", "TRACEPARENT": PARENT}, provider)
    try:
        root = hook.root_span.get_span_context()
        assert f"{root.trace_id:032x}" == PARENT.split("-")[1]  # a child of the env carrier's parent
        assert hook.task_id == PARENT.split("-")[1]
        headers = _inject_from_thread()
        assert headers["traceparent"].split("-")[2] == f"{root.span_id:016x}"
        assert os.environ["TRACEPARENT"].split("-")[2] == f"{root.span_id:016x}"
        assert "ragtoll.task.id=" in os.environ["BAGGAGE"] and "RAGTOLL_TASK_ROOT" not in os.environ
    finally:
        hook.uninstall()
    (span,) = exporter.get_finished_spans()
    assert span.name.startswith("task ") and span.attributes["ragtoll.task.id"] == hook.task_id
    assert f"{span.parent.span_id:016x}" == PARENT.split("-")[2]


def test_a_new_process_task_hangs_its_process_span_under_the_proxys_task_root(
    tracing: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch,
) -> None:
    provider, exporter = tracing
    for name in ("RAGTOLL_TASK_ROOT", "TRACEPARENT", "BAGGAGE"):  # undo what install() writes for children
        monkeypatch.setenv(name, "")
    hook = agent.install({"RAGTOLL_TASK_ROOT": "process"}, provider)
    try:
        headers = _inject_from_thread()
    finally:
        hook.uninstall()
    (span,) = exporter.get_finished_spans()
    task_id = hook.task_id
    assert task_id is not None and task_id == f"{span.context.trace_id:032x}"  # named by its trace id
    # the proxy names the task from baggage and records `ragtoll.task` at derived_span_id(task id)
    # with no parent: the process span is its child, not a second root
    assert span.parent is not None and span.parent.span_id == derived_span_id(task_id)
    assert span.parent.trace_id == span.context.trace_id
    assert headers["traceparent"].split("-")[2] == f"{span.context.span_id:016x}"
    ref = Identifier(TasksConfig()).identify(headers, "client")
    assert (ref.id, ref.source, f"{ref.trace_id:032x}") == (task_id, "baggage", task_id)


def test_process_root_without_an_sdk_still_sends_one_trace_under_the_task_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("RAGTOLL_TASK_ROOT", "TRACEPARENT", "BAGGAGE"):  # undo what install() writes for children
        monkeypatch.setenv(name, "")
    hook = agent.install({"RAGTOLL_TASK_ROOT": "process"}, trace.NoOpTracerProvider())
    try:
        first, second = _inject_from_thread(), _inject_on_main()
        assert first["traceparent"] == second["traceparent"]
        assert hook.task_id == first["traceparent"].split("-")[1]
        assert first["traceparent"].split("-")[2] == f"{derived_span_id(hook.task_id):016x}"
    finally:
        hook.uninstall()


def test_post_instrument_honours_the_disabled_list(monkeypatch: pytest.MonkeyPatch) -> None:
    before = propagate.get_global_textmap()
    monkeypatch.setenv("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "requests, ragtoll")
    monkeypatch.setenv("RAGTOLL_TASK_ID", "t")
    agent.post_instrument()
    assert propagate.get_global_textmap() is before
    assert baggage.get_all() == {} and not trace.get_current_span().get_span_context().is_valid


def test_a_signed_grant_from_env_is_sent_and_verifies_at_the_proxy() -> None:
    from ragtoll.proxy.core.signing import sign_budget, verify_budget_baggage

    key = b"k" * 32
    signed = sign_budget("ticket-5", {"max_steps": 20}, key, 4_000_000_000)
    grant = dict(m.split("=", 1) for m in signed.split(","))
    env = {"RAGTOLL_TASK_ID": "ticket-5", "RAGTOLL_BUDGET_MAX_STEPS": grant["ragtoll.budget.max_steps"],
           "RAGTOLL_BUDGET_SIG": grant["ragtoll.budget.sig"],
           "RAGTOLL_BUDGET_EXP": grant["ragtoll.budget.exp"]}
    members = dict(agent.settings_from_env(env).members)
    raises, notes = verify_budget_baggage(members, "ticket-5", key, 1_000)
    assert raises == {"max_steps": 20}, notes
    bad = agent.settings_from_env({"RAGTOLL_BUDGET_SIG": "not a signature"})
    assert bad.members == () and "RAGTOLL_BUDGET_SIG ignored" in bad.warnings[0]
