"""Adapters on the wire: the real openai, anthropic, cohere and qdrant-client SDKs drive ragtoll
over loopback; the call spans carry what the adapters read (model, usage, finish, top_k, ...)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import cohere
import httpx
import openai
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from qdrant_client import QdrantClient
from ragtoll.instrumentation import semconv as sc
from support.fake_backends import FakeBackends
from support.servers import serve_in_thread


class Backends:
    def __init__(self, url: str, app: FakeBackends) -> None:
        self.url = url
        self.app = app


@pytest.fixture(scope="module")
def backends() -> Iterator[Backends]:
    app = FakeBackends()
    with serve_in_thread(app) as url:
        yield Backends(url, app)


@pytest.fixture
def wired(proxy: ProxyFactory, upstream: Upstream, backends: Backends) -> Iterator[str]:
    ups: list[dict[str, Any]] = [
        {"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"},
        {"name": "oai", "kind": "llm", "api": "openai", "url": backends.url, "prefix": "/oai"},
        {"name": "claude", "kind": "llm", "api": "anthropic", "url": backends.url, "prefix": "/anthropic"},
        {"name": "rr", "kind": "rerank", "api": "cohere", "url": backends.url, "prefix": "/cohere"},
        {"name": "tei", "kind": "rerank", "api": "tei", "url": backends.url, "prefix": "/tei"},
        {"name": "vectors", "kind": "retrieval", "api": "qdrant", "url": backends.url, "prefix": "/qdrant",
         "fields": {"acl": "payload.groups", "version_header": "x-index-version"}},
    ]
    with proxy(upstreams=ups, budgets={"mode": "shadow"}) as base:
        yield base


def span(telemetry: Telemetry, name: str) -> Any:
    """The call span named `name`; it ends just after the body's last byte, so wait for it briefly."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = telemetry.by_name(name)
        if found:
            return found[-1]
        time.sleep(0.01)
    raise AssertionError(f"no span {name!r}; have {[s.name for s in telemetry.spans()]}")


