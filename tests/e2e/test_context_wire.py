"""The context stage on the wire: the real openai and anthropic SDKs call ragtoll, and the
upstream sees the rewritten body: a prompt_cache_key, cache_control breakpoints, a repeated chunk
sent as a reference; spans and the task record say what was done and what the cache served."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.tools.report import read_jsonl
from support.fake_backends import FakeBackends
from support.servers import serve_in_thread

CHUNK = "Refunds on annual plans are allowed within 30 days of purchase. " * 6
OTHER = "Monthly plans renew automatically on the first day of each month. " * 6


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[str, FakeBackends]]:
    app = FakeBackends()
    with serve_in_thread(app) as url:
        yield url, app


def _tool(*chunks: tuple[str, str]) -> str:
    return orjson.dumps({"chunks": [{"id": cid, "text": text} for cid, text in chunks]}).decode()


def _conversation() -> list[Any]:
    return [
        {"role": "system", "content": "You answer from the documents."},
        {"role": "user", "content": "Can I get a refund on an annual plan?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "retrieve", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": _tool(("c1", CHUNK))},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "b", "type": "function", "function": {"name": "retrieve", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "b", "content": _tool(("c1", CHUNK), ("c2", OTHER))},
    ]


def _end(base: str, task: str, token: str) -> dict[str, Any]:
    r = httpx.post(f"{base}/admin/tasks/{task}/end", json={"correct": True},
                   headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return r.json()


def _span(telemetry: Telemetry, attr: str) -> Any:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = [s for s in telemetry.spans() if attr in (s.attributes or {})]
        if found:
            return found[-1]
        time.sleep(0.01)
    raise AssertionError(f"no span with {attr}")


def test_openai_route_gets_a_cache_key_and_evidence_once(proxy: ProxyFactory, upstream: Upstream,
                                                          telemetry: Telemetry, admin_token: str,
                                                          tmp_path: Any) -> None:
    with proxy(context={"prompt_cache_key": "task"}) as base, \
            openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0) as client:
        client.chat.completions.create(model="gpt-4o-mini", messages=_conversation(),
                                       extra_headers={"x-ragtoll-task-id": "ctx-1"})
        client.chat.completions.create(model="gpt-4o-mini", messages=_conversation(),
                                       extra_headers={"x-ragtoll-task-id": "ctx-1"}, prompt_cache_key="mine")
        sent = [orjson.loads(r["body"]) for r in upstream.app.state.requests if r["path"].endswith("/chat/completions")]
        assert sent[0]["prompt_cache_key"].startswith("ragtoll-") and sent[1]["prompt_cache_key"] == "mine"
        for body in sent:
            assert body["messages"][:5] == _conversation()[:5]  # earlier messages go as they came
            chunks = orjson.loads(body["messages"][5]["content"])["chunks"]
            assert chunks == [{"id": "c1", "text": "[same text as chunk c1 in message 3; not repeated]"},
                              {"id": "c2", "text": OTHER}]
        span = _span(telemetry, sc.CONTEXT_CHUNKS_REFERENCED)
        assert span.attributes[sc.CONTEXT_CHUNKS_REFERENCED] == 1
        assert span.attributes[sc.CONTEXT_CHARS_SAVED] > 300
        record = _end(base, "ctx-1", admin_token)
    assert record["context"]["chunks_referenced"] == 2 and record["context"]["cache_keys_set"] == 1
    assert record["context"]["input_tokens"] == 24 and record["context"]["cached_input_share"] == 0
    written = [r for r in read_jsonl(str(tmp_path / "records.jsonl")) if r.get("task_id") == "ctx-1"]
    assert written[0]["context"]["chunks_referenced"] == 2


def test_auto_cache_key_is_off_for_a_server_that_is_not_openai(proxy: ProxyFactory, upstream: Upstream) -> None:
    """An OpenAI-compatible server may refuse a field it does not know: `auto` sets no key there."""
    with proxy() as base, openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0) as client:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    body = orjson.loads(upstream.app.state.requests[-1]["body"])
    assert "prompt_cache_key" not in body


def test_anthropic_route_gets_breakpoints_and_cache_usage_on_the_span(
        proxy: ProxyFactory, backends: tuple[str, FakeBackends], telemetry: Telemetry) -> None:
    url, app = backends
    system = "You answer questions about Northwind Cloud from its documents. " * 80  # ~1300 tokens
    ups = [{"name": "claude", "kind": "llm", "api": "anthropic", "url": url, "prefix": "/anthropic"}]
    with proxy(upstreams=ups) as base, \
            anthropic.Anthropic(base_url=f"{base}/anthropic", api_key="sk-ant-test", max_retries=0) as client:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=50, system=system, messages=[
            {"role": "user", "content": "Can I get a refund?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "retrieve", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": CHUNK}]}],
            tools=[{"name": "retrieve", "description": "search", "input_schema": {"type": "object"}}],
            extra_headers={"x-ragtoll-task-id": "ctx-a"})
    body = orjson.loads(app.requests[-1]["body"])
    assert body["system"] == [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    assert body["messages"][2]["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"][0] == {"role": "user", "content": "Can I get a refund?"}
    span = _span(telemetry, sc.CONTEXT_BREAKPOINTS_ADDED)
    assert span.attributes[sc.CONTEXT_BREAKPOINTS_ADDED] == 2 and span.attributes[sc.CONTEXT_BREAKPOINTS_CLIENT] == 0
    assert span.attributes[sc.CONTEXT_CACHED_SHARE] == pytest.approx(1200 / 1610, abs=1e-4)


ODD_SHAPES = [
    {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": ["a message that is a string"]},
    {"model": "claude-sonnet-4-5", "max_tokens": 5, "system": 7, "messages": [{"role": "user", "content": 5}]},
    {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": [7, {"type": 3}]}]},
    {"model": "claude-sonnet-4-5", "max_tokens": 5, "tools": "none", "messages": [{"role": "user", "content": "q"}]},
]


@pytest.mark.parametrize("doc", ODD_SHAPES)
def test_a_body_of_an_odd_shape_goes_on_as_it_came(proxy: ProxyFactory, backends: tuple[str, FakeBackends],
                                                   doc: dict[str, Any]) -> None:
    """The rewrites read message lists, content blocks and tools: a shape they do not expect is not
    an internal error, and the upstream gets the client's bytes unchanged."""
    url, app = backends
    ups = [{"name": "claude", "kind": "llm", "api": "anthropic", "url": url, "prefix": "/anthropic"}]
    sent = orjson.dumps(doc)
    with proxy(upstreams=ups) as base:
        r = httpx.post(f"{base}/anthropic/v1/messages", content=sent,
                       headers={"content-type": "application/json", "x-ragtoll-task-id": "ctx-odd"})
    assert r.status_code != 500, r.text
    assert app.requests[-1]["body"] == sent


