"""The pipeline's one rule for local answers, with probe stages: a stage proposes, a later stage
may veto (the call goes upstream); a stage that returns a Reply stops the stages after it; every
stage whose on_request ran gets exactly one on_end, in reverse order.

The Pipeline is driven directly, with ASGI receive/send of our own: probe stages can only be put
in a Pipeline (the app builds its fixed stage list), and receive/send are the pipeline's whole
interface (the answers here are one message each, so nothing is hidden by not streaming). The
upstream is the real loopback one, so "went upstream" is counted where it arrived. Last, what
the app's own stages see of a local answer (a cache hit), over loopback.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream, default_upstreams
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy import config
from ragtoll.proxy.errors import BudgetExceeded
from ragtoll.proxy.request.exchange import Exchange, Reply, Stage
from ragtoll.proxy.request.caller import CallerResolver
from ragtoll.proxy.request.identify import Identifier
from ragtoll.proxy.request.pipeline import Pipeline
from ragtoll.proxy.request.routing import Router
from ragtoll.proxy.request.upstream import UpstreamClient
from support.poll import wait_until
from support.spans import call_spans

CHAT = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
LOCAL = Reply(200, b'{"local": true}')


class Probe(Stage):
    """Logs its phases; `does` is what its on_request does: propose, veto, reply, refuse or nothing."""

    def __init__(self, name: str, log: list[str], does: str = "", fail_end: bool = False) -> None:
        self.name, self.log, self.does, self.fail_end = name, log, does, fail_end

    async def on_request(self, ex: Exchange) -> Reply | None:
        self.log.append(f"request {self.name}")
        if self.does == "propose":
            ex.proposal = LOCAL
        elif self.does == "veto":
            ex.proposal = None
        elif self.does == "reply":
            return Reply(203, b'{"replied": "%s"}' % self.name.encode())
        elif self.does == "refuse":
            raise BudgetExceeded("no more", status=429, dimension="max_steps")
        return None

    async def on_end(self, ex: Exchange) -> None:
        self.log.append(f"end {self.name}")
        if self.fail_end:
            raise RuntimeError(f"{self.name} bookkeeping failed")


@dataclass
class Answer:
    status: int = 0
    body: bytes = b""
    messages: list[MutableMapping[str, Any]] = field(default_factory=list)


@pytest.fixture
async def client(upstream: Upstream) -> AsyncIterator[tuple[config.Settings, UpstreamClient]]:
    settings = config.parse({"upstreams": default_upstreams(upstream.url)})
    up = UpstreamClient(settings.upstreams)
    yield settings, up
    await up.aclose()


async def call(client: tuple[config.Settings, UpstreamClient], telemetry: Telemetry, stages: list[Stage]) -> Answer:
    """One chat call through a Pipeline of `stages`, as the server would hand it over."""
    settings, up = client
    router = Router(settings.upstreams)
    pipeline = Pipeline(settings, router, up, stages, Identifier(settings.tasks),
                        CallerResolver(settings.identity, {}), telemetry.tracer_provider.get_tracer("test"))
    path = "/openai/v1/chat/completions"
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "client": ("127.0.0.1", 50000),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(CHAT)).encode()),
                         (b"x-ragtoll-task-id", b"local-answers")]}
    messages = [{"type": "http.request", "body": CHAT, "more_body": False}]
    never = asyncio.Event()  # the client stays connected

    async def receive() -> MutableMapping[str, Any]:
        if messages:
            return messages.pop(0)
        await never.wait()
        return {"type": "http.disconnect"}

    answer = Answer()

    async def send(message: MutableMapping[str, Any]) -> None:
        answer.messages.append(message)
        if message["type"] == "http.response.start":
            answer.status = message["status"]
        else:
            answer.body += message.get("body", b"")

    route = router.match(path)
    assert route is not None
    await asyncio.wait_for(pipeline.handle(route, scope, receive, send), 10)
    return answer


async def test_a_proposal_no_later_stage_vetoes_is_the_answer(client: Any, telemetry: Telemetry,
                                                             upstream: Upstream) -> None:
    log: list[str] = []
    got = await call(client, telemetry, [Probe("cache", log, "propose"), Probe("budget", log)])
    assert (got.status, got.body) == (200, LOCAL.body)
    assert upstream.app.state.calls["/v1/chat/completions"] == 0
    assert log == ["request cache", "request budget", "end budget", "end cache"]


async def test_a_proposal_a_later_stage_vetoes_goes_upstream(client: Any, telemetry: Telemetry,
                                                            upstream: Upstream) -> None:
    log: list[str] = []
    got = await call(client, telemetry, [Probe("cache", log, "propose"), Probe("budget", log, "veto"),
                                         Probe("span", log)])
    assert got.status == 200 and orjson.loads(got.body)["object"] == "chat.completion"  # the upstream's
    assert upstream.app.state.calls["/v1/chat/completions"] == 1
    assert log == ["request cache", "request budget", "request span", "end span", "end budget", "end cache"]


@pytest.mark.parametrize("does", ["reply", "refuse"])
async def test_a_stage_that_answers_stops_the_later_stages_and_the_ones_that_ran_end_once(
        client: Any, telemetry: Telemetry, upstream: Upstream, does: str) -> None:
    log: list[str] = []
    got = await call(client, telemetry, [Probe("a", log), Probe("b", log, does), Probe("c", log)])
    if does == "reply":
        assert (got.status, got.body) == (203, b'{"replied": "b"}')
    else:
        assert got.status == 429 and orjson.loads(got.body)["error"]["code"] == "budget_exceeded"
    assert upstream.app.state.calls["/v1/chat/completions"] == 0
    assert log == ["request a", "request b", "end b", "end a"]  # c neither started nor ended


async def test_a_reply_wins_over_an_earlier_proposal(client: Any, telemetry: Telemetry) -> None:
    log: list[str] = []
    got = await call(client, telemetry, [Probe("cache", log, "propose"), Probe("b", log, "reply")])
    assert (got.status, got.body) == (203, b'{"replied": "b"}')


async def test_a_failing_on_end_does_not_skip_the_others_or_fail_the_call(client: Any, telemetry: Telemetry) -> None:
    log: list[str] = []
    got = await call(client, telemetry, [Probe("a", log), Probe("b", log, "propose", fail_end=True), Probe("c", log)])
    assert got.status == 200 and got.body == LOCAL.body
    assert log == ["request a", "request b", "request c", "end c", "end b", "end a"]
    span = next(s for s in telemetry.spans() if sc.OUTCOME in s.attributes)
    assert span.attributes[sc.OUTCOME] == "ok"
    assert [e.attributes["exception.message"] for e in span.events if e.name == "exception"] == \
        ["b bookkeeping failed"]


# --- what the stages see of a local answer: the whole app on loopback, with its own stages -----------

def retrieve_then_ask(proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry) -> tuple[httpx.Response, Any]:
    """Task a retrieves (a miss: filed); task b asks the same (a hit: a local answer), then sends a
    chunk of it in a prompt. Returns b's retrieval answer and b's chat span."""
    routes = [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"},
              {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url, "prefix": "/docs"}]
    query = {"query": "refund window for annual plans", "top_k": 3}
    with proxy(upstreams=routes) as base, httpx.Client(timeout=10) as http:
        fetched = http.post(f"{base}/docs/search", json=query, headers={"x-ragtoll-task-id": "a"})
        assert wait_until(lambda: len(telemetry.by_name("retrieval docs")) == 1)  # a's evidence is filed
        hit = http.post(f"{base}/docs/search", json=query, headers={"x-ragtoll-task-id": "b"})
        chunk = hit.json()["results"][0]["text"]
        http.post(f"{base}/openai/v1/chat/completions", headers={"x-ragtoll-task-id": "b"},
                  json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is the refund window?"},
                                                             {"role": "user", "content": chunk}]})
        spans = call_spans(telemetry, 3)
    assert "x-ragtoll-evidence" in fetched.headers and hit.headers["x-ragtoll-cache"] == "hit; tier=exact"
    return hit, next(s for s in spans if s.name.startswith("chat"))


def test_a_cache_hit_carries_x_ragtoll_evidence(proxy: ProxyFactory, upstream: Upstream,
                                                telemetry: Telemetry) -> None:
    hit, _ = retrieve_then_ask(proxy, upstream, telemetry)
    assert hit.headers["x-ragtoll-evidence"].startswith("n=3, new=3")


def test_evidence_from_a_cache_hit_counts_in_later_prompts(proxy: ProxyFactory, upstream: Upstream,
                                                           telemetry: Telemetry) -> None:
    _, chat = retrieve_then_ask(proxy, upstream, telemetry)
    assert chat.attributes[sc.EVIDENCE_PROMPT_TOKENS] > 0
