"""Retrieval adapters: generic `json` (field paths) and the qdrant / chroma / elasticsearch /
langserve presets, against documented request and response shapes."""

from __future__ import annotations

import orjson
import pytest
from ragtoll.proxy.core import queries
from ragtoll.proxy.model import Chunk
from support.adapter_fixtures import adapter, load, observe, observe_every_split, parse


def _run(api: str, name: str) -> tuple:
    fx = load(name)
    ad = adapter(api, "retrieval", fx.get("fields"), name="docs")
    call = parse(ad, fx["path"], fx["request"])
    body = orjson.dumps(fx["response"])
    obs = observe(ad, call, body, headers=fx.get("response_headers"))
    return ad, call, obs, body


def test_json_adapter_reads_the_configured_paths() -> None:
    ad, call, obs, body = _run("json", "retrieval_json.json")
    assert (call.operation, call.query, call.top_k) == ("retrieval", "  How do I rotate API keys? ", 3)
    assert call.filters == {"lang": "en", "year": 2024}  # canonical: sorted keys, 2024.0 -> 2024
    assert call.query_key == queries.query_key("docs", "how do i rotate api keys", None, {"year": 2024, "lang": "en"})
    assert obs.source_version == "v7"
    assert obs.chunks == [
        Chunk("k-1", "Rotate keys from the console under Settings.", 0.91, "handbook", ("eng", "ops")),
        Chunk("k-2", "Keys expire after 90 days.", 0.85, "faq", ("public",)),
        Chunk("k-3", "Old keys keep working for one hour.", 0.4, None, None),
    ]
    # the body arrives in arbitrary pieces
    for o in observe_every_split(ad, call, body, "application/json")[::7]:
        assert o.chunks == obs.chunks


def test_json_adapter_query_key_ignores_top_k_but_not_filters_or_route() -> None:
    fx = load("retrieval_json.json")
    ad = adapter("json", "retrieval", fx["fields"], name="docs")
    base = parse(ad, "/search", fx["request"])
    assert parse(ad, "/search", {**fx["request"], "top_k": 50}).query_key == base.query_key
    assert parse(ad, "/search", {**fx["request"], "query": "how do I rotate api keys."}).query_key == base.query_key
    assert parse(ad, "/search", {**fx["request"], "filter": {"year": 2023}}).query_key != base.query_key
    other = adapter("json", "retrieval", fx["fields"], name="wiki")
    assert parse(other, "/search", fx["request"]).query_key != base.query_key


def test_json_version_from_a_body_field_and_top_level_list() -> None:
    ad = adapter("json", "retrieval", {"results": "", "version_field": "0.v"})
    call = parse(ad, "/q", {"query": "x"})
    obs = observe(ad, call, b'[{"id": 1, "text": "a", "score": 1, "v": 42}]')
    assert obs.source_version == "42" and obs.chunks == [Chunk("1", "a", 1.0)]


def test_qdrant_search_and_query() -> None:
    _, call, obs, _ = _run("qdrant", "qdrant_search.json")
    assert call.query_vector == [0.2, 0.1, 0.9, 0.7] and call.top_k == 3 and call.query is None
    assert call.filters == {"must": [{"key": "city", "match": {"value": "London"}}]}
    assert obs.chunks is not None and [c.id for c in obs.chunks] == ["10", "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"]
    assert obs.chunks[0] == Chunk("10", "London is the capital of England.", 0.81, "wiki", ("public",))
    _, qcall, qobs, _ = _run("qdrant", "qdrant_query.json")
    assert qcall.query_vector == call.query_vector and qcall.top_k == 10
    assert qcall.query_key == call.query_key  # same collection, vector and filter: one intent
    assert [c.id for c in qobs.chunks or []] == ["10"]
    ad = adapter("qdrant", "retrieval")
    text = parse(ad, "/collections/docs/points/query", {"query": {"text": "hello", "model": "bm25"}})
    assert text.query == "hello"
    assert parse(ad, "/collections/docs/points", {"points": []}, method="PUT").operation == "other"


def test_chroma_query() -> None:
    _, call, obs, _ = _run("chroma", "chroma_query.json")
    assert call.query_vector == [0.1, 0.2, 0.3] and call.top_k == 2
    assert call.filters == {"where": {"lang": "en"}}
    assert obs.chunks == [
        Chunk("id1", "This is a document about pineapple", 0.11, "fruit.md", ("public",)),
        Chunk("id2", "This is a document about oranges", 0.42, None, None),
    ]


