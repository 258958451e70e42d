"""Prices: the shipped default table, config overrides, per-call routes and the fallback."""

from __future__ import annotations

import pytest
from ragtoll.proxy import config
from ragtoll.proxy.core.pricing import Cost, Prices, load_default_table
from ragtoll.proxy.model import Call, Observation, Usage

UPSTREAMS = [
    {"name": "openai", "kind": "llm", "api": "openai", "url": "http://127.0.0.1:1"},
    {"name": "docs", "kind": "retrieval", "api": "json", "url": "http://127.0.0.1:2"},
    {"name": "local", "kind": "llm", "api": "openai", "url": "http://127.0.0.1:3"},
    {"name": "rr", "kind": "rerank", "api": "cohere", "url": "http://127.0.0.1:4"},
]


def _prices(pricing: dict[str, object] | None = None) -> tuple[Prices, dict[str, config.UpstreamConfig]]:
    settings = config.parse({"upstreams": UPSTREAMS, "pricing": pricing or {}})
    return Prices.from_settings(settings), {u.name: u for u in settings.upstreams}


def test_default_table_is_dated_and_has_widely_used_models() -> None:
    taken, models, fallback = load_default_table()
    assert taken[:4].isdigit()
    for m in ("gpt-4o", "gpt-4o-mini", "gpt-4.1", "o3", "gpt-5", "text-embedding-3-small", "claude-sonnet-4-5"):
        assert models[m].input_per_mtok is not None
    assert fallback.output_per_mtok is not None


def test_estimate_uses_prompt_tokens_and_max_output() -> None:
    prices, ups = _prices()
    call = Call(operation="chat", model="gpt-4o-mini-2024-07-18", prompt_tokens=1_000_000, max_output_tokens=None)
    cost = prices.estimate(ups["openai"], call, default_max_output_tokens=1_000_000)
    assert cost == Cost(usd=pytest.approx(0.15 + 0.60), known=True)
    call.max_output_tokens = 500_000
    assert prices.estimate(ups["openai"], call, 10).usd == pytest.approx(0.15 + 0.30)
    two = Call(operation="chat", model="gpt-4o-mini", prompt_tokens=0, choices=2)
    assert prices.estimate(ups["openai"], two, 1_000_000).usd == pytest.approx(1.20)


def test_actual_uses_usage_with_cached_input_price() -> None:
    prices, ups = _prices()
    call = Call(operation="chat", model="gpt-4o", prompt_tokens=10)
    obs = Observation(usage=Usage(input_tokens=1_000_000, output_tokens=100_000, cached_input_tokens=400_000))
    # 600k fresh x 2.50 + 400k cached x 1.25 + 100k x 10.00
    assert prices.actual(ups["openai"], call, obs) == Cost(usd=pytest.approx(1.5 + 0.5 + 1.0), known=True)


def test_actual_without_usage_falls_back_to_counted_and_seen_tokens() -> None:
    prices, ups = _prices()
    call = Call(operation="chat", model="gpt-4o", prompt_tokens=1_000_000, max_output_tokens=1_000_000)
    assert prices.actual(ups["openai"], call, Observation(output_tokens_seen=100_000)).usd == pytest.approx(3.5)
    assert prices.actual(ups["openai"], call, Observation()).usd == pytest.approx(12.5)  # assume the max


def test_config_overrides_and_extends_models() -> None:
    prices, ups = _prices({"gpt-4o": {"output_per_mtok": 20.0}, "my-llama": {"input_per_mtok": 0.1, "output_per_mtok": 0.2}})
    gpt = Call(operation="chat", model="gpt-4o", prompt_tokens=1_000_000, max_output_tokens=1_000_000)
    assert prices.estimate(ups["openai"], gpt, 0).usd == pytest.approx(2.5 + 20.0)  # input kept, output overridden
    llama = Call(operation="chat", model="my-llama", prompt_tokens=1_000_000, max_output_tokens=1_000_000)
    assert prices.estimate(ups["local"], llama, 0) == Cost(usd=pytest.approx(0.3), known=True)


