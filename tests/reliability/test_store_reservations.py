"""Reservations survive store trouble: with the store paused (SIGSTOP: it answers nothing, then
works through its backlog) or killed and restarted under load, in both `on_store_error` modes, the
ledger ends equal to the calls the budget admitted - no phantom step for a call that got a 503 or
went on unbudgeted although its reserve ran on the store later - and nothing stays in flight."""

from __future__ import annotations

import uuid

import httpx
import pytest
from conftest import ProxyFactory
from support.admin import ledger
from support.faulty import FaultyUpstream, routes
from support.load import Answer, run_load
from support.poll import wait_until
from support.redis_server import stop_all
from test_store_faults import BUDGETS, STORE_TIMEOUT_MS, durable_redis, load_until_recovered, pause, resume

pytestmark = pytest.mark.usefixtures("admin_token")


def admitted(answers: list[Answer], task: str) -> int:
    """Calls of `task` the budget admitted: answered by the upstream with the budget header."""
    return sum(1 for a in answers if a.task == task and a.status == 200 and a.budgeted)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["open", "closed"])
@pytest.mark.parametrize("fault", ["pause", "kill"])
def test_a_store_fault_leaves_the_ledger_equal_to_the_admitted_calls(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                                     mode: str, fault: str) -> None:
    server = durable_redis()  # a kill loses nothing it acknowledged: the ledger outlives the restart
    tasks = [f"res-{mode}-{fault}-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    if fault == "kill":
        schedule = [(0.6, server.stop), (1.6, server.start)]
    else:
        schedule = [(0.6, lambda: pause(server)), (1.6, lambda: resume(server))]
    try:
        with proxy(upstreams=routes(faulty.url), store=server.url, on_store_error=mode,
                   store_timeout_ms=STORE_TIMEOUT_MS, budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
            before = len(faulty.seen)
            answers = run_load(base, tasks, 3.0, schedule)
            load_until_recovered(base, tasks, answers)
            forwarded = len(faulty.seen) - before

            def reconciled() -> bool:  # cancels and settles the fault held up reach the store
                for t in tasks:
                    used = ledger(http, base, t)
                    if used["in_flight"] != 0 or used["used"]["steps"] != admitted(answers, t):
                        return False
                return True

            wait_until(reconciled, 20, interval=0.2)
            ledgers = {t: ledger(http, base, t) for t in tasks}
    finally:
        if fault == "pause" and server.proc and server.proc.poll() is None:
            resume(server)
        stop_all([server])
    unbudgeted = [a for a in answers if not a.budgeted]
    assert unbudgeted, "the fault was not felt"
    for t in tasks:
        calls = admitted(answers, t)
        used = ledgers[t]["used"]
        assert (used["steps"], used["calls"], ledgers[t]["in_flight"]) == (calls, calls, 0), (t, ledgers[t], calls)
    if mode == "closed":
        assert {a.status for a in unbudgeted} == {503}
        assert forwarded == sum(1 for a in answers if a.status == 200)  # a refused call never reached the upstream
