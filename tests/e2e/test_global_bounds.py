"""Process-wide bounds on memory and loop time (issue 30, item 6), end to end on real sockets.

  * a query past `server.max_query_chars` is keyed by a hash of its raw text and never read
    further: not normalised into the unique-query key, not compared with the task's earlier
    queries, not embedded, not cached (memory store and Redis);
  * `server.max_inspect_total_bytes` bounds the bytes the process holds for inspection: answers
    past it pass through unread (every byte still reaches the client, the span says why), request
    bodies past it get 503 `overloaded`; 101 concurrent 7 MB retrieval answers stay within a
    peak RSS read from /proc.
"""

from __future__ import annotations

import asyncio
import random
import string
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from support.asgi import read_body, serve_lifespan
from support.poll import wait_until
from support.process import RagtollProcess
from support.servers import serve_in_thread

TOKEN = "bounds-token"
MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", TOKEN)


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    return "memory" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


def _words(n: int, seed: int) -> str:
    r = random.Random(seed)
    return " ".join("".join(r.choices(string.ascii_lowercase, k=r.randint(3, 9))) for _ in range(n))


def _attrs(telemetry: Telemetry, name: str, n: int) -> list[dict[str, Any]]:
    """The attributes of the first `n` spans called `name`, in start order, once all have ended."""
    assert wait_until(lambda: len(telemetry.by_name(name)) >= n, 10)
    return [dict(s.attributes or {}) for s in sorted(telemetry.by_name(name), key=lambda s: s.start_time)][:n]


def test_a_256_kb_query_is_keyed_by_hash_and_never_compared_embedded_or_cached(
        proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry, store: str) -> None:
    big = _words(40_000, 1)
    assert len(big) > 256 * 1024
    task = f"t-{uuid.uuid4().hex[:12]}"
    ups = [{"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url, "prefix": "/docs"},
           {"name": "emb", "kind": "embeddings", "api": "openai", "url": upstream.url, "prefix": "/emb"}]
    budgets = {"default_profile": "p", "profiles": {"p": {"max_retrieval_calls": 100}}}
    with proxy(upstreams=ups, store=store, budgets=budgets, cache={"embedder": "upstream:emb"}) as base, \
            httpx.Client(timeout=60) as http:
        # the same query twice, then spelled in capitals: two queries for a key of the raw text
        codes = [http.post(f"{base}/docs/search", json={"query": q, "top_k": 3},
                           headers={"x-ragtoll-task-id": task}).status_code for q in (big, big, big.upper())]
        used = http.get(f"{base}/admin/tasks/{task}", headers={"authorization": f"Bearer {TOKEN}"}).json()["used"]
    assert codes == [200, 200, 200]
    assert upstream.app.state.calls["/search"] == 3  # forwarded whole, never answered from the cache
    assert upstream.app.state.calls["/v1/embeddings"] == 0  # never embedded (to file it or to look it up)
    assert used["unique_queries"] == 2
    spans = _attrs(telemetry, "retrieval docs", 3)
    assert [s[sc.QUERY_OVERSIZED] for s in spans] == [len(big)] * 3
    assert {s[sc.CACHE_REASON] for s in spans} == {"no_query"}
    again = spans[1]  # the repeat: judged by its results alone, never compared word by word
    assert again[sc.PROGRESS_PREFIX + "similarity"] == 0
    assert sc.PROGRESS_PREFIX + "similar_to" not in again and sc.PROGRESS_PREFIX + "for_question" not in again
    assert again[sc.PROGRESS_PREFIX + "fruitful"] is False  # its top results were seen: still fruitless


class Held:
    """An upstream whose answers wait until `release` is set (or 60 s): a retrieval of `size`
    bytes (7 MB of 1 KB results) or a small chat completion. Counts the requests that arrived."""

    def __init__(self, size: int = 7 * MIB) -> None:
        self.release = threading.Event()
        self.arrived = 0
        n = size // 1000
        self.answer = orjson.dumps({"results": [{"id": f"d{i}", "text": "x" * 950, "score": 1 - i / n}
                                                for i in range(n)]})

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        await read_body(receive)
        self.arrived += 1
        chat = scope["path"].endswith("/chat/completions")
        body = orjson.dumps({"id": "c", "object": "chat.completion", "model": "gpt-4o-mini",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}) \
            if chat else self.answer
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
        deadline = time.monotonic() + 60
        while not self.release.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def held() -> Iterator[tuple[str, Held]]:
    app = Held()
    with serve_in_thread(app) as url:
        yield url, app


@pytest.mark.slow
def test_an_answer_past_the_global_bound_passes_through_unread(proxy: ProxyFactory, held: tuple[str, Held],
                                                               telemetry: Telemetry) -> None:
    """Bound 16 MiB: of three 7 MB answers held at once, at most two are read; all three arrive whole."""
    url, app = held
    ups = [{"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs"}]
    server = {"max_body_bytes": 8 * MIB, "max_inspect_total_bytes": 16 * MIB}

    async def three(base: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            calls = [asyncio.create_task(client.post(f"{base}/docs/search", json={"query": f"q{i}"},
                                                     headers={"x-ragtoll-task-id": f"t-{uuid.uuid4().hex}"}))
                     for i in range(3)]
            deadline = time.monotonic() + 60
            while app.arrived < 3 and time.monotonic() < deadline:  # every head is in before any body is sent
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            app.release.set()
            return await asyncio.gather(*calls)

    with proxy(upstreams=ups, server=server, cache={"enabled": False}) as base:
        answers = asyncio.run(three(base))
    assert [r.status_code for r in answers] == [200] * 3
    assert all(r.content == app.answer for r in answers)  # every byte, read or not
    unread = [s.get(sc.RESPONSE_UNREAD, "") for s in _attrs(telemetry, "retrieval docs", 3)]
    assert any("server.max_inspect_total_bytes" in why for why in unread), unread
    described = [r for r in answers if "x-ragtoll-evidence" in r.headers]
    assert 1 <= len(described) <= 2


def test_a_request_body_past_the_global_bound_gets_503(proxy: ProxyFactory, held: tuple[str, Held]) -> None:
    """Bound 2 MiB: two 900 KB chat bodies held upstream; a third is refused with 503 `overloaded`.
    (Bodies under 1 MB: aiohttp warns on a larger one sent as bytes, an error under these tests.)"""
    url, app = held
    ups = [{"name": "openai", "kind": "llm", "api": "openai", "url": url, "prefix": "/openai"}]
    server = {"max_body_bytes": MIB, "max_inspect_bytes": MIB, "max_event_bytes": MIB,
              "max_inspect_total_bytes": 2 * MIB}
    budgets = {"default_profile": "p", "profiles": {"p": {"max_steps": 100}}}
    body = {"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": "hello " * 150_000}]}

    async def three(base: str) -> tuple[list[httpx.Response], httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            def post() -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.post(f"{base}/openai/v1/chat/completions", json=body,
                                                       headers={"x-ragtoll-task-id": f"t-{uuid.uuid4().hex}"}))

            first = [post(), post()]
            deadline = time.monotonic() + 60
            while app.arrived < 2 and time.monotonic() < deadline and not any(t.done() for t in first):
                await asyncio.sleep(0.01)
            assert app.arrived == 2, [t.result().text[:300] for t in first if t.done()]
            refused = await post()
            app.release.set()
            return await asyncio.gather(*first), refused

    with proxy(upstreams=ups, server=server, budgets=budgets, cache={"enabled": False}) as base:
        held_calls, refused = asyncio.run(three(base))
    assert [r.status_code for r in held_calls] == [200, 200]
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "overloaded"
    assert refused.headers["retry-after"] == "1"
    assert app.arrived == 2  # the refused call never reached the upstream


