"""Budget guarantees against sly clients (issue 23): profiles by trust, outcomes by authority,
unpriced models charged what they used, any JSON encoding read, rejections no SDK retries."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import cohere
import http_sfv
import httpx
import openai
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from opentelemetry.trace import SpanKind
from qdrant_client import QdrantClient
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.core.signing import sign_budget
from support.asgi import read_body, serve_lifespan
from support.servers import serve_in_thread

CHAT = "/v1/chat/completions"
HMAC_KEY = b"operator-hmac-key-0123456789abcdef"
TIERS = {"default_profile": "small",
         "profiles": {"small": {"max_steps": 3, "max_cost_usd": 1.0},
                      "generous": {"max_steps": 1000, "max_cost_usd": 100.0},
                      "smaller": {"max_steps": 1, "max_cost_usd": 0.5},
                      "unbounded_cost": {"max_steps": 2}}}


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    """The budget store for tests whose ledger lives in it: in-process, and a real Redis."""
    return "memory" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


def task() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def chat(http: httpx.Client, base: str, task_id: str, headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:
    doc = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], **body}
    return http.post(f"{base}/openai{CHAT}", json=doc, headers={"x-ragtoll-task-id": task_id, **(headers or {})})


def chat_spans(telemetry: Telemetry) -> list[Any]:
    return sorted((s for s in telemetry.spans() if s.name.startswith("chat")), key=lambda s: s.start_time)


# --- 2. profiles by trust ---------------------------------------------------------------------------


def test_unsigned_baggage_cannot_pick_a_more_generous_profile(proxy: ProxyFactory, upstream: Upstream,
                                                              telemetry: Telemetry, store: str) -> None:
    generous, missing_limit = task(), task()
    with proxy(budgets=TIERS, store=store) as base, httpx.Client() as http:
        codes = [chat(http, base, generous, {"baggage": "ragtoll.budget.profile=generous"}).status_code
                 for _ in range(5)]
        # no cost limit at all is more generous than $1, though it allows fewer steps
        loose = [chat(http, base, missing_limit, {"baggage": "ragtoll.budget.profile=unbounded_cost"}).status_code
                 for _ in range(4)]
    assert codes == [200, 200, 200, 402, 402]
    assert loose == [200, 200, 200, 402]
    assert upstream.app.state.calls[CHAT] == 6
    spans = chat_spans(telemetry)
    assert {s.attributes[sc.PROFILE] for s in spans} == {"small"}
    notes = spans[0].attributes[sc.BUDGET_NOTES]
    assert any("'generous' ignored: more generous than 'small' (max_steps, max_cost_usd)" in n for n in notes)
    assert any("'unbounded_cost' ignored" in n and "(max_cost_usd)" in n
               for s in spans for n in s.attributes.get(sc.BUDGET_NOTES, ()))


def test_unsigned_baggage_may_pick_a_stricter_profile(proxy: ProxyFactory, upstream: Upstream,
                                                      telemetry: Telemetry) -> None:
    t = task()
    with proxy(budgets=TIERS) as base, httpx.Client() as http:
        codes = [chat(http, base, t, {"baggage": "ragtoll.budget.profile=smaller"}).status_code for _ in range(2)]
    assert codes == [200, 402]
    assert chat_spans(telemetry)[0].attributes[sc.PROFILE_SOURCE] == "baggage"


def test_a_signed_profile_may_be_more_generous(proxy: ProxyFactory, upstream: Upstream,
                                               monkeypatch: pytest.MonkeyPatch, telemetry: Telemetry) -> None:
    monkeypatch.setenv("RAGTOLL_BUDGET_HMAC_KEY", HMAC_KEY.decode())
    signed, other, limits_only = task(), task(), task()
    grant = sign_budget(signed, {}, HMAC_KEY, time.time() + 300, profile="generous")
    # a signature over the limits alone does not cover an unsigned profile beside it
    plain = sign_budget(limits_only, {"max_steps": 4}, HMAC_KEY, time.time() + 300)
    with proxy(budgets=TIERS) as base, httpx.Client() as http:
        granted = [chat(http, base, signed, {"baggage": grant}).status_code for _ in range(5)]
        stolen = [chat(http, base, other, {"baggage": grant}).status_code for _ in range(4)]
        mixed = [chat(http, base, limits_only, {"baggage": plain + ",ragtoll.budget.profile=generous"}).status_code
                 for _ in range(5)]
    assert granted == [200] * 5
    assert stolen == [200, 200, 200, 402]  # signed for another task: the default profile
    assert mixed == [200, 200, 200, 200, 402]  # the signed raise holds, the profile does not
    assert [s.attributes[sc.PROFILE] for s in chat_spans(telemetry)][:6] == ["generous"] * 5 + ["small"]


# --- 4. charge what was used --------------------------------------------------------------------------


class UsageUpstream:
    """Answers every chat call with `completion` tokens of reported usage; counts its requests."""

    def __init__(self, completion: int) -> None:
        self.completion = completion
        self.hits = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        await read_body(receive)
        self.hits += 1
        doc = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 10, "completion_tokens": self.completion,
                         "total_tokens": 10 + self.completion}}
        payload = orjson.dumps(doc)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})


def test_an_unpriced_model_is_charged_its_reported_usage_at_the_default_price(proxy: ProxyFactory,
                                                                               telemetry: Telemetry, store: str) -> None:
    with serve_in_thread(UsageUpstream(3000)) as fake:
        ups = [{"name": "local", "kind": "llm", "api": "openai", "url": fake, "prefix": "/openai"}]
        cfg = {"default_profile": "p", "profiles": {"p": {"max_cost_usd": 1.0}}}
        with proxy(upstreams=ups, budgets=cfg, store=store) as base, httpx.Client() as http:
            t = task()
            first = chat(http, base, t, model="my-local-llm")
            second = chat(http, base, t, model="my-local-llm")
    assert (first.status_code, second.status_code) == (200, 200)
    # pricing.default: $2.50/M input, $10/M output -> 10 prompt + 3000 completion tokens = $0.030025
    spans = chat_spans(telemetry)
    assert spans[0].attributes[sc.COST_USD] == pytest.approx(0.030025)
    assert spans[0].attributes[sc.COST_ESTIMATED] is True
    assert reserved(spans[1]) == pytest.approx(1024 * 10 / 1e6, abs=1e-4)  # 1,024 default output tokens at $10/M
    # the header shows settled spend: the first call's, not the second's reservation
    assert float(remaining(second)["max_cost_usd"]) == pytest.approx(1.0 - 0.030025, abs=1e-3)


def reserved(span: Any) -> float:
    charge = next(e for e in span.events if e.name == sc.EVENT_CHARGE)
    return float(charge.attributes["cost_usd_reserved"])


def remaining(resp: httpx.Response) -> dict[str, Any]:
    d = http_sfv.Dictionary()
    d.parse(resp.headers["x-ragtoll-budget-remaining"].encode())
    return {k: v.value for k, v in d.items()}


# --- 7. rejections no SDK retries ---------------------------------------------------------------------


def _openai(base: str) -> None:
    with openai.OpenAI(base_url=f"{base}/openai/v1", api_key="k", default_headers=TASK_HEADER) as client:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}])


def _anthropic(base: str) -> None:
    with anthropic.Anthropic(base_url=f"{base}/anthropic", api_key="k", default_headers=TASK_HEADER) as client:
        client.messages.create(model="claude-haiku-4-5", max_tokens=5, messages=[{"role": "user", "content": "q"}])


def _cohere_v1(base: str) -> None:
    with httpx.Client(headers=TASK_HEADER) as http:
        cohere.Client(api_key="k", base_url=f"{base}/cohere", httpx_client=http).rerank(
            model="rerank-v3.5", query="q", documents=["a", "b"])


def _cohere_v2(base: str) -> None:
    with httpx.Client(headers=TASK_HEADER) as http:
        cohere.ClientV2(api_key="k", base_url=f"{base}/cohere", httpx_client=http).rerank(
            model="rerank-v3.5", query="q", documents=["a", "b"])


def _qdrant(base: str) -> None:
    client = QdrantClient(url=base, prefix="qdrant", check_compatibility=False, metadata=TASK_HEADER)
    try:
        client.query_points(collection_name="docs", query=[1.0, 0.0, 0.0], limit=2)
    finally:
        client.close()


TASK_HEADER = {"x-ragtoll-task-id": "refused-task"}
SDKS = {"openai": (_openai, 402), "anthropic": (_anthropic, 402), "cohere-v1": (_cohere_v1, 402),
        "cohere-v2": (_cohere_v2, 402), "qdrant-client": (_qdrant, 429)}


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_each_sdk_sends_a_refused_call_once(proxy: ProxyFactory, telemetry: Telemetry, sdk: str) -> None:
    """Each SDK with its default retries: one proxy hit, no upstream hit, the budget error raised."""
    call, status = SDKS[sdk]
    upstream = UsageUpstream(1)
    with serve_in_thread(upstream) as fake:
        ups = [{"name": "openai", "kind": "llm", "api": "openai", "url": fake, "prefix": "/openai"},
               {"name": "claude", "kind": "llm", "api": "anthropic", "url": fake, "prefix": "/anthropic"},
               {"name": "rr", "kind": "rerank", "api": "cohere", "url": fake, "prefix": "/cohere"},
               {"name": "vectors", "kind": "retrieval", "api": "qdrant", "url": fake, "prefix": "/qdrant"}]
        with proxy(upstreams=ups, budgets={"default_profile": "p", "profiles": {"p": {"max_calls": 0}}}) as base, \
                pytest.raises(Exception) as info:  # each SDK has its own error class
            call(base)
    hits = [s for s in telemetry.spans() if s.kind == SpanKind.SERVER]
    assert (len(hits), upstream.hits) == (1, 0)
    assert hits[0].attributes[sc.HTTP_RESPONSE_STATUS_CODE] == status
    assert "budget exhausted: max_calls" in str(info.value)


@pytest.mark.slow
def test_a_deadline_that_cuts_the_upstream_timeout_is_the_budget_rejection(proxy: ProxyFactory, upstream: Upstream,
                                                                         telemetry: Telemetry) -> None:
    """Not a 504 the OpenAI SDK retries: the slow call reaches the upstream once, then a 402."""
    # 1.5 s: the first call must finish inside the deadline on a loaded machine too
    budgets = {"default_profile": "p", "profiles": {"p": {"max_latency_ms": 1500}}}
    with proxy(budgets=budgets) as base, \
            openai.OpenAI(base_url=f"{base}/openai/v1", api_key="k", max_retries=2,
                          default_headers={"x-ragtoll-task-id": task()}) as client:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}])
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}],
                                           extra_headers={"x-test-delay": "3"})
    assert upstream.app.state.calls[CHAT] == 2
    assert len([s for s in telemetry.spans() if s.kind == SpanKind.SERVER]) == 2  # the SDK did not retry
    error = info.value.response.json()["error"]
    assert (error["code"], error["dimension"], error["limit"]) == ("budget_exceeded", "max_latency_ms", 1500)
    assert error["used"] >= 1500
    slow = chat_spans(telemetry)[1]
    assert slow.attributes[sc.BUDGET_EXCEEDED_DIMENSION] == "max_latency_ms"
    assert slow.attributes[sc.BUDGET_EXCEEDED] is True


# --- 5. parse parity ----------------------------------------------------------------------------------


ENCODINGS = ["utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-be"]


class AnyJsonUpstream:
    """Reads JSON as Python's json module does (any RFC 8259/4627 encoding) and answers in
    `answer_encoding`: chat (whole, or streamed `words` SSE events) and `/search`. Counts its hits."""

    def __init__(self, answer_encoding: str = "utf-8", words: int = 400) -> None:
        self.answer_encoding = answer_encoding
        self.words = words
        self.hits = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        self.send_ = send
        try:
            doc = json.loads(await read_body(receive))
        except ValueError:
            doc = {}  # a lenient upstream: answers what it cannot read as a chat call
        self.hits += 1
        if scope["path"].endswith("/search"):
            results = [{"id": f"{doc['query']}-{i}", "text": "x", "score": 0.5} for i in range(2)]
            return await self._send({"results": results})
        if doc.get("stream"):
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
            for _ in range(self.words):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o-mini",
                         "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": None}]}
                await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(chunk) + b"\n\n",
                            "more_body": True})
            return await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        usage = {"prompt_tokens": 10, "completion_tokens": 700, "total_tokens": 710}
        return await self._send({"id": "c", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
                                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                              "finish_reason": "stop"}], "usage": usage})

    async def _send(self, doc: Any) -> None:
        payload = json.dumps(doc).encode(self.answer_encoding)
        await self.send_({"type": "http.response.start", "status": 200,
                          "headers": [(b"content-type", b"application/json")]})
        await self.send_({"type": "http.response.body", "body": payload})


def post_json(http: httpx.Client, url: str, doc: Any, encoding: str, task_id: str) -> httpx.Response:
    return http.post(url, content=json.dumps(doc).encode(encoding),
                     headers={"content-type": "application/json", "x-ragtoll-task-id": task_id})


@contextlib.contextmanager
def served(proxy: ProxyFactory, fake: AnyJsonUpstream, budgets: dict[str, Any], store: str = "memory",
           ) -> Iterator[str]:
    with serve_in_thread(fake) as url:
        ups = [{"name": "openai", "kind": "llm", "api": "openai", "url": url, "prefix": "/openai"},
               {"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs"}]
        with proxy(upstreams=ups, budgets=budgets, cache={"enabled": False}, store=store) as base:
            yield base


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_bodies_in_any_json_encoding_are_budgeted(proxy: ProxyFactory, encoding: str, store: str) -> None:
    fake = AnyJsonUpstream()
    prompt = "word " * 5000
    limits = {"max_prompt_tokens": 200, "max_unique_queries": 5}
    with served(proxy, fake, {"default_profile": "p", "profiles": {"p": limits}}, store) as base, \
            httpx.Client() as http:
        big = post_json(http, f"{base}/openai{CHAT}",
                        {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]}, encoding, task())
        t = task()
        searches = [post_json(http, f"{base}/docs/search", {"query": f"question {i}"}, encoding, t).status_code
                    for i in range(10)]
    assert big.status_code == 402 and big.json()["error"]["dimension"] == "max_prompt_tokens"
    assert searches == [200] * 5 + [429] * 5  # a passthrough search route keeps 429
    assert fake.hits == 5


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16"])
def test_a_stream_asked_for_in_any_encoding_is_cut(proxy: ProxyFactory, encoding: str) -> None:
    fake = AnyJsonUpstream(words=400)
    doc = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "go on"}]}
    cfg = {"default_profile": "p", "profiles": {"p": {"max_completion_tokens": 50}}}
    with served(proxy, fake, cfg) as base, httpx.Client() as http:
        raw = post_json(http, f"{base}/openai{CHAT}", doc, encoding, task()).content
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert orjson.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert len(events) < 100  # cut near 50 tokens, not the 400 words sent


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16-le", "utf-32-be"])
def test_an_upstream_answer_in_any_json_encoding_is_read(proxy: ProxyFactory, telemetry: Telemetry,
                                                         encoding: str) -> None:
    fake = AnyJsonUpstream(answer_encoding=encoding)
    cfg = {"default_profile": "p", "profiles": {"p": {"max_completion_tokens": 10_000}}}
    with served(proxy, fake, cfg) as base, httpx.Client() as http:
        t = task()
        post_json(http, f"{base}/openai{CHAT}", {"model": "gpt-4o-mini", "messages": []}, "utf-8", t)
        after = post_json(http, f"{base}/openai{CHAT}", {"model": "gpt-4o-mini", "messages": []}, "utf-8", t)
    span = chat_spans(telemetry)[0]
    assert sc.PARSE_ERROR not in span.attributes
    assert span.attributes[sc.GEN_AI_USAGE_OUTPUT_TOKENS] == 700
    # settled 700 (the second call's own reservation is not in the header)
    assert remaining(after)["max_completion_tokens"] == 10_000 - 700


@pytest.mark.slow
def test_an_unreadable_body_is_refused_or_charged_its_reservation(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    fake = AnyJsonUpstream()
    garbage = b'{"model": "gpt-4o-mini", "messages": [' + "é".encode("latin-1") + b"]}"
    cfg = {"default_profile": "p", "profiles": {"p": {"max_steps": 5, "max_completion_tokens": 3000}}}
    with served(proxy, fake, cfg) as base, httpx.Client() as http:
        refused = http.post(f"{base}/openai{CHAT}", content=garbage, headers={"x-ragtoll-task-id": task()})
    assert refused.status_code == 400 and fake.hits == 0
    error = refused.json()["error"]
    assert error["code"] == "unreadable_body" and "not JSON" in error["reason"]
    with served(proxy, fake, {**cfg, "on_unreadable": "charge_reservation"}) as base, httpx.Client() as http:
        t = task()
        charged = [http.post(f"{base}/openai{CHAT}", content=garbage, headers={"x-ragtoll-task-id": t})
                   for _ in range(3)]
    # forwarded, each reserving its 1024 default output tokens; the upstream's usage (700) settles,
    # and the header shows what settled
    assert [r.status_code for r in charged] == [200, 200, 200] and fake.hits == 3
    assert [remaining(r)["max_completion_tokens"] for r in charged] == [3000, 3000 - 700, 3000 - 1400]
    assert sc.PARSE_ERROR in chat_spans(telemetry)[-1].attributes
