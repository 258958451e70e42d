"""Partition keys, exact keys and the top_k rule."""

from __future__ import annotations

from ragtoll.proxy.cache.partition import (
    Partition,
    canonical_filters,
    exact_key,
    filter_words,
    normalize_query,
    serves_top_k,
)


def test_normalisation_is_conservative() -> None:
    assert normalize_query("  Refund   Window?? ") == "Refund Window??"  # whitespace only, by default
    assert normalize_query("Ｒｅｆｕｎｄ", ("width", "lowercase")) == "refund"  # opt-in: NFKC, case
    assert normalize_query('the "pro" plan') == 'the "pro" plan'
    assert normalize_query("A to B") != normalize_query("B to A")
    assert exact_key("a b") == exact_key("a b") != exact_key("b a")


def test_partition_key_changes_with_every_component() -> None:
    base = Partition("docs", "v1", canonical_filters({"a": 1, "b": [1, 2]}), "t1")
    assert base.key == Partition("docs", "v1", canonical_filters({"b": [1, 2], "a": 1}), "t1").key
    for other in (Partition("kb", "v1", base.filters, "t1"), Partition("docs", "v2", base.filters, "t1"),
                  Partition("docs", "v1", canonical_filters({"a": 2, "b": [1, 2]}), "t1"),
                  Partition("docs", "v1", base.filters, "t2")):
        assert other.key != base.key
    # the audit scope ignores the version, so a raised threshold survives re-ingestion
    assert Partition("docs", "v2", base.filters, "t1").source == base.source


def test_empty_filters_share_a_partition() -> None:
    assert canonical_filters(None) == canonical_filters({}) == canonical_filters([])


def test_top_k_rule() -> None:
    assert serves_top_k(10, 10) and serves_top_k(10, 3)
    assert not serves_top_k(3, 10)
    assert serves_top_k(None, None)
    assert not serves_top_k(None, 5) and not serves_top_k(5, None)


def test_filter_words() -> None:
    assert filter_words({"plan": "Pro", "region": ["EU", "US"], "n": 3}) == {"pro", "eu", "us"}