@pytest.mark.slow
def test_101_concurrent_7_mb_answers_stay_within_the_bound(tmp_path: Path) -> None:
    """`ragtoll serve` with a 32 MiB bound: 101 answers of 7 MB held at once all arrive whole, most
    pass through unread, and the peak RSS grows by far less than the 700 MB they weigh."""
    app = Held()
    with serve_in_thread(app) as url:
        # 32 MiB: four answers fill it, however the 101 interleave on a loaded machine
        config = {"tasks": {"untracked": "per-call"}, "server": {"max_inspect_total_bytes": 32 * 1024 * 1024},
                  "cache": {"enabled": False}, "budgets": {"records_file": str(tmp_path / "r.jsonl")},
                  "upstreams": [{"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs"}]}
        with RagtollProcess(tmp_path, config) as rt:
            before_kb = rt.status("VmHWM")

            async def burst() -> list[tuple[int, int, bool]]:
                limits = httpx.Limits(max_connections=128)
                async with httpx.AsyncClient(timeout=120, limits=limits) as client:
                    async def one(i: int) -> tuple[int, int, bool]:
                        r = await client.post(f"{rt.base}/docs/search", json={"query": f"q{i}"})
                        return r.status_code, len(r.content), "x-ragtoll-evidence" in r.headers

                    calls = [asyncio.create_task(one(i)) for i in range(101)]
                    deadline = time.monotonic() + 120
                    while app.arrived < 101 and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(0.5)
                    app.release.set()
                    return await asyncio.gather(*calls)

            results = asyncio.run(burst())
            grown_mb = (rt.status("VmHWM") - before_kb) / 1024
    assert [(status, size) for status, size, _ in results] == [(200, len(app.answer))] * 101
    read = sum(described for _, _, described in results)
    assert 1 <= read < 101, f"all {read} answers read: the 32 MiB bound held none back"
    assert grown_mb < 500, f"peak RSS grew by {grown_mb:.0f} MB"