@pytest.mark.slow
def test_openai_chat_counts_the_prompt_and_reads_usage(wired: str, telemetry: Telemetry) -> None:
    with openai.OpenAI(base_url=f"{wired}/openai/v1", api_key="sk-test", max_retries=0) as client:
        client.chat.completions.create(model="gpt-4o-mini", max_tokens=50,
                                       messages=[{"role": "user", "content": "hello world"}])
    attrs = span(telemetry, "chat gpt-4o-mini").attributes
    assert attrs[sc.PROMPT_TOKENS_ESTIMATE] == 2 + 3 + 3
    assert attrs[sc.PROMPT_TOKENS_ESTIMATED] is False
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 12 and attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 3
    assert attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] == 50
    assert list(attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["stop"]


def test_openai_stream_usage_is_read_as_it_passes(wired: str, telemetry: Telemetry) -> None:
    with openai.OpenAI(base_url=f"{wired}/openai/v1", api_key="sk-test", max_retries=0) as client:
        stream = client.chat.completions.create(model="gpt-4o", stream=True, stream_options={"include_usage": True},
                                                messages=[{"role": "user", "content": "hi"}])
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello there."
    attrs = span(telemetry, "chat gpt-4o").attributes
    assert attrs[sc.STREAM] is True
    assert attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 5


def test_openai_embeddings(wired: str, telemetry: Telemetry) -> None:
    with openai.OpenAI(base_url=f"{wired}/openai/v1", api_key="sk-test", max_retries=0) as client:
        out = client.embeddings.create(model="text-embedding-3-small", input=["hello world", "again"])
    assert len(out.data) == 2
    attrs = span(telemetry, "embeddings text-embedding-3-small").attributes
    assert attrs[sc.PROMPT_TOKENS_ESTIMATE] == 3 and attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 8


@pytest.mark.slow
def test_openai_responses_api_streamed_and_not(wired: str, telemetry: Telemetry) -> None:
    with openai.OpenAI(base_url=f"{wired}/oai/v1", api_key="sk-test", max_retries=0) as client:
        whole = client.responses.create(model="gpt-4.1", input="Tell me a story", max_output_tokens=300)
        with client.responses.stream(model="gpt-4.1-mini", input="hi") as stream:
            final = stream.get_final_response()
    assert whole.output_text.startswith("In a peaceful grove")
    assert final.output_text == "Hi there!"
    a = span(telemetry, "chat gpt-4.1").attributes
    assert a[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 87 and a[sc.GEN_AI_REQUEST_MAX_TOKENS] == 300
    s = span(telemetry, "chat gpt-4.1-mini").attributes
    assert s[sc.GEN_AI_USAGE_INPUT_TOKENS] == 37 and list(s[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["stop"]


def test_anthropic_sdk_messages_and_stream(wired: str, telemetry: Telemetry, backends: Backends) -> None:
    client = anthropic.Anthropic(base_url=f"{wired}/anthropic", api_key="sk-ant-test", max_retries=0)
    try:
        _anthropic_calls(client, telemetry, backends)
    finally:
        client.close()


def _anthropic_calls(client: anthropic.Anthropic, telemetry: Telemetry, backends: Backends) -> None:
    msg = client.messages.create(model="claude-sonnet-4-6", max_tokens=100, system="Be brief.",
                                 messages=[{"role": "user", "content": "Weather in San Francisco?"}])
    assert msg.stop_reason == "end_turn"
    sent = orjson.loads(backends.app.requests[-1]["body"])
    assert sent["system"] == "Be brief."  # forwarded unchanged
    attrs = span(telemetry, "chat claude-sonnet-4-6").attributes
    assert attrs[sc.PROMPT_TOKENS_ESTIMATED] is True
    assert attrs[sc.GEN_AI_USAGE_INPUT_TOKENS] == 1610 and attrs[sc.GEN_AI_USAGE_CACHED_INPUT_TOKENS] == 1200
    with client.messages.stream(model="claude-haiku-4-5", max_tokens=64,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "text"
    s = span(telemetry, "chat claude-haiku-4-5").attributes
    assert s[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 15 and list(s[sc.GEN_AI_RESPONSE_FINISH_REASONS]) == ["tool_use"]


def test_cohere_sdk_rerank(wired: str, telemetry: Telemetry) -> None:
    docs = ["Carson City is in Nevada.", "Saipan.", "Washington, D.C. is the capital.", "Capitalization.", "Punishment."]
    with httpx.Client() as http:
        client = cohere.ClientV2(api_key="co-test", base_url=f"{wired}/cohere", max_retries=0, httpx_client=http)
        out = client.rerank(model="rerank-v3.5", query="capital of the US?", documents=docs, top_n=3)
    assert [r.index for r in out.results] == [2, 4, 0]
    attrs = span(telemetry, "rerank rerank-v3.5").attributes
    assert attrs[sc.GEN_AI_REQUEST_TOP_K] == 3


def test_qdrant_client_query_points(wired: str, telemetry: Telemetry, backends: Backends) -> None:
    client = QdrantClient(url=wired, prefix="qdrant", check_compatibility=False, timeout=10)
    try:
        hits = client.query_points(collection_name="docs", query=[1.0, 0.0, 0.0], limit=2).points
        one = client.query_points(collection_name="docs", query=[0.0, 0.0, 1.0], limit=1,
                                  query_filter={"must": [{"key": "source", "match": {"value": "geo"}}]}).points
    finally:
        client.close()
    assert [h.id for h in hits] == [1, 3] and hits[0].payload is not None
    assert [h.id for h in one] == [4]
    assert backends.app.requests[-1]["path"] == "/collections/docs/points/query"
    span(telemetry, "retrieval vectors")
    deadline = time.monotonic() + 5
    while len(telemetry.by_name("retrieval vectors")) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    top_ks = sorted(s.attributes[sc.GEN_AI_REQUEST_TOP_K] for s in telemetry.by_name("retrieval vectors"))
    assert top_ks == [1, 2]


def test_malformed_bodies_are_forwarded_unchanged_and_marked(wired: str, telemetry: Telemetry,
                                                             backends: Backends) -> None:
    raw = b'{"model": "claude-x", "messages": [ broken'
    r = httpx.post(f"{wired}/anthropic/v1/messages", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == "body is not JSON"  # the upstream's verdict
    assert backends.app.requests[-1]["body"] == raw
    attrs = span(telemetry, "chat claude").attributes
    assert "not JSON" in attrs[sc.PARSE_ERROR]
