"""One Redis Cluster master fails: only the tasks whose slot it owns lose their budget.

A real 3-master cluster (`cluster-require-full-coverage no`, so the healthy masters keep serving
their slots), one master killed (its port then refuses at once: no timing window to hit). Task
ids are chosen by computing, as the store does, the slot of their hash-tagged keys, so each test
knows which tasks live on the dead master. Calls alternate between dead-master and healthy
tasks: with a single per-process skip window, the healthy calls in the second after each
dead-master failure would have gone out unbudgeted (open) or been refused (closed).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.stores.memory import MemoryStore
from ragtoll.proxy.stores.redis import RedisStore, task_keys
from redis.crc import key_slot
from support.admin import ledger
from support.budget_cluster import start_budget_cluster, tasks_on_masters
from support.load import store_answered
from support.poll import wait_until
from support.redis_server import RedisProcess, stop_all
from support.spans import call_spans, reserve_failed

MASTERS = 3
DEAD = 0  # the master that is killed; the proxy's seed node is another one
PER_NODE = 3
ROUNDS = 3
BUDGETS = {"default_profile": "p", "profiles": {"p": {"max_steps": 1000}}}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}

pytestmark = pytest.mark.usefixtures("admin_token")


@pytest.fixture
def cluster() -> Iterator[list[RedisProcess]]:
    nodes = start_budget_cluster(MASTERS, ["--cluster-require-full-coverage", "no"])
    try:
        yield nodes
    finally:
        stop_all(nodes)
        # Finalise this test's cluster clients now: left to a later collection, their finalizers ran
        # inside another test (a Hypothesis draw, which then saw the global random state change).
        gc.collect()


def chat(http: httpx.Client, base: str, task: str) -> httpx.Response:
    return http.post(f"{base}/openai/v1/chat/completions", json=CHAT, headers={"x-ragtoll-task-id": task})


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["open", "closed"])
def test_a_dead_master_degrades_only_its_own_tasks(proxy: ProxyFactory, upstream: Upstream,
                                                  telemetry: Telemetry, cluster: list[RedisProcess],
                                                  mode: str) -> None:
    by_master = tasks_on_masters(PER_NODE, MASTERS, prefix="node")
    dead = by_master[DEAD]
    healthy = [t for i in range(MASTERS) if i != DEAD for t in by_master[i]]
    url = f"redis+cluster://127.0.0.1:{cluster[1].port}"
    with proxy(store=url, on_store_error=mode, store_timeout_ms=1000, budgets=BUDGETS) as base, \
            httpx.Client(timeout=10) as http:
        warm = {t: chat(http, base, t) for ts in by_master.values() for t in ts}
        for i, ts in by_master.items():  # the test's slot arithmetic matches where the ledgers landed
            with redis.Redis(port=cluster[i].port) as node:
                assert all(node.exists(task_keys(t)[0]) for t in ts), i
        cluster[DEAD].stop()
        forwarded_before = upstream.app.state.calls["/v1/chat/completions"]
        answers: list[tuple[str, httpx.Response]] = []
        for _ in range(ROUNDS):
            for j in range(PER_NODE):  # a dead-master task first, then the healthy ones right after it
                for i in range(MASTERS):
                    t = by_master[(DEAD + i) % MASTERS][j]
                    answers.append((t, chat(http, base, t)))
        forwarded = upstream.app.state.calls["/v1/chat/completions"] - forwarded_before
        ledgers = {t: ledger(http, base, t) for t in healthy}
    spans = call_spans(telemetry, len(warm) + len(answers))[len(warm):]

    assert all(r.status_code == 200 and "x-ragtoll-budget-remaining" in r.headers for r in warm.values())
    for t, r in answers:
        budgeted = store_answered(r.headers)
        if t in dead:
            if mode == "open":  # decided on the local ledger (BUDGETS are roomy: admitted)
                assert r.status_code == 200 and not budgeted, (t, r.status_code)
                assert r.headers["x-ragtoll-budget-degraded"] == "local" and "x-ragtoll-budget-remaining" in r.headers
            else:
                assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", (t, r.text)
        else:  # admitted normally, with its budget, however recently the dead master failed
            assert r.status_code == 200 and budgeted, (t, r.status_code, r.text)
    assert len(spans) == len(answers)
    by_task: dict[str, list[Any]] = {}
    for s in spans:
        by_task.setdefault(s.attributes[sc.TASK_ID], []).append(s)
    assert all(len(by_task[t]) == ROUNDS and all(reserve_failed(s) for s in by_task[t]) for t in dead)
    assert all(len(by_task[t]) == ROUNDS and not any(s.attributes.get(sc.DEGRADED) for s in by_task[t])
               for t in healthy)
    assert all(ledgers[t]["used"]["steps"] == 1 + ROUNDS for t in healthy)  # every healthy call was counted
    admitted = len(healthy) * ROUNDS
    assert forwarded == (admitted + len(dead) * ROUNDS if mode == "open" else admitted)


@pytest.mark.slow
async def test_failure_domain_is_the_node_that_owns_the_task_slot(cluster: list[RedisProcess]) -> None:
    by_master = tasks_on_masters(PER_NODE, MASTERS, prefix="node")
    store = RedisStore(f"redis+cluster://127.0.0.1:{cluster[0].port}")
    try:
        t = by_master[1][0]
        # before the slot map is known: the slot itself
        assert store.failure_domain(t) == f"slot:{key_slot(task_keys(t)[0].encode())}"
        await store.ping()  # learns the slot map
        for i, ts in by_master.items():
            assert {store.failure_domain(t) for t in ts} == {f"127.0.0.1:{cluster[i].port}"}
    finally:
        await store.aclose()
    plain = RedisStore("redis://127.0.0.1:1/0")  # one server: one domain (and no I/O to say so)
    try:
        assert {plain.failure_domain(t) for ts in by_master.values() for t in ts} == {"redis"}
    finally:
        await plain.aclose()
    assert MemoryStore().failure_domain("a") == MemoryStore().failure_domain("b")


@pytest.mark.slow
def test_idle_tasks_on_healthy_masters_still_end(proxy: ProxyFactory, cluster: list[RedisProcess],
                                                 telemetry: Telemetry) -> None:
    """The idle sweep ends every task it can reach: one on the dead master does not stop the rest."""
    by_master = tasks_on_masters(PER_NODE, MASTERS, prefix="idle")
    healthy = {t for i in range(MASTERS) if i != DEAD for t in by_master[i]}
    url = f"redis+cluster://127.0.0.1:{cluster[1].port}"
    with proxy(store=url, store_timeout_ms=500, budgets=BUDGETS, tasks={"idle_timeout_s": 0.4}) as base, \
            httpx.Client(timeout=10) as http:
        # the dead master's tasks first, so the sweep meets them before the healthy ones
        for i in (DEAD, *(i for i in range(MASTERS) if i != DEAD)):
            for t in by_master[i]:
                assert chat(http, base, t).status_code == 200
        cluster[DEAD].stop()

        def ended() -> set[str]:  # each ended task gets its ragtoll.task summary span
            return {s.attributes[sc.TASK_ID] for s in telemetry.spans() if s.name == sc.TASK_SPAN}

        wait_until(lambda: ended() == healthy, timeout=15, interval=0.1)
        ended_tasks = ended()
        still_open = [t for t in by_master[DEAD] if t not in ended_tasks]
    assert ended_tasks == healthy  # every healthy task ended idle; none of the dead master's could
    assert len(still_open) == PER_NODE
