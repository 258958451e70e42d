"""Restart safety: a ragtoll process (the real `ragtoll serve`) killed with SIGKILL in the middle
of load and started again on the same port.

With Redis, every task's budget continues where it was: nothing admitted is forgotten, and the
only trace of the crash is the reservations of the calls that were in flight at the kill (their
settle never ran). With the memory store the budgets are lost with the process - documented.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest
from support.admin import ADMIN_TOKEN, ledger
from support.faulty import FaultyUpstream
from support.load import Answer, background_load
from support.poll import wait_until
from support.process import RagtollProcess

LOAD = 20  # calls admitted on each side of the kill


def config(tmp: Path, upstream: str, store: str) -> dict[str, object]:
    return {
        "store": store, "store_timeout_ms": 500,
        "budgets": {"default_profile": "p", "profiles": {"p": {"max_steps": 10_000}},
                    "records_file": str(tmp / "records.jsonl")},
        "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream, "prefix": "/openai"}],
    }


def admitted(answers: list[Answer]) -> int:
    return sum(1 for a in answers if a.status == 200 and a.budgeted)


def lost(answers: list[Answer]) -> int:
    """Calls in flight when the process died (or refused while it was down)."""
    return sum(1 for a in answers if a.status == 0)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["redis", "memory"])
def test_killed_and_restarted_mid_load(tmp_path: Path, faulty: FaultyUpstream, redis_url: str, store: str) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/10" if store == "redis" else "memory"
    task = f"restart-{uuid.uuid4().hex[:8]}"
    rt = RagtollProcess(tmp_path, config(tmp_path, faulty.url, url), env={"RAGTOLL_ADMIN_TOKEN": ADMIN_TOKEN})
    try:
        rt.start()
        with background_load(rt.base, [task] * 4) as answers:
            assert wait_until(lambda: admitted(answers) >= LOAD, timeout=30)  # the load is running
            rt.kill()  # mid-load: calls are in flight
            before_kill = admitted(answers)
            rt.start()
            assert wait_until(lambda: admitted(answers) >= before_kill + LOAD, timeout=30)  # and runs again
        # the load has stopped, each worker's last call answered; a call's settle follows its answer
        with httpx.Client(timeout=10) as http:
            wait_until(lambda: ledger(http, rt.base, task)["in_flight"] <= lost(answers))
            after = ledger(http, rt.base, task)
    finally:
        rt.stop()
    assert before_kill > 0 and admitted(answers) > before_kill  # load ran on both sides of the kill
    steps = after["used"]["steps"]
    if store == "redis":
        # every admitted call is still counted; the only extra are calls in flight at the kill
        assert admitted(answers) <= steps <= admitted(answers) + lost(answers)
        assert after["in_flight"] <= lost(answers)  # reservations of the killed process stay until the task ends
    else:
        # documented loss: the new process starts the task from zero
        assert steps == admitted(answers) - before_kill
