"""128 simultaneous streamed chat calls of one task, without max_tokens, against a cost limit and a
completion-token limit: over 3 `ragtoll serve` processes sharing one Redis, and over one process
with the memory store. Each stream holds only its own reservation and extends it from what the
task has left (reserve -> extend -> settle), so together they deliver no more than the limit, and
the ledger settles within one extension chunk per stream of it (docs/budgets.md)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import Upstream
from support.process import RagtollProcess, replicas
from test_budgets import TOKEN, task

N = 128
WORDS = 2000  # each stream would give this many output tokens ("hi": one token each)
EXTENSION = 256  # budgets.stream_extension_tokens (the default)
OUT_PRICE = 0.60 / 1e6  # gpt-4o-mini, USD per output token
COST_LIMIT = 0.005  # about 8,300 output tokens
TOKEN_LIMIT = 5000
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": True}
CONTENT = b'"content":"hi"'


@contextlib.contextmanager
def proxies(upstream_url: str, store: str, n: int, tmp_path: Any) -> Iterator[list[str]]:
    cfg = {
        "store": store, "store_timeout_ms": 3000, "on_store_error": "closed",
        "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream_url, "prefix": "/openai"}],
        "cache": {"enabled": False},
        "tasks": {"idle_timeout_s": 600},
        "pricing": {"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.60}},
        "budgets": {
            "default_profile": "cost",
            "profiles": {"cost": {"max_cost_usd": COST_LIMIT}, "tokens": {"max_completion_tokens": TOKEN_LIMIT}},
            "rules": [{"header": "x-profile", "equals": "tokens", "profile": "tokens"}],
        },
    }
    procs = [RagtollProcess(tmp_path, cfg, env={"RAGTOLL_ADMIN_TOKEN": TOKEN}, ready="/readyz") for _ in range(n)]
    with replicas(procs) as bases:
        yield bases


async def streams(bases: list[str], task_id: str, headers: dict[str, str]) -> list[httpx.Response]:
    words = ",".join(["hi"] * WORDS)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=N)) as http:
        return await asyncio.gather(*[
            http.post(f"{bases[i % len(bases)]}/openai/v1/chat/completions", json=CHAT,
                      headers={"x-ragtoll-task-id": task_id, "x-test-words": words, "x-test-delay": "0.001",
                               **headers})
            for i in range(N)])


def used(base: str, task_id: str) -> dict[str, Any]:
    doc = httpx.get(f"{base}/admin/tasks/{task_id}", headers={"authorization": f"Bearer {TOKEN}"}).json()
    assert doc["in_flight"] == 0
    return dict(doc["used"])


def check(store: str, n: int, upstream: Upstream, tmp_path: Any) -> None:
    cost_task, token_task = task(), task()
    with proxies(upstream.url, store, n, tmp_path) as bases:
        costly = asyncio.run(streams(bases, cost_task, {}))
        counted = asyncio.run(streams(bases, token_task, {"x-profile": "tokens"}))
        cost_used, token_used = used(bases[-1], cost_task), used(bases[0], token_task)
    for answers, dim in ((costly, "max_cost_usd"), (counted, "max_completion_tokens")):
        assert {r.status_code for r in answers} == {200, 402}
        assert {r.json()["error"]["dimension"] for r in answers if r.status_code == 402} == {dim}
        cut = [r for r in answers if r.status_code == 200 and r.content.count(CONTENT) < WORDS]
        assert cut and all(b'"finish_reason":"length"' in r.content for r in cut)  # each cut ends cleanly
    admitted = sum(r.status_code == 200 for r in costly)
    delivered = sum(r.content.count(CONTENT) for r in costly)
    assert delivered * OUT_PRICE <= COST_LIMIT  # together the streams deliver no more than the limit ...
    assert cost_used["cost_usd"] <= COST_LIMIT + admitted * EXTENSION * OUT_PRICE  # ... and settle within the bound
    admitted = sum(r.status_code == 200 for r in counted)
    assert sum(r.content.count(CONTENT) for r in counted) <= TOKEN_LIMIT
    assert token_used["completion_tokens"] <= TOKEN_LIMIT + admitted * EXTENSION


@pytest.mark.slow
def test_concurrent_streams_of_a_task_stay_within_the_limit_on_the_memory_store(upstream: Upstream,
                                                                                tmp_path: Any) -> None:
    check("memory", 1, upstream, tmp_path)


@pytest.mark.slow
def test_concurrent_streams_of_a_task_stay_within_the_limit_across_replicas(upstream: Upstream, redis_url: str,
                                                                            tmp_path: Any) -> None:
    check(redis_url, 3, upstream, tmp_path)
