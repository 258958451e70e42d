"""Per-task budgets end to end over loopback: real SDKs, the rejection contract, baggage trust,
mid-stream cuts, the deadline, shadow mode, evidence stalls and the cache-hit charge."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import anthropic
import http_sfv
import httpx
import openai
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream, default_upstreams
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.request.identify import derived_trace_id
from ragtoll.proxy.tasks.admin import OPENAPI
from support.asgi import read_body, serve_lifespan

CHAT = "/v1/chat/completions"
PRICING = {"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.60}, "docs": {"per_call": 0.0005}}


def upstreams(base: str) -> list[dict[str, Any]]:
    ups = [u for u in default_upstreams(base) if u["name"] != "docs"]
    return ups + [
        {"name": "docs", "kind": "retrieval", "api": "json", "url": base, "prefix": "/docs"},
        {"name": "claude", "kind": "llm", "api": "anthropic", "url": base, "prefix": "/anthropic"},
    ]


def budgets(**profile: Any) -> dict[str, Any]:
    return {"default_profile": "p", "profiles": {"p": profile}}


def task() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def chat(http: httpx.Client, base: str, task_id: str, headers: dict[str, str] | None = None,
         **body: Any) -> httpx.Response:
    doc = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], **body}
    return http.post(f"{base}/openai{CHAT}", json=doc, headers={"x-ragtoll-task-id": task_id, **(headers or {})})


def search(http: httpx.Client, base: str, task_id: str, query: str) -> httpx.Response:
    return http.post(f"{base}/docs/search", json={"query": query, "top_k": 3}, headers={"x-ragtoll-task-id": task_id})


def remaining(resp: httpx.Response) -> dict[str, Any]:
    d = http_sfv.Dictionary()
    d.parse(resp.headers["x-ragtoll-budget-remaining"].encode())
    return {k: v.value for k, v in d.items()}


def call_spans(telemetry: Telemetry, prefix: str) -> list[Any]:
    return sorted((s for s in telemetry.spans() if s.name.startswith(prefix)), key=lambda s: s.start_time)


def test_openai_sdk_sees_one_budget_error_and_the_upstream_no_retry(proxy: ProxyFactory, upstream: Upstream,
                                                                     telemetry: Telemetry,
                                                                     request: pytest.FixtureRequest) -> None:
    t = task()
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_steps=2)) as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=3,
                               default_headers={"x-ragtoll-task-id": t})
        request.addfinalizer(client.close)
        for _ in range(2):
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}])
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}])
    assert upstream.app.state.calls[CHAT] == 2
    resp = info.value.response
    assert resp.status_code == 402
    assert resp.headers["x-should-retry"] == "false"
    assert "retry-after" not in resp.headers
    assert remaining(resp) == {"max_steps": 0}
    err = resp.json()["error"]
    assert (err["code"], err["dimension"], err["limit"], err["used"], err["profile"], err["task_id"]) == \
        ("budget_exceeded", "max_steps", 2, 2, "p", t)
    rejected = call_spans(telemetry, "chat")[-1]
    assert rejected.attributes[sc.BUDGET_EXCEEDED] is True
    assert rejected.attributes[sc.BUDGET_EXCEEDED_DIMENSION] == "max_steps"
    assert rejected.attributes[sc.budget_used("max_steps")] == 2
    assert any(e.name == sc.EVENT_EXCEEDED and e.attributes["dimension"] == "max_steps" for e in rejected.events)


def test_reject_status_is_configurable(proxy: ProxyFactory, upstream: Upstream) -> None:
    """LLM routes refuse with 402 by default (frameworks retry 429); an operator who wants the 429
    contract sets it for every route (`budgets.reject_status`) or one route (its `reject_status`)."""
    with proxy(upstreams=upstreams(upstream.url), budgets={**budgets(max_calls=0), "reject_status": 429}) as base, \
            httpx.Client() as http:
        r = chat(http, base, task())
    assert r.status_code == 429 and r.json()["error"]["dimension"] == "max_calls"
    per_route = [{**u, "reject_status": 429} if u["name"] == "openai" else u for u in upstreams(upstream.url)]
    with proxy(upstreams=per_route, budgets=budgets(max_calls=0)) as base, httpx.Client() as http:
        assert chat(http, base, task()).status_code == 429
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_calls=0)) as base, httpx.Client() as http:
        assert chat(http, base, task()).status_code == 402
    assert upstream.app.state.calls[CHAT] == 0


def test_anthropic_sdk_gets_an_anthropic_shaped_error(proxy: ProxyFactory, upstream: Upstream,
                                                      request: pytest.FixtureRequest) -> None:
    t = task()
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_steps=0)) as base:
        client = anthropic.Anthropic(base_url=f"{base}/anthropic", api_key="k", max_retries=3,
                                     default_headers={"x-ragtoll-task-id": t})
        request.addfinalizer(client.close)
        with pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(model="claude-test-model", max_tokens=100,
                                   messages=[{"role": "user", "content": "hi"}])
    body = info.value.response.json()
    assert body["type"] == "error" and body["error"]["dimension"] == "max_steps"
    assert body["error"]["task_id"] == t and upstream.app.state.calls["/v1/messages"] == 0


def test_plain_routes_get_a_plain_error(proxy: ProxyFactory, upstream: Upstream) -> None:
    t = task()
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_retrieval_calls=1)) as base, \
            httpx.Client() as http:
        assert search(http, base, t, "refund policy").status_code == 200
        r = search(http, base, t, "refund window")
    assert r.status_code == 429 and r.headers["x-should-retry"] == "false"
    err = r.json()["error"]
    assert err["dimension"] == "max_retrieval_calls" and err["limit"] == 1 and err["used"] == 1
    assert upstream.app.state.calls["/search"] == 1


def test_every_response_carries_remaining_and_a_warning_past_the_fraction(
        proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry) -> None:
    t = task()
    cfg = {**budgets(max_steps=5, max_cost_usd=0.05, max_context_tokens=10_000), "warn_fraction": 0.6}
    with proxy(upstreams=upstreams(upstream.url), budgets=cfg, pricing=PRICING) as base, httpx.Client() as http:
        rs = [chat(http, base, t, max_tokens=20) for _ in range(3)]
    assert [remaining(r)["max_steps"] for r in rs] == [4, 3, 2]
    left = [remaining(r) for r in rs]
    # tokens and cost: what settled calls used; the call's own reservation is not in it (docs/budgets.md)
    assert float(left[0]["max_cost_usd"]) == 0.05 and left[0]["max_context_tokens"] == 10_000
    assert 0 < float(left[1]["max_cost_usd"]) < 0.05 and left[1]["max_context_tokens"] < 10_000
    assert float(left[2]["max_cost_usd"]) <= float(left[1]["max_cost_usd"])
    assert left[2]["max_context_tokens"] < left[1]["max_context_tokens"]
    assert "x-ragtoll-budget-warning" not in rs[1].headers
    assert "max_steps" in rs[2].headers["x-ragtoll-budget-warning"]
    last = call_spans(telemetry, "chat")[-1]
    assert any(e.name == sc.EVENT_WARNING and e.attributes["dimension"] == "max_steps" for e in last.events)
    # the span gives limit and used; remaining, which is limit - used here, it leaves out
    assert (last.attributes[sc.budget_limit("max_steps")], last.attributes[sc.budget_used("max_steps")]) == (5, 3)
    assert sc.budget_remaining("max_steps") not in last.attributes
    assert last.attributes[sc.COST_USD] > 0


def test_shadow_mode_rejects_nothing_and_records_everything(proxy: ProxyFactory, upstream: Upstream,
                                                            telemetry: Telemetry, tmp_path: Any) -> None:
    t = task()
    cfg = {**budgets(max_steps=1), "mode": "shadow", "records_file": str(tmp_path / "r.jsonl")}
    with proxy(upstreams=upstreams(upstream.url), budgets=cfg) as base, \
            httpx.Client() as http:
        rs = [chat(http, base, t) for _ in range(3)]
        ended = _admin_end(http, base, t)
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert upstream.app.state.calls[CHAT] == 3
    assert "x-ragtoll-budget-would-reject" not in rs[0].headers
    assert rs[2].headers["x-ragtoll-budget-would-reject"] == "max_steps"
    spans = call_spans(telemetry, "chat")
    assert spans[2].attributes[sc.BUDGET_WOULD_REJECT] == "max_steps"
    assert spans[2].attributes[sc.BUDGET_MODE] == "shadow"
    assert any(e.name == sc.EVENT_EXCEEDED and e.attributes["would_reject"] for e in spans[2].events)
    assert ended["would_reject"] == {"max_steps": 2} and ended["rejections"] == {} and ended["steps"] == 3


def test_shadow_per_profile(proxy: ProxyFactory, upstream: Upstream) -> None:
    cfg = {"default_profile": "p", "profiles": {"p": {"max_steps": 0, "mode": "shadow"}, "q": {"max_steps": 0}}}
    with proxy(upstreams=upstreams(upstream.url), budgets=cfg) as base, httpx.Client() as http:
        shadowed = chat(http, base, task())
        enforced = chat(http, base, task(), headers={"baggage": "ragtoll.budget.profile=q"})
    assert (shadowed.status_code, enforced.status_code) == (200, 402)


def test_forged_baggage_cannot_raise_a_limit_but_can_lower_it(proxy: ProxyFactory, upstream: Upstream,
                                                             telemetry: Telemetry) -> None:
    raise_it = {"baggage": "ragtoll.budget.max_steps=100"}
    lower_it = {"baggage": "ragtoll.budget.max_steps=1"}
    t1, t2 = task(), task()
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_steps=2)) as base, httpx.Client() as http:
        forged = [chat(http, base, t1, raise_it).status_code for _ in range(3)]
        lowered = [chat(http, base, t2, lower_it).status_code for _ in range(2)]
        bad = chat(http, base, task(), {"baggage": "ragtoll.budget.max_steps=lots"})
    assert forged == [200, 200, 402]
    assert lowered == [200, 402]
    assert bad.status_code == 200  # malformed budget baggage falls back to policy, never an error
    notes = [s.attributes.get(sc.BUDGET_NOTES) for s in call_spans(telemetry, "chat")]
    assert any(n and any("can only lower" in x for x in n) for n in notes)
    assert any(n and any("not a non-negative number" in x for x in n) for n in notes)


def test_profile_from_baggage_rule_and_default(proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry) -> None:
    cfg = {"default_profile": "p",
           "profiles": {"p": {"max_steps": 5}, "gold": {"max_steps": 50}, "tight": {"max_steps": 2},
                        "closed": {"allow_selection": False}},
           "rules": [{"profile": "gold", "header": "x-tier", "equals": "gold"}]}
    with proxy(upstreams=upstreams(upstream.url), budgets=cfg) as base, httpx.Client() as http:
        by_baggage = chat(http, base, task(), {"baggage": "ragtoll.budget.profile=tight"})
        by_rule = chat(http, base, task(), {"x-tier": "gold"})
        refused = chat(http, base, task(), {"baggage": "ragtoll.budget.profile=closed"})
    assert remaining(by_baggage)["max_steps"] == 1 and remaining(by_rule)["max_steps"] == 49
    assert remaining(refused)["max_steps"] == 4
    sources = [(s.attributes[sc.PROFILE], s.attributes[sc.PROFILE_SOURCE]) for s in call_spans(telemetry, "chat")]
    assert sources == [("tight", "baggage"), ("gold", "rule"), ("p", "default")]


def test_unique_queries_and_stalled_retrievals(proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry) -> None:
    t, s = task(), task()
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_unique_queries=2, max_stalled_retrievals=1),
               cache={"enabled": False}) as base, httpx.Client() as http:
        uq = [search(http, base, t, q).status_code for q in ("refund policy", "Refund  Policy", "plans", "pricing")]
        stall = [search(http, base, s, "refund policy").status_code for _ in range(3)]
    assert uq == [200, 200, 200, 429]  # a repeated intent (case and spaces differ) is not new
    assert stall == [200, 200, 429]  # the second returned nothing new: one stalled retrieval is the limit
    spans = call_spans(telemetry, "retrieval")
    assert [sp.attributes.get(sc.QUERY_NEW) for sp in spans[:4]] == [True, False, True, False]
    assert spans[-1].attributes[sc.BUDGET_EXCEEDED_DIMENSION] == "max_stalled_retrievals"


def test_stream_is_cut_cleanly_when_completion_tokens_run_out(proxy: ProxyFactory, upstream: Upstream,
                                                              telemetry: Telemetry,
                                                              request: pytest.FixtureRequest) -> None:
    t = task()
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_completion_tokens=2)) as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0,
                               default_headers={"x-ragtoll-task-id": t, "x-test-delay": "0.05"})
        request.addfinalizer(client.close)
        stream = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}],
                                                stream=True)
        chunks = list(stream)
        with httpx.Client() as http:
            after = chat(http, base, t)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert after.status_code == 402 and after.json()["error"]["dimension"] == "max_completion_tokens"
    span = call_spans(telemetry, "chat")[0]
    assert span.attributes[sc.BUDGET_STREAM_CUT] == "max_completion_tokens"
    assert any(e.name == sc.EVENT_EXCEEDED and e.attributes["stream_cut"] for e in span.events)


def test_stream_cut_ends_with_done_on_the_wire(proxy: ProxyFactory, upstream: Upstream) -> None:
    body = {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": "q"}]}
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_completion_tokens=1)) as base, \
            httpx.Client() as http:
        raw = http.post(f"{base}/openai{CHAT}", json=body,
                        headers={"x-ragtoll-task-id": task(), "x-test-delay": "0.05"}).content
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert orjson.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert all(e.startswith(b"data: ") for e in events)


@pytest.mark.slow
def test_deadline_rejects_late_calls_and_clamps_the_upstream_timeout(proxy: ProxyFactory, upstream: Upstream) -> None:
    t, slow = task(), task()
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_latency_ms=400)) as base, \
            httpx.Client(timeout=30) as http:
        first = chat(http, base, t)
        time.sleep(0.45)
        late = chat(http, base, t)
        clamped = chat(http, base, slow, {"x-test-delay": "5"})
    assert first.status_code == 200
    assert late.status_code == 402 and late.json()["error"]["dimension"] == "max_latency_ms"
    # the 120 s read timeout was clamped to the 0.4 s left: its expiry is the budget's refusal, not a 504
    assert clamped.status_code == 402 and clamped.json()["error"]["dimension"] == "max_latency_ms"


def test_cache_hit_is_charged_as_a_call_and_served(proxy: ProxyFactory, upstream: Upstream,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from ragtoll.proxy import app as app_module
    from ragtoll.proxy.request.exchange import CacheOutcome, Exchange, Reply, Stage

    class CacheHitStage(Stage):  # proposes a local answer, as the cache stage does, for queries saying "cached"
        async def on_request(self, ex: Exchange) -> None:
            if b"cached" in (ex.body or b""):
                ex.proposal = Reply(200, b'{"results": [{"id": "cached"}]}')
                ex.cache = CacheOutcome("hit", "exact", 1.0)

    original = app_module.build_stages
    monkeypatch.setattr(app_module, "build_stages", lambda *a, **k: [CacheHitStage(), *original(*a, **k)])
    t = task()
    cfg = budgets(max_retrieval_calls=1, max_unique_queries=1, max_calls=3)
    with proxy(upstreams=upstreams(upstream.url), budgets=cfg) as base, httpx.Client() as http:
        live = search(http, base, t, "live one")
        hits = [search(http, base, t, f"cached {i}") for i in range(3)]
        ledger = http.get(f"{base}/admin/tasks/{t}", headers=_auth(monkeypatch))
    assert live.status_code == 200 and upstream.app.state.calls["/search"] == 1
    assert [h.status_code for h in hits] == [200, 200, 429]  # hits pass retrieval limits, not max_calls
    assert hits[0].json() == {"results": [{"id": "cached"}]}
    assert hits[2].json()["error"]["dimension"] == "max_calls"
    used = ledger.json()["used"]
    assert (used["calls"], used["cache_hits"], used["retrieval_calls"], used["unique_queries"]) == (3, 2, 1, 1)


# --- admin API and task records ----------------------------------------------------------------------

TOKEN = "admin-secret-for-tests"


def _auth(monkeypatch: pytest.MonkeyPatch | None = None) -> dict[str, str]:
    if monkeypatch is not None:
        monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", TOKEN)
    return {"authorization": f"Bearer {TOKEN}"}


def _admin_end(http: httpx.Client, base: str, t: str, body: Any = None) -> dict[str, Any]:
    r = http.post(f"{base}/admin/tasks/{t}/end", headers=_auth(), json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", TOKEN)


def test_admin_needs_the_bearer_token(proxy: ProxyFactory, upstream: Upstream, monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Any) -> None:
    t = task()
    with proxy(upstreams=upstreams(upstream.url)) as base, httpx.Client() as http:
        chat(http, base, t)
        missing = http.get(f"{base}/admin/tasks/{t}")
        wrong = http.get(f"{base}/admin/tasks/{t}", headers={"authorization": "Bearer nope"})
        spec = http.get(f"{base}/admin/openapi.json")
    assert missing.status_code == wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "unauthorized"
    assert spec.status_code == 200 and "/admin/tasks/{task_id}/end" in spec.json()["paths"]
    monkeypatch.delenv("RAGTOLL_ADMIN_TOKEN")
    with proxy(upstreams=upstreams(upstream.url)) as base, httpx.Client() as http:
        off = http.get(f"{base}/admin/tasks/{t}", headers=_auth())
    assert off.status_code == 401 and off.json()["error"]["code"] == "admin_disabled"
    token_file = tmp_path / "token"
    token_file.write_text("from-a-file\n")
    with proxy(upstreams=upstreams(upstream.url), admin={"token_file": str(token_file)}) as base, \
            httpx.Client() as http:
        chat(http, base, t)
        ok = http.get(f"{base}/admin/tasks/{t}", headers={"authorization": "Bearer from-a-file"})
    assert ok.status_code == 200


def test_admin_ledger_and_end_with_outcome_writes_one_record(proxy: ProxyFactory, upstream: Upstream,
                                                             tmp_path: Any) -> None:
    t = task()
    records = tmp_path / "tasks.jsonl"
    cfg = {**budgets(max_steps=2, max_cost_usd=0.05), "records_file": str(records)}
    with proxy(upstreams=upstreams(upstream.url), budgets=cfg, pricing=PRICING) as base, httpx.Client() as http:
        chat(http, base, t, max_tokens=10)
        search(http, base, t, "refund policy")
        chat(http, base, t, max_tokens=10)
        chat(http, base, t, max_tokens=10)  # refused
        ledger = http.get(f"{base}/admin/tasks/{t}", headers=_auth()).json()
        bad = http.post(f"{base}/admin/tasks/{t}/end", headers=_auth(), content=b'{"correct": "yes"}')
        record = _admin_end(http, base, t, {"correct": True})
        again = http.post(f"{base}/admin/tasks/{t}/end", headers=_auth())
        gone = http.get(f"{base}/admin/tasks/{t}", headers=_auth())
    assert ledger["used"]["steps"] == 2 and ledger["used"]["calls"] == 3 and ledger["rejections"] == {"max_steps": 1}
    assert ledger["limits"] == {"max_steps": 2, "max_cost_usd": 0.05} and ledger["remaining"]["max_steps"] == 0
    assert bad.status_code == 400
    assert (again.status_code, gone.status_code) == (404, 404)
    expected_keys = {"task_id", "profile", "class", "route", "started_at", "ended_at", "duration_ms", "calls",
                     "steps", "retrieval_calls", "unique_queries", "rerank_calls", "context_tokens",
                     "completion_tokens", "cost_usd", "cache_hits", "rejections", "exhausted", "outcome",
                     "end_reason"}
    assert expected_keys <= set(record)
    schemas = OPENAPI["components"]["schemas"]
    assert set(schemas["TaskRecord"]["required"]) == expected_keys  # the published schema is the contract
    assert set(ledger) == set(schemas["Ledger"]["properties"])
    assert (record["task_id"], record["profile"], record["steps"], record["calls"], record["retrieval_calls"],
            record["unique_queries"]) == (t, "p", 2, 3, 1, 1)
    assert record["completion_tokens"] == 6  # settled to the upstream's usage (3 per call), not the reservation
    assert record["context_tokens"] == 24 and 0 < record["cost_usd"] < 0.01
    assert record["rejections"] == {"max_steps": 1} and record["exhausted"] == "max_steps"
    assert record["outcome"] == {"correct": True} and record["end_reason"] == "explicit"
    assert record["route"] == "openai" and record["class"] is None  # the first call's route; no classifier
    assert record["task_source"] == "header" and record["trace_id"] == f"{derived_trace_id(t):032x}"
    lines = records.read_bytes().splitlines()
    assert [orjson.loads(x) for x in lines] == [record]


@pytest.mark.slow
def test_idle_tasks_end_by_themselves(proxy: ProxyFactory, upstream: Upstream, tmp_path: Any) -> None:
    records = tmp_path / "idle.jsonl"
    t = task()
    with proxy(upstreams=upstreams(upstream.url), tasks={"idle_timeout_s": 0.3},
               budgets={**budgets(max_steps=5), "records_file": str(records)}) as base, httpx.Client() as http:
        chat(http, base, t)
        deadline = time.monotonic() + 10
        while not records.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        gone = http.get(f"{base}/admin/tasks/{t}", headers=_auth())
    record = orjson.loads(records.read_bytes().splitlines()[0])
    assert (record["task_id"], record["end_reason"], record["steps"], record["outcome"]) == (t, "idle", 1, None)
    assert gone.status_code == 404


def test_readyz_pings_the_store(proxy: ProxyFactory, upstream: Upstream) -> None:
    with proxy(upstreams=upstreams(upstream.url)) as base, httpx.Client() as http:
        r = http.get(f"{base}/readyz")
    assert r.status_code == 200 and r.json()["store"] == "memory"


def test_classifier_picks_the_profile_from_the_tasks_first_query(proxy: ProxyFactory, upstream: Upstream,
                                                                 telemetry: Telemetry) -> None:
    cfg = {"default_profile": "p", "classes": {"simple_fact": "tight", "investigative": "wide"},
           "profiles": {"p": {"max_steps": 5}, "tight": {"max_steps": 2}, "wide": {"max_steps": 12}}}
    simple, deep = task(), task()

    def ask(http: httpx.Client, base: str, t: str, text: str) -> httpx.Response:
        return chat(http, base, t, messages=[{"role": "user", "content": text}])

    with proxy(upstreams=upstreams(upstream.url), budgets=cfg) as base, httpx.Client() as http:
        first = ask(http, base, simple, "What is the capital of France?")
        later = ask(http, base, simple, "Why did revenue drop in Q3 across all regions?")
        other = ask(http, base, deep, "Why did revenue drop in Q3 across all regions?")
    assert remaining(first)["max_steps"] == 1 and remaining(later)["max_steps"] == 0  # the profile sticks
    assert remaining(other)["max_steps"] == 11
    spans = call_spans(telemetry, "chat")
    assert (spans[0].attributes[sc.QUERY_CLASS], spans[0].attributes[sc.PROFILE_SOURCE]) == ("simple_fact", "classifier")
    assert spans[0].attributes[sc.QUERY_CLASS_REASON]
    assert spans[2].attributes[sc.QUERY_CLASS] == "investigative" and spans[2].attributes[sc.PROFILE] == "wide"


HMAC_KEY = b"operator-hmac-key-0123456789abcdef"


def test_signed_baggage_raises_a_limit_until_it_expires(proxy: ProxyFactory, upstream: Upstream,
                                                        telemetry: Telemetry, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragtoll.proxy.core.signing import sign_budget

    monkeypatch.setenv("RAGTOLL_BUDGET_HMAC_KEY", HMAC_KEY.decode())
    signed, expired, tampered, wrong_task = task(), task(), task(), task()
    good = sign_budget(signed, {"max_steps": 4}, HMAC_KEY, time.time() + 300)
    old = sign_budget(expired, {"max_steps": 4}, HMAC_KEY, time.time() - 1)
    forged = sign_budget(tampered, {"max_steps": 4}, HMAC_KEY, time.time() + 300).replace("max_steps=4", "max_steps=9")
    other = sign_budget("someone-else", {"max_steps": 4}, HMAC_KEY, time.time() + 300)
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_steps=2)) as base, httpx.Client() as http:
        def run(t: str, baggage: str) -> list[int]:
            return [chat(http, base, t, {"baggage": baggage}).status_code for _ in range(5)]

        assert run(signed, good) == [200, 200, 200, 200, 402]
        assert run(expired, old) == [200, 200, 402, 402, 402]
        assert run(tampered, forged) == [200, 200, 402, 402, 402]
        assert run(wrong_task, other) == [200, 200, 402, 402, 402]
    notes = [n for s in call_spans(telemetry, "chat") for n in (s.attributes.get(sc.BUDGET_NOTES) or ())]
    assert any("expired" in n for n in notes) and any("bad signature" in n for n in notes)


def test_signed_raise_without_a_key_is_ignored(proxy: ProxyFactory, upstream: Upstream,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from ragtoll.proxy.core.signing import sign_budget

    monkeypatch.delenv("RAGTOLL_BUDGET_HMAC_KEY", raising=False)
    t = task()
    baggage = sign_budget(t, {"max_steps": 4}, HMAC_KEY, time.time() + 300)
    with proxy(upstreams=upstreams(upstream.url), budgets=budgets(max_steps=1)) as base, httpx.Client() as http:
        codes = [chat(http, base, t, {"baggage": baggage}).status_code for _ in range(2)]
    assert codes == [200, 402]


def sse(name: str, doc: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + orjson.dumps(doc) + b"\n\n"


class SseUpstream:
    """Streams fixed SSE events 50 ms apart to any request (the shared fake streams chat only)."""

    def __init__(self, events: list[bytes]) -> None:
        self.events = events

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        await read_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for e in self.events:
            await send({"type": "http.response.body", "body": e, "more_body": True})
            await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b""})


WORDS = ("Hel", "lo", " the", "re", ".")


def anthropic_events() -> list[bytes]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test-model", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
    return [
        sse("message_start", {"type": "message_start", "message": message}),
        sse("content_block_start", {"type": "content_block_start", "index": 0,
                                    "content_block": {"type": "text", "text": ""}}),
        *[sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                      "delta": {"type": "text_delta", "text": w}}) for w in WORDS],
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                              "usage": {"output_tokens": 5}}),
        sse("message_stop", {"type": "message_stop"}),
    ]


def responses_events() -> list[bytes]:
    resp = {"id": "resp_1", "object": "response", "created_at": 1700000000, "model": "gpt-4o-mini",
            "status": "in_progress", "output": [], "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    events = [
        sse("response.created", {"type": "response.created", "sequence_number": 0, "response": resp}),
        sse("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 1,
                                           "output_index": 0, "item": item}),
        sse("response.content_part.added", {"type": "response.content_part.added", "sequence_number": 2,
                                            **where, "part": part}),
    ]
    events += [sse("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 3 + i,
                                                  **where, "delta": w, "logprobs": []}) for i, w in enumerate(WORDS)]
    done = {**resp, "status": "completed"}
    events.append(sse("response.completed", {"type": "response.completed", "sequence_number": 9, "response": done}))
    return events


@pytest.mark.slow
def test_anthropic_stream_is_cut_with_max_tokens(proxy: ProxyFactory, telemetry: Telemetry,
                                                 request: pytest.FixtureRequest) -> None:
    from support.servers import serve_in_thread

    with serve_in_thread(SseUpstream(anthropic_events())) as fake:
        ups = [{"name": "claude", "kind": "llm", "api": "anthropic", "url": fake, "prefix": "/anthropic"}]
        with proxy(upstreams=ups, budgets=budgets(max_completion_tokens=2)) as base:
            client = anthropic.Anthropic(base_url=f"{base}/anthropic", api_key="k", max_retries=0,
                                         default_headers={"x-ragtoll-task-id": task()})
            request.addfinalizer(client.close)
            with client.messages.stream(model="claude-test-model", max_tokens=100,
                                        messages=[{"role": "user", "content": "hi"}]) as stream:
                final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    assert "".join(b.text for b in final.content if b.type == "text") == "Hello"
    assert call_spans(telemetry, "chat")[0].attributes[sc.BUDGET_STREAM_CUT] == "max_completion_tokens"


@pytest.mark.slow
def test_responses_stream_is_cut_as_incomplete(proxy: ProxyFactory, telemetry: Telemetry,
                                               request: pytest.FixtureRequest) -> None:
    from support.servers import serve_in_thread

    with serve_in_thread(SseUpstream(responses_events())) as fake:
        ups = [{"name": "openai", "kind": "llm", "api": "openai", "url": fake, "prefix": "/openai"}]
        with proxy(upstreams=ups, budgets=budgets(max_completion_tokens=2)) as base:
            client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="k", max_retries=0,
                                   default_headers={"x-ragtoll-task-id": task()})
            request.addfinalizer(client.close)
            with client.responses.stream(model="gpt-4o-mini", input="hi") as stream:
                events = list(stream)
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert text == "Hello" and last.type == "response.incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.output[0].content[0].text == "Hello"  # what did stream is kept
    assert call_spans(telemetry, "chat")[0].attributes[sc.BUDGET_STREAM_CUT] == "max_completion_tokens"


def test_an_unwritable_record_sink_still_ends_the_task(proxy: ProxyFactory, upstream: Upstream, tmp_path: Any,
                                                       telemetry: Telemetry) -> None:
    """The task ends, the admin answer says its record was not written, and the lost record is
    counted (`ragtoll_task_records_lost_total`)."""
    t = task()
    cfg = {**budgets(max_steps=5), "records_file": str(tmp_path / "missing-dir" / "tasks.jsonl")}
    with proxy(upstreams=upstreams(upstream.url), budgets=cfg) as base, httpx.Client() as http:
        chat(http, base, t)
        r = http.post(f"{base}/admin/tasks/{t}/end", headers=_auth())
        gone = http.get(f"{base}/admin/tasks/{t}", headers=_auth())
    assert r.status_code == 200 and r.json()["record_written"] is False and r.json()["steps"] == 1
    assert gone.status_code == 404
    data = telemetry.reader.get_metrics_data()
    lost = [p.value for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == sc.METRIC_TASK_RECORDS_LOST for p in m.data.data_points]
    assert lost == [1]


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_retrieval_answers_carry_evidence_strength_with_novelty_for_the_task(
        proxy: Any, upstream: Any, store: str, request: pytest.FixtureRequest) -> None:
    import http_sfv

    t = task()
    url = "memory" if store == "memory" else request.getfixturevalue("redis_url")
    # the cache is off so the repeat goes upstream (a hit is no retrieval and carries no novelty)
    with proxy(upstreams=[{"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url,
                           "prefix": "/docs"}], cache={"enabled": False}, store=url) as base:
        def search(query: str) -> http_sfv.Dictionary:
            r = httpx.post(f"{base}/docs/search", json={"query": query, "top_k": 3},
                           headers={"x-ragtoll-task-id": t})
            assert r.status_code == 200 and len(r.json()["results"]) == 3
            d = http_sfv.Dictionary()
            d.parse(r.headers["x-ragtoll-evidence"].encode())
            return d

        first = search("refund window for annual plans")
        again = search("refund window for annual plans")  # same chunks: nothing new to this task
    assert first["n"].value == 3 and first["new"].value == 3
    assert float(first["top"].value) == 0.9 and float(first["margin"].value) == 0.2
    assert again["new"].value == 0


def test_classifier_reads_the_users_question_not_the_tool_definitions(proxy: Any, telemetry: Any) -> None:
    tools = [{"type": "function", "function": {"name": "retrieve", "description": "search the docs",
                                               "parameters": {"type": "object", "properties": {}}}}]
    question = "Compare the refund policies of the annual and monthly plans and explain why they differ"
    with proxy(budgets={"classes": {"simple_fact": "tight", "investigative": "wide", "multi_hop": "wide",
                                    "procedural": "tight"}, "default_profile": "tight",
                        "profiles": {"tight": {"max_steps": 2}, "wide": {"max_steps": 20}}}) as base:
        r = httpx.post(f"{base}/openai/v1/chat/completions", headers={"x-ragtoll-task-id": "cls-tools"},
                       json={"model": "gpt-4o-mini", "tools": tools,
                             "messages": [{"role": "system", "content": "You answer from the docs."},
                                          {"role": "user", "content": question}]})
    assert r.status_code == 200
    call = next(s for s in telemetry.spans() if s.name == "chat gpt-4o-mini")
    assert call.attributes["ragtoll.query.class"] != "simple_fact"
    assert call.attributes["ragtoll.budget.profile"] == "wide"


def test_baggage_outcome_records_a_verdict_for_the_report_only_when_signed(
        proxy: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragtoll.proxy.core.signing import sign_outcome

    monkeypatch.setenv("RAGTOLL_BUDGET_HMAC_KEY", HMAC_KEY.decode())
    records = tmp_path / "verdicts.jsonl"
    with proxy(budgets={"records_file": str(records)}) as base:
        for outcome in ("ragtoll.outcome=maybe", "ragtoll.outcome=incorrect",
                        sign_outcome("verdict-1", True, HMAC_KEY), sign_outcome("verdict-2", False, HMAC_KEY)):
            r = httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []},
                           headers={"baggage": f"ragtoll.task.id=verdict-1,{outcome}"})
            assert r.status_code == 200
    lines = [orjson.loads(line) for line in records.read_text().splitlines()]
    verdicts = [e for e in lines if e.get("kind") == "outcome"]
    assert [(e["task_id"], e["outcome"]) for e in verdicts] == [("verdict-1", {"correct": True})]


def test_llm_spans_count_evidence_and_duplicate_evidence_tokens(proxy: Any, upstream: Any, telemetry: Any) -> None:
    with proxy(upstreams=[{"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url,
                           "prefix": "/docs"},
                          {"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url,
                           "prefix": "/openai"}]) as base:
        h = {"x-ragtoll-task-id": "landfill-1"}
        chunks = httpx.post(f"{base}/docs/search", json={"query": "annual refunds", "top_k": 2}, headers=h).json()
        evidence = "\n".join(c["text"] for c in chunks["results"])
        history = [{"role": "user", "content": "What is the refund window?"},
                   {"role": "tool", "content": evidence, "tool_call_id": "c1"}]
        for _ in range(2):  # the second step resends the same evidence: all of it is landfill
            httpx.post(f"{base}/openai/v1/chat/completions", headers=h,
                       json={"model": "gpt-4o-mini", "messages": history})
    first, second = sorted(telemetry.by_name("chat gpt-4o-mini"), key=lambda s: s.start_time)
    assert first.attributes["ragtoll.evidence.prompt_tokens"] > 0
    assert first.attributes["ragtoll.evidence.duplicate_tokens"] == 0
    assert second.attributes["ragtoll.evidence.duplicate_tokens"] == first.attributes["ragtoll.evidence.prompt_tokens"]


def test_an_ended_task_leaves_no_landfill_behind(proxy: Any, upstream: Any, telemetry: Any) -> None:
    """Evidence fingerprints are dropped when the task ends: the id's next task starts clean."""
    with proxy(upstreams=[{"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url,
                           "prefix": "/docs"},
                          {"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url,
                           "prefix": "/openai"}]) as base, httpx.Client() as http:
        h = {"x-ragtoll-task-id": "landfill-ended"}
        chunks = http.post(f"{base}/docs/search", json={"query": "annual refunds", "top_k": 2}, headers=h).json()
        history = [{"role": "tool", "content": "\n".join(c["text"] for c in chunks["results"]), "tool_call_id": "c1"}]
        _admin_end(http, base, "landfill-ended")
        http.post(f"{base}/openai/v1/chat/completions", headers=h, json={"model": "gpt-4o-mini", "messages": history})
    (chat_span,) = telemetry.by_name("chat gpt-4o-mini")
    assert chat_span.attributes["ragtoll.task.id"] == "landfill-ended"
    assert "ragtoll.evidence.prompt_tokens" not in chat_span.attributes  # the ended task's evidence is gone
