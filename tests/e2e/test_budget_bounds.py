"""Bounded by construction (issue 30, items 1, 2 and 10): the budget's own allowances.

Each test is an attack that got past the limits before, reproduced against a greedy model (every
answer as long as the request allows, support/greedy.py), on the memory store and on Redis:

1. worst-case admission: an admitted call's output cap is what its task has left; the finish past
   the limit is an allowance (one answer, capped and cut), never a task's first call, never for a
   call whose prompt alone costs more than the allowance;
2. every text-bearing stream delta counts and is cut: refusal, reasoning, reasoning_content and
   fields ragtoll does not know;
10. novelty is not progress: an agent asking a new question each time never climbs to a larger
   profile, and the embedded default bounds its searches.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from conftest import ProxyFactory
from support.greedy import GreedyModel
from support.servers import serve_in_thread

CHAT = "/v1/chat/completions"
NOTE = "Budget reached: answer now from what you have."


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    return "memory" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


@pytest.fixture(scope="module")
def greedy() -> Iterator[tuple[str, GreedyModel]]:
    app = GreedyModel()
    with serve_in_thread(app) as url:
        yield url, app


def robust(store: str) -> dict[str, Any]:
    """The store and a timeout a loaded machine's Redis keeps: a slow store lets calls through
    unbudgeted (`on_store_error: open`), which is not what these tests measure."""
    return {"store": store, "store_timeout_ms": 3000, "on_store_error": "closed", "cache": {"enabled": False}}


def ups(url: str) -> list[dict[str, Any]]:
    return [{"name": "openai", "kind": "llm", "api": "openai", "url": url, "prefix": "/openai"},
            {"name": "claude", "kind": "llm", "api": "anthropic", "url": url, "prefix": "/anthropic"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs"}]


def task() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def ledger(base: str, token: str, task_id: str) -> dict[str, Any]:
    doc = httpx.get(f"{base}/admin/tasks/{task_id}", headers={"authorization": f"Bearer {token}"}).json()
    return dict(doc["used"])


def oai(base: str, task_id: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/openai/v1", api_key="k", max_retries=2,
                         default_headers={"x-ragtoll-task-id": task_id})


def prompt(tokens: int) -> str:
    return "hi " * tokens  # one o200k token per " hi"


# --- 1. worst-case admission ---------------------------------------------------------------------------


def test_an_admitted_call_is_capped_at_what_its_task_has_left(proxy: ProxyFactory, greedy: tuple[str, GreedyModel],
                                                              admin_token: str, store: str) -> None:
    """A call asking for 100,000 output tokens and 4 answers against $0.01 at $10/M output: forwarded
    with its cap lowered to what is left (per answer), so the ledger ends at the limit, not past it."""
    url, app = greedy
    app.reset()
    budgets = {"default_profile": "p", "profiles": {"p": {"max_cost_usd": 0.01}}}
    t = task()
    with proxy(upstreams=ups(url), budgets=budgets, **robust(store)) as base:
        with oai(base, t) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=[{"role": "user", "content": "Write it all down."}], max_tokens=100_000, n=4)
            with pytest.raises(openai.APIStatusError):  # nothing left for the next one
                client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "more"}])
        used = ledger(base, admin_token, t)
    sent = app.bodies(CHAT)
    assert len(sent) == 1
    cap = sent[0]["max_tokens"]
    assert raw.headers["x-ragtoll-budget-output-cap"] == str(cap)
    assert 240 <= cap <= 250 and sent[0]["n"] == 4  # ($0.01 - prompt) / $10/M / 4 answers
    assert used["cost_usd"] <= 0.01  # before: $4.00 (400,000 tokens at $10/M)


def test_a_call_without_a_cap_gets_one_when_its_task_has_less_left_than_its_model_may_write(
        proxy: ProxyFactory, greedy: tuple[str, GreedyModel], admin_token: str, store: str) -> None:
    url, app = greedy
    app.reset()
    budgets = {"default_profile": "p", "profiles": {"p": {"max_cost_usd": 0.5}}}
    t, roomy = task(), task()
    with proxy(upstreams=ups(url), budgets=budgets, **robust(store)) as base:
        with oai(base, t) as client:  # o1: $60/M output, up to 100,000 tokens: $6 of output
            client.chat.completions.create(model="o1", messages=[{"role": "user", "content": "Think hard."}])
        with oai(base, roomy) as client:  # gpt-4o-mini: its 16,384-token ceiling costs $0.01: no cap needed
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi."}])
        used = ledger(base, admin_token, t)
    first, second = app.bodies(CHAT)
    assert "max_tokens" not in first and 8_000 <= first["max_completion_tokens"] <= 8_334  # o1 reads only this one
    assert "max_tokens" not in second and "max_completion_tokens" not in second
    assert used["cost_usd"] <= 0.5  # before: $6.00


def finish_profile(**extra: Any) -> dict[str, Any]:
    return {"default_profile": "p", "profiles": {"p": {"max_steps": 1, "on_exhausted": "finish",
                                                       "finish_note": NOTE, **extra}}}


def test_the_finish_past_the_limit_is_one_capped_answer(proxy: ProxyFactory, greedy: tuple[str, GreedyModel],
                                                        admin_token: str, store: str) -> None:
    """At the limit, a call with max_tokens 100,000 and n 4 is finished as one answer capped at the
    profile's finish allowance (1,024 tokens by default), not forwarded as sent."""
    url, app = greedy
    app.reset()
    t = task()
    with proxy(upstreams=ups(url), budgets=finish_profile(max_cost_usd=1.0), **robust(store)) as base:
        with oai(base, t) as client:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}], max_tokens=10)
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=[{"role": "user", "content": "q"}], max_tokens=100_000, n=4)
        used = ledger(base, admin_token, t)
    assert raw.headers["x-ragtoll-budget-finished"] == "max_steps"
    finished = app.bodies(CHAT)[1]
    assert (finished["n"], finished["max_tokens"]) == (1, 1024)
    # the first call ($0.0001) plus the finish's allowance ($0.05 at most); before: $4.00
    assert used["cost_usd"] <= 0.0001 + 0.05 and used["completion_tokens"] <= 10 + 1024