def test_elasticsearch_search() -> None:
    _, call, obs, _ = _run("elasticsearch", "elasticsearch_search.json")
    assert call.query == "user login failed" and call.top_k == 2
    assert "$query" in orjson.dumps(call.filters).decode() and "auth" in orjson.dumps(call.filters).decode()
    assert obs.chunks == [
        Chunk("0", "user kimchy login failed", 1.3862942, "auth.log", ("sec",)),
        Chunk("1", "user bob login failed", 0.9, None, None),
    ]
    fx = load("elasticsearch_search.json")
    ad = adapter("elasticsearch", "retrieval", name="docs")
    changed = {**fx["request"], "query": {"bool": {"must": [{"match": {"message": {"query": "user login failed"}}}],
                                                   "filter": [{"term": {"service": "billing"}}]}}}
    assert parse(ad, fx["path"], changed).query_key != call.query_key
    knn = parse(ad, "/_search", {"knn": {"field": "v", "query_vector": [1, 2], "k": 5, "num_candidates": 50}})
    assert knn.query_vector == [1.0, 2.0] and knn.top_k == 5
    assert parse(ad, "/idx/_doc/1", {}, method="PUT").operation == "other"


def test_langserve_invoke() -> None:
    _, call, obs, _ = _run("langserve", "langserve_invoke.json")
    assert call.query == "what is langserve?"
    assert [c.id for c in obs.chunks or []] == ["d1", "d2"]
    assert (obs.chunks or [])[0].source == "langserve.md"
    ad = adapter("langserve", "retrieval")
    dict_input = parse(ad, "/retriever/invoke", {"input": {"question": "q?", "k": 3}})
    assert dict_input.query == "q?" and dict_input.filters == {"k": 3}
    streamed = parse(ad, "/retriever/stream", {"input": "x"})  # a search it does not read: counted, never cached
    assert streamed.operation == "retrieval" and streamed.query is None
    assert parse(ad, "/retriever/input_schema", b"", method="GET").operation == "other"


@pytest.mark.parametrize("api", ["json", "qdrant", "chroma", "elasticsearch", "langserve"])
def test_malformed_retrieval_bodies(api: str) -> None:
    ad = adapter(api, "retrieval")
    path = {"json": "/search", "qdrant": "/collections/c/points/search", "chroma": "/api/v1/collections/c/query",
            "elasticsearch": "/i/_search", "langserve": "/r/invoke"}[api]
    odd = (b'{"query": [1, "a"], "vector": {"x": 1}, "filter": 3, "top_k": "5", "limit": null,'
           b' "query_embeddings": [["a"]], "knn": 7, "input": 9}')
    for body in (b"nope", b"[]", odd):
        call = parse(ad, path, body)
        assert call.operation == "retrieval"
    call = parse(ad, path, {})
    obs = observe(ad, call, b'{"unexpected": true}')
    assert obs.chunks is None and obs.parse_error is not None


def test_bodiless_gets_are_not_retrievals() -> None:
    assert parse(adapter("json", "retrieval"), "/health", b"", method="GET").operation == "other"
    assert parse(adapter("elasticsearch", "retrieval"), "/i/_search", b"", method="GET").operation == "other"


def test_huge_vector_components_still_key() -> None:
    call = parse(adapter("qdrant", "retrieval"), "/collections/c/points/search", {"vector": [1e308, -1e308], "limit": 1})
    assert call.parse_error is None and call.query_key is not None


def test_chunks_without_ids_get_their_text_fingerprint() -> None:
    from ragtoll.proxy.core.evidence_track import chunk_key

    ad = adapter("json", "retrieval", {"id": "missing"})
    obs = observe(ad, parse(ad, "/search", {"query": "q"}), b'{"results": [{"text": "Some Text"}, {"text": "some  text"}]}')
    ids = [c.id for c in obs.chunks or []]
    assert ids[0] == ids[1] == chunk_key(Chunk("", "some text")) and ids[0].startswith("fp:")


def test_the_registry_rejects_unknown_field_keys() -> None:
    from ragtoll.proxy import adapters, config
    from ragtoll.proxy.errors import ConfigError

    up = {"name": "docs", "kind": "retrieval", "api": "json", "url": "http://127.0.0.1:1", "fields": {"qurey": "q"}}
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.fields\.qurey"):
        adapters.check(config.parse({"upstreams": [up]}).upstreams)
    adapters.check(config.parse({"upstreams": [{**up, "fields": {"query": "q", "acl": "meta.groups"}}]}).upstreams)


# --- what selects the evidence besides query, filters and top_k (Call.selector) ----------------------