def test_adaptive_depth_trims_a_retrieval_answer_and_says_so(proxy: ProxyFactory, upstream: Upstream,
                                                             telemetry: Telemetry) -> None:
    """The fake search answers with scores 0.9, 0.8, 0.7, ...: a floor at 0.85 of the top keeps 2
    (0.9 and 0.8 >= 0.765); the client gets a shorter valid answer and x-ragtoll-depth."""
    ups = [{"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url, "prefix": "/docs",
            "fields": {"acl": "metadata.groups", "version_header": "x-index-version"}}]
    with proxy(upstreams=ups, context={"depth": True, "depth_gap": 0, "depth_floor": 0.85}) as base:
        r = httpx.post(f"{base}/docs/search", json={"query": "refunds", "top_k": 5},
                       headers={"x-ragtoll-task-id": "depth-1"})
        whole = httpx.post(f"{upstream.url}/search", json={"query": "refunds", "top_k": 5})
    assert r.status_code == 200
    assert [x["id"] for x in r.json()["results"]] == [x["id"] for x in whole.json()["results"]][:2]
    assert int(r.headers["content-length"]) == len(r.content)
    assert r.headers["x-ragtoll-depth"] == "kept=2, returned=5, reason=floor"
    span = _span(telemetry, sc.CONTEXT_DEPTH_KEPT)
    assert (span.attributes[sc.CONTEXT_DEPTH_KEPT], span.attributes[sc.CONTEXT_DEPTH_RETURNED]) == (2, 5)


def test_default_depth_cuts_only_at_a_large_drop(proxy: ProxyFactory, upstream: Upstream) -> None:
    """By default (depth on, depth_gap 0.15) evenly falling scores (0.9, 0.8, ...: drops of 11% of
    the top) all go through; a route can turn depth off."""
    ups = [{"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url, "prefix": "/docs"}]
    with proxy(upstreams=ups) as base:
        r = httpx.post(f"{base}/docs/search", json={"query": "refunds", "top_k": 5})
    assert len(r.json()["results"]) == 5 and "x-ragtoll-depth" not in r.headers
    with proxy(upstreams=ups, context={"depth_floor": 0.85, "routes": {"docs": {"depth": False}}}) as base:
        r = httpx.post(f"{base}/docs/search", json={"query": "refunds", "top_k": 5})
    assert len(r.json()["results"]) == 5 and "x-ragtoll-depth" not in r.headers
