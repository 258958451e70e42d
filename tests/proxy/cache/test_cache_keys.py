"""Cache keys never looser than the upstream (issue 30 item 8), on memory and on a real Redis.

Normalisation merged pairs an upstream can answer differently (case, ß, superscripts, a trailing
Lucene wildcard, query_string operators); a literal "$query" in an Elasticsearch DSL keyed like
another caller's query text; a key sent twice was read at its last value. Each test failed before.
"""

from __future__ import annotations

import httpx
import pytest
from ragtoll.proxy import config
from ragtoll.proxy.adapters.base import json_body
from ragtoll.proxy.cache.evidence import EvidenceCache, Query
from ragtoll.proxy.cache.partition import normalize_query
from ragtoll.proxy.errors import ConfigError
from ragtoll.proxy.model import Principal
from ragtoll.proxy.stores.evidence_memory import MemoryEvidenceStore
from support.adapter_fixtures import adapter, parse

ALICE = Principal("alice", frozenset({"staff"}))

# pairs an upstream may answer differently: never one key unless the route says its upstream ignores it
APART = [
    ("SKU-AB12", "sku-ab12"),  # a keyword field, an ID: case matters
    ("Maße", "Masse"),  # casefold turns ß into ss: two words in German
    ("x²", "x2"),  # NFKC: a superscript is not a digit
    ("refund polic?", "refund polic"),  # a trailing ? is a Lucene single-character wildcard
    ("refund*", "refund"),
    ("cats AND dogs", "cats and dogs"),  # query_string: AND is an operator, "and" a word
]
# what no upstream tells apart: one key
SAME = [
    ("  refund   window\t", "refund window"),
    ("cafe\u0301", "café"),  # NFD and NFC of the same text
]


async def filed_then_asked(cache: EvidenceCache, route: str, first: str, second: str) -> bool:
    """Whether `second` is served the entry `first` filed."""
    lk = await cache.lookup(Query(route, first, None, 5, ALICE))
    assert not lk.hit
    await cache.store_evidence(lk, chunk_ids=["c1"], acls=[("staff",)], body=b'{"results": []}')
    return (await cache.lookup(Query(route, second, None, 5, ALICE))).hit


@pytest.mark.parametrize(("first", "second"), APART)
async def test_texts_an_upstream_tells_apart_never_share_an_entry(evidence_store: MemoryEvidenceStore, first: str,
                                                                 second: str) -> None:
    import uuid

    route = f"docs-{uuid.uuid4().hex[:8]}"  # the Redis server is shared by the session
    assert not await filed_then_asked(EvidenceCache(evidence_store), route, first, second)


@pytest.mark.parametrize(("first", "second"), SAME)
async def test_whitespace_and_unicode_form_share_an_entry(evidence_store: MemoryEvidenceStore, first: str,
                                                          second: str) -> None:
    import uuid

    assert await filed_then_asked(EvidenceCache(evidence_store), f"docs-{uuid.uuid4().hex[:8]}", first, second)


async def test_a_route_whose_upstream_ignores_case_folds_it_but_keeps_operators_and_wildcards(
        evidence_store: MemoryEvidenceStore) -> None:
    import uuid

    route = f"docs-{uuid.uuid4().hex[:8]}"
    cache = EvidenceCache(evidence_store, normalize_routes={route: ("whitespace", "nfc", "casefold", "width")})
    assert await filed_then_asked(cache, route, "SKU-AB12", "sku-ab12")
    assert await filed_then_asked(cache, route, "Ｒｅｆｕｎｄ  Window", "refund window")
    assert not await filed_then_asked(cache, route, "cats AND dogs", "cats and dogs")
    assert not await filed_then_asked(cache, route, "Refund polic?", "refund polic")
    other = f"other-{uuid.uuid4().hex[:8]}"  # another route keeps the default
    assert not await filed_then_asked(cache, other, "SKU-AB12", "sku-ab12")