def test_the_finish_is_refused_to_a_prompt_that_alone_costs_more_than_its_allowance(
        proxy: ProxyFactory, greedy: tuple[str, GreedyModel], admin_token: str, store: str) -> None:
    """The attack: at the limit of $0.01, a ~135k-token prompt with max_tokens 100,000 and n 4 was
    finished as sent ($4.34 on the ledger). Its prompt alone costs $0.34: past the allowance, refused."""
    url, app = greedy
    app.reset()
    t = task()
    with proxy(upstreams=ups(url), budgets=finish_profile(max_cost_usd=0.01), **robust(store)) as base:
        with oai(base, t) as client:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}], max_tokens=10)
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": prompt(135_000)}],
                                               max_tokens=100_000, n=4)
        used = ledger(base, admin_token, t)
    assert len(app.bodies(CHAT)) == 1
    assert used["cost_usd"] <= 0.01


def test_a_streamed_finish_is_cut_at_its_allowance(proxy: ProxyFactory, greedy: tuple[str, GreedyModel],
                                                   admin_token: str, store: str) -> None:
    """A streamed finish of 50,000 tokens was delivered whole (50x the limit); now it is held and cut
    within the finish allowance like any stream, and ends cleanly."""
    url, app = greedy
    app.reset()
    t = task()
    with proxy(upstreams=ups(url), budgets=finish_profile(max_completion_tokens=1000), **robust(store)) as base:
        with oai(base, t) as client:
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}],
                                           max_tokens=5)
            stream = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}],
                                                    stream=True, extra_headers={"x-test-tokens": "50000"})
            chunks = list(stream)
        used = ledger(base, admin_token, t)
    delivered = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert chunks[-1].choices[0].finish_reason == "length"  # cut cleanly
    assert delivered <= 1024  # the finish allowance; before: 50,000
    assert used["completion_tokens"] <= 5 + 1024 + 256  # settled within one extension chunk of it


@pytest.mark.slow
def test_a_task_whose_first_call_is_refused_gets_no_finish(proxy: ProxyFactory, greedy: tuple[str, GreedyModel],
                                                           admin_token: str, store: str) -> None:
    """On the embedded default ($1): a fresh task whose first call's prompt alone costs more than
    the limit was refused on cost, its first refusal, so it was finished: o1 ended at $7.42,
    claude-opus-4 at $8.92. A task's first call is never finished; twenty rotated task ids get
    twenty refusals and nothing upstream."""
    url, app = greedy
    app.reset()
    big = prompt(70_000)  # $1.05 at $15/M input, both models
    with proxy(upstreams=ups(url), **robust(store)) as base:
        refused = 0
        for i in range(20):
            t = task()
            try:
                if i % 2:
                    with anthropic.Anthropic(base_url=f"{base}/anthropic", api_key="k", max_retries=2,
                                             default_headers={"x-ragtoll-task-id": t}) as claude:
                        claude.messages.create(model="claude-opus-4", max_tokens=16_000,
                                               messages=[{"role": "user", "content": big}])
                else:
                    with oai(base, t) as client:
                        client.chat.completions.create(model="o1", messages=[{"role": "user", "content": big}])
            except (openai.APIStatusError, anthropic.APIStatusError) as exc:
                refused += 1
                assert exc.response.json()["error"]["dimension"] == "max_cost_usd"
                assert "x-ragtoll-budget-finished" not in exc.response.headers
            assert ledger(base, admin_token, t)["cost_usd"] == 0
    assert refused == 20
    assert app.bodies(CHAT) == [] and app.bodies("/v1/messages") == []  # before: 20 finished passes


