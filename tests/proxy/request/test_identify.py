"""Task identity rules, as plain calls (DESIGN.md "Task identity")."""

from __future__ import annotations

import pytest
from ragtoll.proxy.config import TasksConfig
from ragtoll.proxy.errors import TaskRequired
from ragtoll.proxy.request.identify import Identifier, derived_trace_id, parse_baggage, parse_traceparent
from support.clock import Clock

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def ident(**kw: object) -> Identifier:
    return Identifier(TasksConfig(**kw), clock=Clock())  # type: ignore[arg-type]


def test_baggage_task_id_wins_over_traceparent_and_header() -> None:
    t = ident().identify({"baggage": "ragtoll.task.id=job-7", "traceparent": TP, "x-ragtoll-task-id": "h"}, "c")
    assert (t.id, t.source) == ("job-7", "baggage")
    assert t.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736  # spans stay in the caller's trace


def test_traceparent_names_the_task() -> None:
    t = ident().identify({"traceparent": TP}, "c")
    assert (t.id, t.source) == ("4bf92f3577b34da6a3ce929d0e0e4736", "traceparent")


def test_header_task_gets_a_stable_derived_trace() -> None:
    a = ident().identify({"x-ragtoll-task-id": "ticket-1"}, "c")
    b = ident().identify({"x-ragtoll-task-id": "ticket-1"}, "other-client")
    assert a.source == "header" and a.trace_id == b.trace_id == derived_trace_id("ticket-1")


def test_custom_task_header() -> None:
    t = ident(header="X-Job").identify({"x-job": "j1"}, "c")
    assert (t.id, t.source) == ("j1", "header")


@pytest.mark.parametrize("bad", [
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # zero span id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # forbidden version
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",   # short
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    "garbage", "", "0" * 600,
])
def test_invalid_traceparent_is_ignored_and_noted(bad: str) -> None:
    assert parse_traceparent(bad) is None
    t = ident().identify({"traceparent": bad, "x-ragtoll-task-id": "fallback"}, "c")
    assert t.id == "fallback"
    if bad:
        assert "traceparent ignored: malformed" in t.notes


def test_duplicated_headers_are_ignored() -> None:
    t = ident().identify({"traceparent": f"{TP}, {TP}", "x-ragtoll-task-id": "h"}, "c",
                         frozenset({"traceparent"}))
    assert t.source == "header" and "traceparent ignored: header given more than once" in t.notes


def test_oversized_and_malformed_baggage() -> None:
    members, notes = parse_baggage("k=" + "v" * 9000)
    assert members == () and "larger than" in notes[0]
    members, notes = parse_baggage("ragtoll.task.id=a,ragtoll.task.id=b,ok=1,=bad")
    assert dict(members) == {"ok": "1"}
    assert any("given more than once" in n for n in notes)
    assert any("malformed" in n for n in notes)


@pytest.mark.parametrize("task_id", ["a" * 200, "a b", "x\r\ny", "a\x00b", "a;b", "é"])
def test_malformed_task_ids_fall_through(task_id: str) -> None:
    t = ident(untracked="per-call").identify({"x-ragtoll-task-id": task_id}, "c")
    assert t.source == "per-call"


def test_baggage_values_are_percent_decoded() -> None:
    t = ident().identify({"baggage": "ragtoll.task.id=team%3Aa%2Fb"}, "c")
    assert t.id == "team:a/b"


def test_session_groups_one_client_until_idle_timeout() -> None:
    clock = Clock()
    i = Identifier(TasksConfig(untracked="session", idle_timeout_s=60), clock=clock)
    h = {"user-agent": "agent/1", "authorization": "Bearer k"}
    first = i.identify(h, "10.0.0.1")
    clock.now += 59
    assert i.identify(h, "10.0.0.1").id == first.id
    assert i.identify(h, "10.0.0.2").id != first.id  # another client
    clock.now += 61
    later = i.identify(h, "10.0.0.1")
    assert later.id != first.id and later.source == "session"


def test_reject_policy_raises_task_required() -> None:
    with pytest.raises(TaskRequired) as info:
        ident(untracked="reject").identify({}, "c")
    assert info.value.status == 400


def test_per_call_gives_each_call_its_own_task() -> None:
    i = ident(untracked="per-call")
    assert i.identify({}, "c").id != i.identify({}, "c").id
