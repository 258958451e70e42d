"""Two ragtoll replicas on one Redis serve the calls of one task: the record's cache reads and
LLM input come from the task's ledger, so they cover both replicas' calls, where the `context`
object (process-local) covers only the replica that ended the task."""

from __future__ import annotations

import uuid

import httpx
import pytest
from conftest import ProxyFactory, Upstream
from ragtoll.proxy.tools import report

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is our refund policy?"}]}


@pytest.mark.slow
def test_a_record_counts_cache_reads_of_every_replica(proxy: ProxyFactory, upstream: Upstream, redis_url: str,
                                                      admin_token: str) -> None:
    task = f"replicas-{uuid.uuid4().hex}"
    cfg = {"store": redis_url, "budgets": {"records_stream": f"ragtoll:records:{task}"},
           "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"}]}
    with proxy(**cfg) as one, proxy(**cfg) as two, httpx.Client(timeout=10) as http:
        for base, cached in ((one, 8), (two, 4)):  # each answer's usage: 12 prompt tokens, `cached` from the cache
            r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT,
                          headers={"x-ragtoll-task-id": task, "x-test-cached": str(cached)})
            assert r.status_code == 200, r.text
        end = http.post(f"{two}/admin/tasks/{task}/end", json={"correct": True},
                        headers={"authorization": f"Bearer {admin_token}"})
    assert end.status_code == 200, end.text
    record = end.json()
    assert (record["context_tokens"], record["cached_input_tokens"], record["cache_write_tokens"]) == (24, 12, 0)
    assert record["context"]["input_tokens"] == 12  # the ending replica's own calls only
    assert report.overall([report.parse_record(record, "end")]).cached_input_share == pytest.approx(0.5)