def test_route_per_call_prices() -> None:
    prices, ups = _prices({"docs": {"per_call": 0.0005}})
    call = Call(operation="retrieval", query="q")
    assert prices.estimate(ups["docs"], call, 1024) == Cost(usd=0.0005, known=True)
    assert prices.actual(ups["docs"], call, Observation()) == Cost(usd=0.0005, known=True)
    rerank = Call(operation="rerank", model="rerank-v3.5")
    assert prices.estimate(ups["rr"], rerank, 0) == Cost(usd=0.002, known=True)  # from the default table


def test_unknown_model_uses_configurable_fallback_and_says_so() -> None:
    prices, ups = _prices()
    call = Call(operation="chat", model="some-new-model", prompt_tokens=1_000_000, max_output_tokens=0)
    cost = prices.estimate(ups["local"], call, 0)
    assert cost.known is False and cost.usd == pytest.approx(2.5)
    prices2, ups2 = _prices({"default": {"input_per_mtok": 1.0, "per_call": 0.01}})
    assert prices2.estimate(ups2["local"], call, 0) == Cost(usd=pytest.approx(1.0), known=False)
    assert prices2.estimate(ups2["docs"], Call(operation="retrieval"), 0) == Cost(usd=0.01, known=False)
    unread = Call(operation="chat", model="gpt-4o", prompt_tokens=None, max_output_tokens=10)
    assert prices.estimate(ups["openai"], unread, 0).known is False


def test_an_unpriced_models_reported_usage_is_measured_at_the_fallback_price() -> None:
    prices, ups = _prices()
    call = Call(operation="chat", model="my-local-llm", prompt_tokens=10, max_output_tokens=None)
    used = prices.actual(ups["local"], call, Observation(usage=Usage(input_tokens=10, output_tokens=3000)))
    assert (used.usd, used.known, used.priced, used.measured) == (pytest.approx(0.030025), False, False, True)
    unread = prices.actual(ups["local"], call, Observation())  # no usage, no max_tokens: tokens unknown
    assert (unread.priced, unread.measured) == (False, False)
    priced = prices.actual(ups["openai"], Call(operation="chat", model="gpt-4o", prompt_tokens=10),
                           Observation(usage=Usage(input_tokens=10, output_tokens=3)))
    assert (priced.known, priced.priced, priced.measured) == (True, True, True)


def test_embeddings_have_no_output_cost() -> None:
    prices, ups = _prices()
    call = Call(operation="embeddings", model="text-embedding-3-small", prompt_tokens=1_000_000)
    assert prices.estimate(ups["openai"], call, 4096) == Cost(usd=pytest.approx(0.02), known=True)


def test_anthropic_cache_writes_cost_a_quarter_more_than_input_and_reads_a_tenth() -> None:
    """Claude's prompt cache: a 5-minute cache write is billed at 1.25x the input price, a read at
    0.1x (the uncached rest at 1x). Before, writes were priced as plain input."""
    prices, ups = _prices()
    call = Call(operation="chat", model="claude-sonnet-4-5-20250929", prompt_tokens=10)
    usage = Usage(input_tokens=1_000_000, output_tokens=0, cached_input_tokens=500_000, cache_write_tokens=300_000)
    # 200k fresh x 3.00 + 500k read x 0.30 + 300k written x 3.75
    assert prices.actual(ups["openai"], call, Observation(usage=usage)).usd == pytest.approx(0.6 + 0.15 + 1.125)
    for name, entry in load_default_table()[1].items():
        if name.startswith("claude"):
            assert entry.cache_write_per_mtok == pytest.approx(1.25 * entry.input_per_mtok, rel=0.05), name
            assert entry.cached_input_per_mtok == pytest.approx(0.1 * entry.input_per_mtok, rel=0.25), name


def test_cache_writes_unpriced_cost_input_and_never_more_than_the_prompt() -> None:
    prices, ups = _prices()
    call = Call(operation="chat", model="gpt-4o", prompt_tokens=10)
    usage = Usage(input_tokens=100, output_tokens=0, cached_input_tokens=60, cache_write_tokens=500)
    # 40 written at the input price (gpt-4o has no write price), 60 read at 1.25
    assert prices.actual(ups["openai"], call, Observation(usage=usage)).usd == pytest.approx((40 * 2.5 + 60 * 1.25) / 1e6)
