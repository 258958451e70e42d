"""Two ragtoll replicas on one Redis serve the calls of one task: the record's cache reads, LLM
input, `context` object and evidence token counts come from the task's ledger (each call's counts
settle with it), so they cover both replicas' calls, whichever replica ends the task. What stays
per replica is how a call's evidence is found: against the chunks that replica saw retrieved, and
resent only when that replica sent it before."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.tools import report

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is our refund policy?"}]}
QUERY = "refund policy for annual plans in the enterprise tier"
EVIDENCE = f"chunk 0 about {QUERY}"  # the fake search's first result for QUERY
CHUNK = "Refunds on annual plans are allowed within 30 days of purchase. " * 6
OTHER = "Monthly plans renew automatically on the first day of each month. " * 6


def _config(task: str, redis_url: str, upstream: Upstream) -> dict[str, Any]:
    return {"store": redis_url, "budgets": {"records_stream": f"ragtoll:records:{task}"},
            "context": {"prompt_cache_key": "task", "depth_gap": 0, "depth_floor": 0.85},
            "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"},
                          {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url,
                           "prefix": "/docs"}]}


def _end(http: httpx.Client, base: str, task: str, token: str) -> dict[str, Any]:
    r = http.post(f"{base}/admin/tasks/{task}/end", json={"correct": True},
                  headers={"authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def _tool(call_id: str, *chunks: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "retrieve", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id,
             "content": orjson.dumps({"chunks": [{"id": i, "text": t} for i, t in chunks]}).decode()}]


@pytest.mark.slow
def test_a_record_counts_cache_reads_of_every_replica(proxy: ProxyFactory, upstream: Upstream, redis_url: str,
                                                      admin_token: str) -> None:
    task = f"replicas-{uuid.uuid4().hex}"
    cfg = _config(task, redis_url, upstream)
    with proxy(**cfg) as one, proxy(**cfg) as two, httpx.Client(timeout=10) as http:
        for base, cached in ((one, 8), (two, 4)):  # each answer's usage: 12 prompt tokens, `cached` from the cache
            r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT,
                          headers={"x-ragtoll-task-id": task, "x-test-cached": str(cached)})
            assert r.status_code == 200, r.text
        record = _end(http, two, task, admin_token)
    assert (record["context_tokens"], record["cached_input_tokens"], record["cache_write_tokens"]) == (24, 12, 0)
    assert record["context"]["input_tokens"] == 24 and record["context"]["cached_input_share"] == 0.5
    assert report.overall([report.parse_record(record, "end")]).cached_input_share == pytest.approx(0.5)


@pytest.mark.slow
def test_the_context_and_evidence_numbers_are_whole_and_resending_is_found_per_replica(
        proxy: ProxyFactory, upstream: Upstream, redis_url: str, admin_token: str) -> None:
    """Replica one trims a search (3 of 5 results) and sends its first chunk in a prompt twice;
    replica two sends it too, with a tool result that repeats a chunk (evidence once), and ends the
    task. The record sums both replicas' calls; replica two never saw the chunk retrieved, so its
    copy is counted neither as evidence nor as resent (evidence tokens = 2 x resent, not 3 x)."""
    task = f"replicas-{uuid.uuid4().hex}"
    cfg = _config(task, redis_url, upstream)
    head = [{"role": "system", "content": "You answer from the documents."},
            {"role": "user", "content": f"Context:\n{EVIDENCE}\nCan I get a refund on an annual plan?"}]
    with proxy(**cfg) as one, proxy(**cfg) as two, httpx.Client(timeout=10) as http:
        tid = {"x-ragtoll-task-id": task}
        r = http.post(f"{one}/docs/search", json={"query": QUERY, "top_k": 5}, headers=tid)
        assert r.status_code == 200 and r.headers["x-ragtoll-depth"] == "kept=2, returned=5, reason=floor"
        calls = [(one, head), (two, head + _tool("a", ("c1", CHUNK)) + _tool("b", ("c1", CHUNK), ("c2", OTHER))),
                 (one, head)]
        for base, messages in calls:
            r = http.post(f"{base}/openai/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": messages},
                          headers=tid)
            assert r.status_code == 200, r.text
        record = _end(http, two, task, admin_token)
    ctx, ev = record["context"], record["evidence"]
    assert (ctx["llm_calls"], ctx["input_tokens"], ctx["cache_keys_set"], ctx["results_trimmed"],
            ctx["chunks_referenced"], ctx["searches_widened"]) == (3, 36, 3, 3, 1, 0)
    assert ctx["evidence_chars_saved"] > len(CHUNK) // 2
    assert ev["resent_tokens"] > 0 and ev["prompt_tokens"] == 2 * ev["resent_tokens"]
    row = report.overall([report.parse_record(record, "end")])
    assert (row.evidence_chars_saved, row.evidence_tokens_resent) == (ctx["evidence_chars_saved"], ev["resent_tokens"])


def test_a_refused_call_rewrites_nothing_in_the_ledger_and_the_ledger_wins(proxy: ProxyFactory, telemetry: Telemetry,
                                                                            admin_token: str) -> None:
    """One replica, the memory store: the call the budget refuses got its cache key (the context
    stage runs before the budget) but never settles, so the record, built from the ledger, counts
    the one call that went upstream; this replica's own tally (two keys) is only a fallback."""
    task = f"refused-{uuid.uuid4().hex}"
    budgets = {"default_profile": "p", "profiles": {"p": {"max_steps": 1}}}
    with proxy(budgets=budgets, context={"prompt_cache_key": "task"}) as base, httpx.Client(timeout=10) as http:
        codes = [http.post(f"{base}/openai/v1/chat/completions", json=CHAT,
                           headers={"x-ragtoll-task-id": task}).status_code for _ in range(2)]
        record = _end(http, base, task, admin_token)
    assert codes[0] == 200 and codes[1] >= 400  # refused (the route's reject status)
    deadline = time.monotonic() + 5  # a call span ends as its response does: wait for both
    while len(keyed := [s for s in telemetry.spans() if (s.attributes or {}).get(sc.CONTEXT_CACHE_KEY)]) < 2 \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(keyed) == 2  # both calls got the key
    assert (record["context"]["cache_keys_set"], record["context"]["llm_calls"]) == (1, 1)