# --- 2. every output counts ----------------------------------------------------------------------------


async def _streams(base: str, task_id: str, field: str, n: int, tokens: int) -> list[bytes]:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "think"}], "stream": True}
    async with httpx.AsyncClient(timeout=60) as http:
        answers = await asyncio.gather(*[
            http.post(f"{base}/openai{CHAT}", json=body,
                      headers={"x-ragtoll-task-id": task_id, "x-test-field": field, "x-test-tokens": str(tokens)})
            for _ in range(n)])
    return [a.content for a in answers if a.status_code == 200]


@pytest.mark.slow
@pytest.mark.parametrize("field", ["reasoning", "refusal", "reasoning_content", "thoughts"])
def test_streamed_output_in_any_delta_field_is_counted_and_cut(proxy: ProxyFactory, greedy: tuple[str, GreedyModel],
                                                               admin_token: str, store: str, field: str) -> None:
    """8 streams of 20,000 tokens each, their text in `delta.reasoning` (OpenRouter), `delta.refusal`
    (OpenAI), `delta.reasoning_content` (vLLM) or a field ragtoll does not know: before, the first two
    delivered 160,000 tokens against 8,333 (19.2x); now the streams together deliver at most the limit."""
    url, _app = greedy
    limit = 8333
    budgets = {"default_profile": "p", "profiles": {"p": {"max_completion_tokens": limit}}}
    t = task()
    with proxy(upstreams=ups(url), budgets=budgets, **robust(store)) as base:
        bodies = asyncio.run(_streams(base, t, field, 8, 20_000))
        used = ledger(base, admin_token, t)
    marker = f'"{field}":" hi"'.encode()
    delivered = sum(b.count(marker) for b in bodies)
    assert 0 < delivered <= limit
    assert all(b'"finish_reason":"length"' in b for b in bodies if b.count(marker) < 20_000)
    assert used["completion_tokens"] <= limit + 8 * 256


# --- 10. novelty is not progress ----------------------------------------------------------------------


def random_agent(base: str, task_id: str, turns: int) -> tuple[int, int]:
    """An agent that asks the model, then searches a new, unrelated question, `turns` times; returns
    (model calls answered, searches answered with results)."""
    answered = searched = 0
    with httpx.Client(timeout=10, headers={"x-ragtoll-task-id": task_id}) as http:
        for i in range(turns):
            chat = http.post(f"{base}/openai{CHAT}", json={
                "model": "gpt-4o-mini", "max_tokens": 20,
                "messages": [{"role": "user", "content": "Who approves parental leave requests?"}]})
            answered += chat.status_code == 200
            topic = uuid.uuid4().hex[:8]
            found = http.post(f"{base}/docs/search", json={"query": f"history of {topic} festival number {i}"})
            searched += found.status_code == 200 and bool(found.json().get("results"))
    return answered, searched


def test_an_agent_asking_new_questions_never_climbs(proxy: ProxyFactory, greedy: tuple[str, GreedyModel],
                                                    admin_token: str, store: str) -> None:
    """Before: every random question brought new results, counted as progress, so the task climbed
    from a 4-step profile to the larger one and ran 44 searches and 41 model calls. Only evidence for
    the task's question lets it climb now: it stays within the small profile."""
    url, app = greedy
    app.reset()
    budgets = {"default_profile": "small",
               "profiles": {"small": {"max_steps": 4, "max_retrieval_calls": 4, "escalate_to": "large"},
                            "large": {"max_steps": 60, "max_retrieval_calls": 60}}}
    t = task()
    with proxy(upstreams=ups(url), budgets=budgets, **robust(store)) as base:
        answered, searched = random_agent(base, t, 50)
        used = httpx.get(f"{base}/admin/tasks/{t}", headers={"authorization": f"Bearer {admin_token}"}).json()
    assert (answered, searched) == (4, 4)
    assert used["profile"] == "small"


@pytest.mark.slow
def test_the_embedded_default_bounds_searches(proxy: ProxyFactory, greedy: tuple[str, GreedyModel],
                                              store: str) -> None:
    """On the embedded default, 1,000 new random searches in one task all went through (retrieval is
    unpriced: $0 on the ledger). Now `max_retrieval_calls: 40` stops them; later ones answer empty."""
    url, app = greedy
    app.reset()
    t = task()
    with proxy(upstreams=ups(url), **robust(store)) as base, \
            httpx.Client(timeout=10, headers={"x-ragtoll-task-id": t}) as http:
        answers = [http.post(f"{base}/docs/search", json={"query": f"history of {uuid.uuid4().hex[:8]} festival"})
                   for _ in range(120)]
    assert len(app.bodies("/search")) == 40
    assert all(a.status_code == 200 for a in answers)
    assert [a.headers.get("x-ragtoll-budget-exhausted") for a in answers[40:]] == ["max_retrieval_calls"] * 80
    assert all(orjson.loads(a.content)["results"] == [] for a in answers[40:])
