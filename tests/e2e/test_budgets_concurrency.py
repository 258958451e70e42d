"""128 simultaneous calls of one task spread over 3 `ragtoll serve` processes sharing one Redis
(or a 3-master Redis Cluster): the upstream sees exactly the limit for count dimensions, and cost
overshoots by no more than the reservations in flight."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import Upstream
from support.process import RagtollProcess
from support.process import replicas as running
from test_budgets import TOKEN, task

N = 128
REPLICAS = 3


@contextlib.contextmanager
def replicas(upstream_url: str, store: str, tmp_path: Any) -> Iterator[list[str]]:
    """REPLICAS `ragtoll serve` processes of one config; yields their base URLs."""
    cfg = {
        "store": store, "store_timeout_ms": 3000, "on_store_error": "closed",
        "upstreams": [
            {"name": "openai", "kind": "llm", "api": "openai", "url": upstream_url, "prefix": "/openai"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream_url, "prefix": "/docs"},
        ],
        "cache": {"enabled": False},
        "tasks": {"idle_timeout_s": 600},
        "pricing": {"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.60}},
        "budgets": {"default_profile": "steps", "profiles": {
            "steps": {"max_steps": 10, "max_retrieval_calls": 7},
            "cost": {"max_cost_usd": 0.003},  # chosen by an operator rule (header), so only cost limits
        }, "rules": [{"header": "x-profile", "equals": "cost", "profile": "cost"}]},
    }
    procs = [RagtollProcess(tmp_path, cfg, env={"RAGTOLL_ADMIN_TOKEN": TOKEN}, ready="/readyz")
             for _ in range(REPLICAS)]
    with running(procs) as bases:  # side by side, then each until its store answers
        yield bases


async def burst(bases: list[str], path: str, body: dict[str, Any], task_id: str,
                headers: dict[str, str] | None = None) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=N)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        return await asyncio.gather(*[
            http.post(f"{bases[i % len(bases)]}{path}", json=body,
                      headers={"x-ragtoll-task-id": task_id, **(headers or {})})
            for i in range(N)])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_counts_hold_exactly_across_replicas(kind: str, upstream: Upstream, redis_url: str,
                                             request: pytest.FixtureRequest, tmp_path: Any) -> None:
    store = redis_url if kind == "redis" else request.getfixturevalue("redis_cluster_url")
    chat_task, docs_task, cost_task = task(), task(), task()
    chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    with replicas(upstream.url, store, tmp_path) as bases:
        chats = asyncio.run(burst(bases, "/openai/v1/chat/completions", chat, chat_task))
        searches = asyncio.run(burst(bases, "/docs/search", {"query": "refund policy", "top_k": 3}, docs_task))
        costly = asyncio.run(burst(bases, "/openai/v1/chat/completions", {**chat, "max_tokens": 1000}, cost_task,
                                   {"x-profile": "cost"}))
        ledger = httpx.get(f"{bases[1]}/admin/tasks/{cost_task}",
                           headers={"authorization": f"Bearer {TOKEN}"}).json()
    assert sorted({r.status_code for r in chats + costly}) == [200, 402]  # LLM routes refuse with 402
    assert sorted({r.status_code for r in searches}) == [200, 429]
    assert sum(r.status_code == 200 for r in chats) == 10
    assert upstream.app.state.calls["/v1/chat/completions"] - sum(r.status_code == 200 for r in costly) == 10
    assert sum(r.status_code == 200 for r in searches) == 7 and upstream.app.state.calls["/search"] == 7
    assert {r.json()["error"]["dimension"] for r in chats if r.status_code == 402} == {"max_steps"}
    assert {r.json()["error"]["dimension"] for r in costly if r.status_code == 402} == {"max_cost_usd"}
    # one call reserves its prompt plus 1000 output tokens at $0.60/M: about $0.0006
    reservation = 1000 * 0.60 / 1e6 + 100 * 0.15 / 1e6
    assert ledger["used"]["cost_usd"] <= 0.003 + reservation
    assert ledger["used"]["steps"] == sum(r.status_code == 200 for r in costly)
    assert ledger["in_flight"] == 0
