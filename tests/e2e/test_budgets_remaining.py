"""`x-ragtoll-budget-remaining` means one thing and never rises while the task spends.

Concurrent calls of one task (LLM calls, whose output reservation settles far lower, mixed with
priced retrievals, which reserve nothing beyond their price), through a real proxy on the memory
store and on a real Redis. Each answer's header is read; `max_calls` counts every admitted call,
this one too, so it numbers the calls in the order the store admitted them. In that order the
token and cost values never rise, and they fall as the task spends. Before, the header subtracted
the call's own reservation, so the next call's showed more left (issue 35: 9384 µ$, then 9992).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from typing import Any

import http_sfv
import httpx
import pytest
from conftest import ProxyFactory, Upstream
from test_budgets import PRICING, upstreams

CALLS = 32
AT_ONCE = 6
LIMITS = {
    "max_calls": 1000,
    "max_cost_usd": 5.0,
    "max_completion_tokens": 1_000_000,
    "max_context_tokens": 1_000_000,
}


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    return "memory" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


def left(resp: httpx.Response) -> dict[str, Any]:
    d = http_sfv.Dictionary()
    d.parse(resp.headers["x-ragtoll-budget-remaining"].encode())
    values = {k: v.value for k, v in d.items()}
    values["cost_micros"] = d["max_cost_usd"].params["micros"]
    return values


async def calls(base: str, task_id: str) -> list[httpx.Response]:
    """CALLS calls, AT_ONCE in flight, each answered after a random short delay, so admissions and
    settles interleave; every third is a retrieval."""
    rng = random.Random(35)
    gate = asyncio.Semaphore(AT_ONCE)
    headers = {"x-ragtoll-task-id": task_id}

    async def one(i: int, http: httpx.AsyncClient) -> httpx.Response:
        delay = {"x-test-delay": f"{rng.uniform(0, 0.05):.3f}"}
        async with gate:
            if i % 3 == 2:
                return await http.post(
                    f"{base}/docs/search",
                    json={"query": f"refund policy {i}", "top_k": 3},
                    headers={**headers, **delay},
                )
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"question {i}"}]}
            return await http.post(
                f"{base}/openai/v1/chat/completions", json=body, headers={**headers, **delay}
            )

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=AT_ONCE)) as http:
        return await asyncio.gather(*[one(i, http) for i in range(CALLS)])


def test_remaining_never_rises_in_the_order_calls_were_admitted(
    proxy: ProxyFactory, upstream: Upstream, store: str
) -> None:
    budgets = {"default_profile": "p", "profiles": {"p": LIMITS}}
    with proxy(
        upstreams=upstreams(upstream.url),
        budgets=budgets,
        pricing=PRICING,
        store=store,
        cache={"enabled": False},
    ) as base:
        answers = asyncio.run(calls(base, f"t-{uuid.uuid4().hex[:12]}"))
    assert [r.status_code for r in answers] == [200] * CALLS
    seen = sorted((left(r) for r in answers), key=lambda v: -v["max_calls"])
    assert [v["max_calls"] for v in seen] == list(range(999, 999 - CALLS, -1))  # one admission each
    for key in ("cost_micros", "max_completion_tokens", "max_context_tokens"):
        values = [v[key] for v in seen]
        rises = [(i, a, b) for i, (a, b) in enumerate(itertools.pairwise(values)) if b > a]
        assert rises == [], (key, values)
        assert values[-1] < values[0], (key, values)  # the task spent, and the header says so


def test_a_call_after_a_costly_one_shows_less_left_not_more(
    proxy: ProxyFactory, upstream: Upstream, store: str
) -> None:
    # the sequence: an LLM call (reserved 1024 output tokens, settles at a few), then a search
    budgets = {"default_profile": "p", "profiles": {"p": LIMITS}}
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    headers = {"x-ragtoll-task-id": task_id}
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    with (
        proxy(
            upstreams=upstreams(upstream.url),
            budgets=budgets,
            pricing=PRICING,
            store=store,
            cache={"enabled": False},
        ) as base,
        httpx.Client(timeout=30) as http,
    ):
        first = http.post(f"{base}/openai/v1/chat/completions", json=body, headers=headers)
        second = http.post(f"{base}/docs/search", json={"query": "refund", "top_k": 3}, headers=headers)
        third = http.post(f"{base}/openai/v1/chat/completions", json=body, headers=headers)
    micros = [left(r)["cost_micros"] for r in (first, second, third)]
    assert micros[0] == 5_000_000  # nothing settled yet: the call's own reservation is not spend
    assert micros[0] > micros[1] > micros[2]  # the chat's settled cost, then the search's $0.0005
    assert micros[1] - micros[2] == 500