def test_unknown_body_fields_select_the_evidence_and_key_order_does_not() -> None:
    ad = adapter("json", "retrieval")
    base = parse(ad, "/search", {"query": "q", "top_k": 3, "filter": {"a": 1}})
    assert base.selector is None  # nothing but what the adapter reads
    ns = parse(ad, "/search", {"query": "q", "top_k": 3, "namespace": "other"})
    assert ns.selector is not None and ns.selector != parse(ad, "/search", {"query": "q", "namespace": "b"}).selector
    reordered = parse(ad, "/search", {"namespace": "other", "top_k": 5, "query": "Q"})
    assert reordered.selector == ns.selector  # top_k and case are not part of it; key order neither
    assert parse(ad, "/search", {"query": "q", "namespace": "other", "n": 1.0}).selector == \
        parse(ad, "/search", {"query": "q", "namespace": "other", "n": 1}).selector


def test_json_irrelevant_fields_are_left_out_of_the_selector() -> None:
    ad = adapter("json", "retrieval", {"query": "params.q", "irrelevant": "request_id, params.debug"})
    plain = parse(ad, "/search", {"params": {"q": "x"}})
    assert plain.query == "x" and plain.selector is None
    assert parse(ad, "/search", {"params": {"q": "x", "debug": True}, "request_id": "r-1"}).selector is None
    assert parse(ad, "/search", {"params": {"q": "x", "lang": "de"}}).selector is not None


def test_presets_name_what_they_understand() -> None:
    qd = adapter("qdrant", "retrieval")
    path = "/collections/docs/points/search"
    assert parse(qd, path, {"vector": [0.1, 0.2], "limit": 3, "filter": {"must": []}}).selector is None
    named = parse(qd, path, {"vector": {"name": "image", "vector": [0.1, 0.2]}, "limit": 3})
    assert named.query_vector == [0.1, 0.2] and named.selector is not None  # the named vector selects
    assert parse(qd, path, {"vector": [0.1, 0.2], "limit": 3, "score_threshold": 0.5}).selector is not None
    doc = parse(qd, "/collections/docs/points/query", {"query": {"text": "hi", "model": "bm25"}})
    assert doc.query == "hi" and doc.selector is not None  # the model selects
    es = adapter("elasticsearch", "retrieval")
    q = {"query": {"match": {"text": "login failed"}}, "size": 3}
    assert parse(es, "/i/_search", q).selector is None
    assert parse(es, "/i/_search", {**q, "from": 10}).selector is not None
    ch = adapter("chroma", "retrieval")
    cq = {"query_texts": ["x"], "n_results": 2}
    assert parse(ch, "/api/v1/collections/c/query", cq).selector is None
    assert parse(ch, "/api/v1/collections/c/query", {**cq, "include": ["documents"]}).selector is not None
    ls = adapter("langserve", "retrieval")
    assert parse(ls, "/r/invoke", {"input": {"question": "q", "k": 3}}).selector is None
    assert parse(ls, "/r/invoke", {"input": "q", "config": {"tags": ["a"]}}).selector is not None


@pytest.mark.parametrize(("api", "method", "path", "operation"), [
    ("qdrant", "GET", "/", "other"),
    ("qdrant", "GET", "/collections/docs", "other"),
    ("qdrant", "PUT", "/collections/docs/points", "other"),
    ("qdrant", "POST", "/collections/docs/points/scroll", "other"),
    ("qdrant", "POST", "/collections/docs/points/count", "other"),
    ("qdrant", "POST", "/collections/docs/points/search/batch", "retrieval"),
    ("qdrant", "POST", "/collections/docs/points/recommend", "retrieval"),
    ("qdrant", "POST", "/collections/docs/points/query/groups", "retrieval"),
    ("elasticsearch", "POST", "/i/_msearch", "retrieval"),
    ("elasticsearch", "POST", "/i/_count", "other"),
    ("elasticsearch", "PUT", "/i/_doc/1", "other"),
    ("chroma", "POST", "/api/v1/collections/c/add", "other"),
    ("chroma", "POST", "/api/v1/collections/c/get", "other"),
    ("langserve", "POST", "/r/batch", "retrieval"),
    ("json", "PUT", "/points", "other"),
    ("json", "DELETE", "/points/1", "other"),
])
def test_operations_on_a_retrieval_route(api: str, method: str, path: str, operation: str) -> None:
    """Only searches are retrievals (budgeted as such, cached when read); the rest is `other`."""
    call = parse(adapter(api, "retrieval"), path, {"points": [], "searches": []}, method=method)
    assert call.operation == operation
    assert call.query is None and call.query_vector is None  # never read: never cached