def test_normalisation_modes() -> None:
    assert normalize_query("  Cats  AND Dogs? ") == "Cats AND Dogs?"
    assert normalize_query("Cats AND Dogs OR BRAND", ("lowercase",)) == "cats AND dogs OR brand"
    assert normalize_query("Maße", ("lowercase",)) == "maße" != normalize_query("Maße", ("casefold",))
    assert normalize_query("x²", ("nfc",)) == "x²" and normalize_query("x²", ("width",)) == "x2"


def test_the_normalisation_setting_is_validated() -> None:
    with pytest.raises(ConfigError) as bad:
        config.parse({"cache": {"normalize": ["whitespace", "soundex"]}})
    assert bad.value.details["key"] == "cache.normalize"
    up = {"name": "es", "kind": "retrieval", "api": "elasticsearch", "url": "http://127.0.0.1:9", "prefix": "/es"}
    with pytest.raises(ConfigError) as bad_route:
        config.parse({"upstreams": [{**up, "cache": {"normalize": "casefold"}}]})
    assert bad_route.value.details["key"].endswith(".cache.normalize")
    settings = config.parse({"upstreams": [{**up, "cache": {"normalize": ["whitespace", "nfc", "casefold"]}}]})
    assert settings.cache.normalize == ("whitespace", "nfc")
    assert settings.upstreams[0].cache.normalize == ("whitespace", "nfc", "casefold")


def test_a_literal_placeholder_in_the_dsl_never_keys_like_the_query() -> None:
    """An Elasticsearch DSL holding the string "$query" shared the entry of a caller whose filter
    held its own query text."""
    ad = adapter("elasticsearch", "retrieval", name="docs")

    def dsl(term: str) -> dict[str, object]:
        return {"query": {"bool": {"must": [{"match": {"text": {"query": "cats"}}}],
                                   "filter": [{"term": {"tag": term}}]}}, "size": 3}

    own, forged, escaped = parse(ad, "/idx/_search", dsl("cats")), parse(ad, "/idx/_search", dsl("$query")), \
        parse(ad, "/idx/_search", dsl("$$query"))
    assert own.query == forged.query == "cats"
    assert len({str(own.filters), str(forged.filters), str(escaped.filters)}) == 3
    assert len({own.query_key, forged.query_key, escaped.query_key}) == 3


@pytest.mark.parametrize("body", [
    b'{"query": "a", "query": "b"}',
    b'{"query": "a", "filter": {"tag": "x", "tag" :"y"}}',
    b'{"query": "\\u003a", "query": "b"}',  # a colon escaped inside a string, and a key twice
    '{"query": "a", "query": "b"}'.encode("utf-16"),
])
def test_a_key_sent_twice_is_unreadable(body: bytes) -> None:
    doc, why = json_body(body)
    assert doc is None and why is not None and why.startswith("duplicate JSON key")


@pytest.mark.parametrize("body", [b'{"query": "a: b", "k": {"query": "c"}}', b'{"a" : "\\u003a", "b": 1}'])
def test_colons_and_repeated_names_in_other_objects_are_fine(body: bytes) -> None:
    assert json_body(body)[0] is not None


@pytest.mark.parametrize(("path", "body"), [
    ("/docs/search", b'{"query": "refund", "top_k": 1, "top_k": 50}'),
    ("/openai/v1/chat/completions",
     b'{"model": "gpt-4o-mini", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9000}'),
])
def test_a_key_sent_twice_is_refused_400_on_every_route_ragtoll_reads(proxy, upstream, path: str,  # type: ignore[no-untyped-def]
                                                                    body: bytes) -> None:
    upstreams = [
        {"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"},
        {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url, "prefix": "/docs"},
    ]
    with proxy(upstreams=upstreams, budgets={"on_unreadable": "charge_reservation"}) as base:
        r = httpx.post(base + path, content=body, headers={"content-type": "application/json",
                                                           "x-ragtoll-task-id": "dup"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_json_key"
    assert "send each key once" in r.json()["error"]["message"]
