"""Rerank adapters `cohere` (v1, v2; Jina / vLLM shape) and `tei`, against documented examples."""

from __future__ import annotations

import orjson
import pytest
from support.adapter_fixtures import adapter, load, observe, parse


def test_cohere_v2_request_and_ranked_results() -> None:
    fx = load("cohere_rerank_v2.json")
    ad = adapter("cohere", "rerank")
    call = parse(ad, fx["path"], fx["request"])
    assert (call.operation, call.model, call.documents, call.top_k) == ("rerank", "rerank-v3.5", 5, 3)
    assert call.query == "What is the capital of the United States?"
    obs = observe(ad, call, orjson.dumps(fx["response"]))
    assert [c.id for c in obs.chunks or []] == ["2", "4", "0"]
    assert [c.score for c in obs.chunks or []] == [0.999071, 0.7867867, 0.32713068]
    assert (obs.chunks or [])[0].text.startswith("Washington, D.C.")  # text from the request's candidates


def test_cohere_v1_with_structured_documents_and_returned_text() -> None:
    fx = load("cohere_rerank_v1.json")
    ad = adapter("cohere", "rerank")
    call = parse(ad, fx["path"], fx["request"])
    assert call.documents == 2 and call.top_k == 2
    obs = observe(ad, call, orjson.dumps(fx["response"]))
    assert [(c.id, c.text[:10]) for c in obs.chunks or []] == [("1", "Washington"), ("0", "Carson Cit")]


def test_tei_rerank_top_level_list() -> None:
    fx = load("tei_rerank.json")
    ad = adapter("tei", "rerank")
    call = parse(ad, fx["path"], fx["request"])
    assert (call.query, call.documents, call.top_k) == ("What is Deep Learning?", 2, None)
    obs = observe(ad, call, orjson.dumps(fx["response"]))
    assert [(c.id, c.score, c.text) for c in obs.chunks or []] == [
        ("1", 0.9976404, "Deep learning is..."), ("0", 0.12527926, "Deep Learning is not...")]


@pytest.mark.parametrize("api", ["cohere", "tei"])
def test_malformed_rerank_bodies(api: str) -> None:
    ad = adapter(api, "rerank")
    call = parse(ad, "/rerank", b'{"query": 3, "documents": "x", "texts": 4}')
    assert call.operation == "rerank" and call.query is None and call.documents == 0
    assert observe(ad, call, b'{"results": "none"}').parse_error is not None
    assert parse(ad, "/health", b"", method="GET").operation == "other"
