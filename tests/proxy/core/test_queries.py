"""Unique-query normalisation, canonical filters and the query key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ragtoll.proxy.core.queries import canonical_filters, filters_json, normalize, query_key


@pytest.mark.parametrize(("a", "b"), [
    ("What is RAG?", "what is rag"),
    ("  what   is\tRAG ", "what is rag."),
    ("ＡＰＩ keys", "API keys"),  # full-width (NFKC)
    ("café", "cafe\u0301"),  # composed vs combining accent
    ("Straße", "STRASSE"),  # casefold
    ("Plans for 2024!!", "plans for 2024"),
])
def test_same_intent_same_key(a: str, b: str) -> None:
    assert normalize(a) == normalize(b)
    assert query_key("docs", a, None, None) == query_key("docs", b, None, None)


@pytest.mark.parametrize(("a", "b"), [
    ("C++ tutorial", "C tutorial"),
    ("C# basics", "C basics"),
    ("flights from A to B", "flights from B to A"),
    ("annual plans", "monthly plans"),
    ("version 3.1", "version 3.2"),
    ("50% off", "50 off"),
    ("approve the request", "do not approve the request"),
    ("dog bites man", "man bites dog"),
])
def test_different_meaning_different_key(a: str, b: str) -> None:
    assert query_key("docs", a, None, None) != query_key("docs", b, None, None)


def test_key_separates_routes_filters_and_vectors_not_top_k() -> None:
    k = query_key("docs", "q", None, {"a": 1})
    assert k == query_key("docs", "q", None, {"a": 1.0})
    assert k != query_key("wiki", "q", None, {"a": 1})
    assert k != query_key("docs", "q", None, {"a": 2})
    assert k != query_key("docs", "q", None, None)
    assert query_key("docs", None, [0.1, 0.2], None) == query_key("docs", None, [0.1, 0.2], None)
    assert query_key("docs", None, [0.1, 0.2], None) != query_key("docs", None, [0.2, 0.1], None)
    assert query_key("docs", "q", None, None) != query_key("docs", None, [0.5], None)
    assert len(k) == 32  # xxh3-128 hex


def test_canonical_filters() -> None:
    assert canonical_filters({"b": 1.0, "a": {"y": -0.0, "x": [2.0, 2.5, True, None]}}) == {
        "a": {"x": [2, 2.5, True, None], "y": 0}, "b": 1}
    assert filters_json({"b": 1, "a": 2}) == filters_json({"a": 2.0, "b": 1.0}) == b'{"a":2,"b":1}'
    assert filters_json({"flag": True}) != filters_json({"flag": 1})
    assert canonical_filters(["b", "a"]) == ["b", "a"]  # list order can matter: kept
    with pytest.raises(ValueError):
        deep: object = 1
        for _ in range(100):
            deep = {"x": deep}
        canonical_filters(deep)


@given(st.text(max_size=80))
def test_normalize_is_idempotent(text: str) -> None:
    assert normalize(normalize(text)) == normalize(text)


@given(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.text(max_size=5)),
                       max_size=6))
def test_filter_key_order_never_matters(d: dict[str, object]) -> None:
    assert filters_json(d) == filters_json(dict(reversed(list(d.items()))))
