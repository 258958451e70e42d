"""Store faults under load, with real redis-server processes: killed and restarted, paused
(SIGSTOP: connections open, no answers), and a Redis Cluster master failing over to its replica.

`on_store_error: open` (chat and cached retrieval): no call fails because of the store - every
answer is the upstream's or the evidence cache's - calls made while it is away are forwarded and
marked degraded, and after it returns the ledger never under-counts an admitted call. `closed`:
a 503 JSON within the store timeout (+2 s of slack, never a hang), and service resumes when the
store does.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest
import redis
from conftest import ProxyFactory, Telemetry
from support.admin import ledger
from support.budget_cluster import _info, cluster_free_port, slot_range, tasks_on_masters
from support.faulty import FaultyUpstream, routes
from support.load import Answer, run_load
from support.poll import wait_until
from support.redis_server import RedisProcess, start_redis, stop_all
from support.spans import call_spans, reserve_failures

STORE_TIMEOUT_MS = 200
BUDGETS = {"default_profile": "p", "profiles": {"p": {"max_steps": 100_000, "max_completion_tokens": 10**9}}}

pytestmark = pytest.mark.usefixtures("admin_token")


def with_search(url: str) -> list[dict[str, Any]]:
    return [*routes(url), {"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs"}]


def durable_redis() -> RedisProcess:
    # every write reaches disk before the reply, so a kill -9 loses nothing that was acknowledged
    return start_redis(["--appendonly", "yes", "--appendfsync", "always"])


def pause(server: RedisProcess) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)


def resume(server: RedisProcess) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)


def latest(answers: list[Answer]) -> dict[str, Answer]:
    """Each task's last answer (a task's calls are sequential, so its answers are in order)."""
    return {a.task: a for a in answers}


def recovered(answers: list[Answer], tasks: list[str]) -> bool:
    last = latest(answers)
    return all(t in last and last[t].status == 200 and last[t].budgeted for t in tasks)


def load_until_recovered(base: str, tasks: list[str], answers: list[Answer], search: bool = False,
                         timeout: float = 30) -> None:
    """After the fault's schedule: keep calling until every task's latest answer is budgeted again
    (how soon that happens after the store returns depends on the machine's load), at most `timeout`."""
    deadline = time.monotonic() + timeout
    while not recovered(answers, tasks) and time.monotonic() < deadline:
        answers += run_load(base, tasks, 0.5, [], search=search)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_open_store_outage_under_load_fails_no_call(proxy: ProxyFactory, faulty: FaultyUpstream, telemetry: Telemetry,
                                                    fault: str) -> None:
    server = durable_redis()
    tasks = [f"open-{fault}-{i}-{uuid.uuid4().hex[:6]}" for i in range(6)]
    if fault == "kill":
        schedule = [(0.8, server.stop), (1.8, server.start)]
    else:
        schedule = [(0.8, lambda: pause(server)), (1.8, lambda: resume(server))]
    try:
        with proxy(upstreams=with_search(faulty.url), store=server.url, on_store_error="open",
                   store_timeout_ms=STORE_TIMEOUT_MS, budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
            answers = run_load(base, tasks, 4.0, schedule, search=True)
            load_until_recovered(base, tasks, answers, search=True)
            call_spans(telemetry, len(answers), tasks)  # each ends just after its response
            ledgers = {t: ledger(http, base, t) for t in tasks}
    finally:
        resume(server) if fault == "pause" and server.proc and server.proc.poll() is None else None
        stop_all([server])
    statuses = Counter(a.status for a in answers)
    assert statuses == Counter({200: len(answers)}), statuses  # not one 5xx, not one failed request
    unbudgeted = Counter(a.task for a in answers if not a.budgeted)
    assert sum(unbudgeted.values()) > 0  # the outage was felt ...
    assert recovered(answers, tasks), latest(answers)  # ... and is over: every task is budgeted again
    assert reserve_failures(telemetry) == unbudgeted  # every forwarded-without-budget call says so on its span
    for t in tasks:
        admitted = sum(1 for a in answers if a.task == t and a.budgeted)
        calls = ledgers[t]["used"]["calls"]
        # never under-counted; over-counted at most by calls whose reply was lost in the outage
        assert admitted <= calls <= admitted + unbudgeted[t], (t, admitted, calls, unbudgeted[t])
    assert sum(ledgers[t]["used"]["cache_hits"] for t in tasks) > 0  # the evidence cache served repeats


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_closed_store_outage_is_a_prompt_503(proxy: ProxyFactory, faulty: FaultyUpstream, fault: str) -> None:
    server = start_redis()
    tasks = [f"closed-{fault}-{i}-{uuid.uuid4().hex[:6]}" for i in range(4)]
    if fault == "kill":
        schedule = [(0.6, server.stop), (1.6, server.start)]
    else:
        schedule = [(0.6, lambda: pause(server)), (1.6, lambda: resume(server))]
    try:
        with proxy(upstreams=routes(faulty.url), store=server.url, on_store_error="closed",
                   store_timeout_ms=STORE_TIMEOUT_MS, budgets=BUDGETS) as base:
            before = len(faulty.seen)
            answers = run_load(base, tasks, 3.5, schedule)
            load_until_recovered(base, tasks, answers)
            forwarded = len(faulty.seen) - before
    finally:
        if fault == "pause" and server.proc and server.proc.poll() is None:
            resume(server)
        stop_all([server])
    refused = [a for a in answers if a.status == 503]
    assert refused, "the outage was not felt"
    assert {a.status for a in answers} == {200, 503}
    assert {a.code for a in refused} == {"store_unavailable"}
    assert max(a.seconds for a in refused) < STORE_TIMEOUT_MS / 1000 + 2  # never a hang
    assert recovered(answers, tasks), latest(answers)  # service is back after the store
    assert forwarded == sum(1 for a in answers if a.status == 200)  # a refused call never reached the upstream


# --- Redis Cluster failover -----------------------------------------------------------------------

def start_replicated_cluster(masters: int = 3) -> tuple[list[RedisProcess], list[RedisProcess]]:
    """`masters` masters, each with one replica, on loopback ports whose bus ports are free."""
    args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000",
            "--appendonly", "yes", "--appendfsync", "always",
            # a master waits 5 s by default before a diskless full sync, to batch replicas
            "--repl-diskless-sync-delay", "0"]
    nodes: list[RedisProcess] = []
    try:
        for _ in range(masters * 2):
            nodes.append(start_redis(args, port=cluster_free_port()))
        clients = [redis.Redis(port=n.port, decode_responses=True) for n in nodes]
        for i in range(masters):
            clients[i].execute_command("CLUSTER ADDSLOTS", *slot_range(i, masters))
        for c in clients[1:]:
            c.execute_command("CLUSTER MEET", "127.0.0.1", nodes[0].port)
        _wait(lambda: all(_info(c.execute_command("CLUSTER INFO")).get("cluster_known_nodes") == str(len(nodes))
                          for c in clients), "nodes did not meet")
        for i in range(masters):
            clients[masters + i].execute_command("CLUSTER REPLICATE", clients[i].execute_command("CLUSTER MYID"))
        # a replica counts as connected while its first sync is still pending: wait for the sync
        # itself, since a replica that never synced is not eligible to fail over
        _wait(lambda: all(c.info("replication").get("master_link_status") == "up" for c in clients[masters:])
              and all(_info(c.execute_command("CLUSTER INFO")).get("cluster_state") == "ok" for c in clients),
              "replicas did not sync")
        for c in clients:
            c.close()
        return nodes[:masters], nodes[masters:]
    except BaseException:
        stop_all(nodes)
        raise


def _wait(predicate: Any, what: str, timeout: float = 30) -> None:
    if not wait_until(predicate, timeout, interval=0.1):
        raise RuntimeError(what)


@pytest.mark.slow
def test_cluster_master_failover_under_load(proxy: ProxyFactory, faulty: FaultyUpstream, telemetry: Telemetry) -> None:
    masters, replicas = start_replicated_cluster()
    # tasks on every master's slots, so some are on the one that fails
    tasks = [t for ts in tasks_on_masters(3, prefix="cl").values() for t in ts]
    url = f"redis+cluster://127.0.0.1:{masters[1].port}"
    try:
        with proxy(upstreams=routes(faulty.url), store=url, on_store_error="open",
                   store_timeout_ms=STORE_TIMEOUT_MS, budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
            answers = run_load(base, tasks, 7.0, [(1.0, masters[0].stop)])
            # how long the cluster takes to promote the replica depends on the machine's load
            load_until_recovered(base, tasks, answers)
            call_spans(telemetry, len(answers), tasks)  # each ends just after its response
            ledgers = {t: ledger(http, base, t) for t in tasks}
        promoted = redis.Redis(port=replicas[0].port, decode_responses=True).info("replication")["role"]
    finally:
        stop_all(masters + replicas)
    assert promoted == "master"  # the failover happened
    assert Counter(a.status for a in answers) == Counter({200: len(answers)})  # and failed no call
    assert recovered(answers, tasks), latest(answers)  # budgets work again after it
    unbudgeted = Counter(a.task for a in answers if not a.budgeted)
    assert sum(unbudgeted.values()) > 0, answers_summary(answers)  # calls during the failover went on unbudgeted
    for t in tasks:
        admitted = sum(1 for a in answers if a.task == t and a.budgeted)
        # writes acknowledged by a master may be lost in a failover (Redis replication is async): the
        # ledger may under-count by what the dead master had not yet replicated - bounded here by
        # the calls of the second before the kill, which the test cannot tell apart
        assert ledgers[t]["used"]["steps"] <= admitted + unbudgeted[t]


def answers_summary(answers: list[Answer]) -> str:
    return str(Counter((a.status, a.budgeted) for a in answers))
