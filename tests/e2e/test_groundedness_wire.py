"""Groundedness through the real proxy: a search through ragtoll, then answers from the real
openai SDK (read whole and streamed); the task record, the answer's span and the task metrics
say how much of the last answer the retrieved chunks back."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.tools.report import read_jsonl
from support.poll import wait_until

QUERY = "annual plan refunds within thirty days"
TASK = {"x-ragtoll-task-id": "grounded-1"}


def _ups(upstream: Upstream) -> list[dict[str, Any]]:
    return [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url, "prefix": "/docs"}]


def graded(telemetry: Telemetry) -> list[Any]:
    return [s for s in telemetry.spans() if sc.EVIDENCE_GROUNDEDNESS in (s.attributes or {})]


@pytest.mark.slow
def test_the_record_and_span_grade_the_tasks_last_answer(proxy: ProxyFactory, upstream: Upstream,
                                                          telemetry: Telemetry, admin_token: str,
                                                          tmp_path: Any) -> None:
    with proxy(upstreams=_ups(upstream)) as base, \
            openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0) as client:
        found = httpx.post(f"{base}/docs/search", json={"query": QUERY, "top_k": 2}, headers=TASK).json()
        first = found["results"][0]["id"]  # its text: "chunk 0 about annual plan refunds within thirty days"
        question = [{"role": "user", "content": "Can I get a refund on an annual plan?"}]
        # a grounded claim citing the chunk, and one the chunks do not back
        client.chat.completions.create(model="gpt-4o-mini", messages=question, extra_headers={
            **TASK, "x-test-answer": f"Annual plan refunds are possible within thirty days [{first}]. "
                                     "The moon orbits Jupiter every Tuesday."})
        wait_until(lambda: graded(telemetry), timeout=5, interval=0.01)  # the span ends after the answer
        spans = graded(telemetry)
        assert [s.attributes[sc.EVIDENCE_GROUNDEDNESS] for s in spans] == [0.5]
        assert spans[0].attributes[sc.EVIDENCE_CITATIONS_RETRIEVED] == 1
        # the last answer, streamed, cites a chunk the task never retrieved
        stream = client.chat.completions.create(model="gpt-4o-mini", messages=question, stream=True,
                                                extra_headers={**TASK, "x-test-words": "Annual plan refunds ,"
                                                               "are possible within thirty days [doc-404]."})
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        r = httpx.post(f"{base}/admin/tasks/grounded-1/end", json={"correct": False},
                       headers={"authorization": f"Bearer {admin_token}"})
        assert r.status_code == 200, r.text
    record = r.json()
    assert record["groundedness"] == 0.0
    assert record["evidence"]["claims"] == 1 and record["evidence"]["citations"] == 1
    assert record["evidence"]["citations_retrieved"] == 0 and record["evidence"]["chunks_indexed"] == 2
    written = [x for x in read_jsonl(str(tmp_path / "records.jsonl")) if x.get("task_id") == "grounded-1"]
    assert written[0]["groundedness"] == 0.0
    (task_span,) = telemetry.by_name(sc.TASK_SPAN)
    assert task_span.attributes[sc.TASK_GROUNDEDNESS] == 0.0
    metrics = {m.name: m.data.data_points for rm in telemetry.reader.get_metrics_data().resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics}
    (point,) = metrics[sc.METRIC_TASK_GROUNDEDNESS]
    assert (point.count, point.sum) == (1, 0.0)
    # the ledger's input (the streamed call reported no usage: ragtoll's own count) and cache reads
    assert sum(p.value for p in metrics[sc.METRIC_TASK_INPUT_TOKENS]) == record["context_tokens"] > 0
    assert sum(p.value for p in metrics[sc.METRIC_TASK_CACHED_INPUT_TOKENS]) == record["cached_input_tokens"] == 0
