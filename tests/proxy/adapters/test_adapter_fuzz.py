"""No adapter raises on any body: arbitrary bytes and arbitrary JSON, in requests and responses."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragtoll.proxy.adapters import ADAPTERS
from support.adapter_fixtures import adapter

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/messages",
         "/v2/rerank", "/rerank", "/search", "/collections/c/points/query", "/api/v1/collections/c/query",
         "/i/_search", "/r/invoke"]
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["model", "messages", "content", "input", "query", "documents", "texts", "results", "choices",
                         "usage", "filter", "top_k", "limit", "vector", "hits", "output", "ids", "stream", "n",
                         "max_tokens", "tools", "system", "type", "delta", "text", "index", "score", "result",
                         "knn", "query_embeddings", "where", "max_output_tokens", "prompt", "function"]),
        inner, max_size=5),
    max_leaves=25)


@pytest.mark.parametrize("api", sorted(ADAPTERS))
@settings(max_examples=40, deadline=None)
@given(request=st.one_of(st.binary(max_size=200), JSON.map(orjson.dumps)),
       response=st.one_of(st.binary(max_size=200), JSON.map(orjson.dumps)), path=st.sampled_from(PATHS),
       sse=st.booleans())
def test_adapters_never_raise(api: str, request: bytes, response: bytes, path: str, sse: bool) -> None:
    ad = adapter(api, "retrieval")
    call = ad.parse_request("POST", path, {"content-type": "application/json"}, request)
    obs = ad.observer(call, 200, {"content-type": "text/event-stream" if sse else "application/json"})
    body = b"data: " + response + b"\n\n" if sse else response
    obs.feed(body[: len(body) // 2], False)
    obs.feed(body[len(body) // 2:], False)
    obs.feed(b"", True)
    assert obs.observation.output_tokens_seen >= 0
