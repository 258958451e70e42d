"""The `anthropic` adapter (Messages API) against fixtures from the public API reference."""

from __future__ import annotations

import orjson
from ragtoll.proxy.core import tokens
from ragtoll.proxy.model import Call, Observation, Usage
from support.adapter_fixtures import adapter, load, observe, observe_every_split, parse, raw


def test_request_counts_system_messages_tool_use_and_tools_as_an_estimate() -> None:
    fx = load("anthropic_messages.json")
    ad = adapter("anthropic")
    assert ad.error_style == "anthropic"
    call = parse(ad, fx["path"], fx["request"])
    assert (call.operation, call.model, call.max_output_tokens, call.stream) == (
        "chat", "claude-sonnet-4-5-20250929", 1024, False)
    assert call.prompt_estimated is True
    texts = call.prompt_texts
    assert texts[0] == "You are a concise assistant."
    assert "15 degrees, foggy" in texts  # tool_result content
    assert any(t.startswith("get_weather") and "San Francisco" in t for t in texts)  # tool_use input
    assert any("input_schema" in t for t in texts)  # tool definitions
    assert call.prompt_tokens == tokens.count_many(texts) + 3 * 4 + 3


def test_response_usage_includes_cache_reads_in_input() -> None:
    fx = load("anthropic_messages.json")
    ad = adapter("anthropic")
    obs = observe(ad, parse(ad, fx["path"], fx["request"]), orjson.dumps(fx["response"]))
    assert obs.usage == Usage(input_tokens=1610, output_tokens=14, cached_input_tokens=1200, cache_write_tokens=0)
    assert obs.finish_reasons == ["end_turn"]
    assert obs.response_model == "claude-sonnet-4-5-20250929"


def test_stream_at_every_byte_boundary() -> None:
    ad = adapter("anthropic")
    call = parse(ad, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 64, "stream": True,
                                      "messages": [{"role": "user", "content": "hi"}]})
    assert call.stream is True
    expected_seen = tokens.count_many(["Hello", "!", "get_weather", '{"location": "San Fra', 'ncisco, CA"}'])
    for obs in observe_every_split(ad, call, raw("anthropic_messages_stream.sse"), "text/event-stream"):
        assert obs.usage == Usage(input_tokens=30, output_tokens=15, cached_input_tokens=5)
        assert obs.finish_reasons == ["tool_use"]
        assert obs.response_model == "claude-sonnet-4-5-20250929"
        assert obs.output_tokens_seen == expected_seen
        assert obs.parse_error is None


def test_other_endpoints_and_malformed_bodies() -> None:
    ad = adapter("anthropic")
    assert parse(ad, "/v1/messages/count_tokens", {"model": "x"}).operation == "other"
    assert parse(ad, "/v1/models", b"", method="GET").operation == "other"
    bad = parse(ad, "/v1/messages", b"\xff\xfe")
    assert bad.operation == "chat" and bad.parse_error is not None
    odd = parse(ad, "/v1/messages", {"model": "claude-3-5-haiku", "system": 5, "messages": [1, {"content": 2}]})
    assert odd.model == "claude-3-5-haiku" and odd.parse_error is None


def test_message_delta_with_partial_input_usage_keeps_the_start_totals() -> None:
    ad = adapter("anthropic")
    call = parse(ad, "/v1/messages", {"model": "claude-haiku-4-5", "max_tokens": 5, "stream": True, "messages": []})
    body = (b'event: message_start\ndata: {"type":"message_start","message":{"model":"claude-haiku-4-5",'
            b'"usage":{"input_tokens":20,"cache_read_input_tokens":100,"output_tokens":1}}}\n\n'
            b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"max_tokens"},'
            b'"usage":{"input_tokens":20,"output_tokens":5}}\n\n')
    obs = observe(ad, call, body, "text/event-stream")
    assert obs.usage == Usage(input_tokens=120, output_tokens=5, cached_input_tokens=100)
    assert obs.finish_reasons == ["max_tokens"]


def test_cache_writes_are_read_apart_from_reads() -> None:
    ad = adapter("anthropic")
    call = parse(ad, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": []})
    body = orjson.dumps({"model": "claude-sonnet-4-5", "content": [], "usage": {
        "input_tokens": 10, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 300, "output_tokens": 2}})
    obs = observe(ad, call, body, "application/json")
    assert obs.usage == Usage(input_tokens=1310, output_tokens=2, cached_input_tokens=1000, cache_write_tokens=300)


def test_stream_end_closes_the_stream_as_a_max_tokens_stop() -> None:
    raw = adapter("anthropic").stream_end(Call("chat", model="claude"), Observation(output_tokens_seen=7),
                                          "/v1/messages", 0)
    events = [e.split(b"\n") for e in raw.split(b"\n\n") if e]
    assert [e[0] for e in events] == [b"event: message_delta", b"event: message_stop"]
    delta = orjson.loads(events[0][1][6:])
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 7


def _events(*docs: dict[str, object]) -> bytes:
    return b"".join(b"event: " + str(d["type"]).encode() + b"\ndata: " + orjson.dumps(d) + b"\n\n" for d in docs)


def test_thinking_redacted_thinking_and_unknown_deltas_are_output() -> None:
    ad = adapter("anthropic")
    call = parse(ad, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": True,
                                      "messages": []})
    body = _events(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "one two"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "Zm9vYmFy"}},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "redacted_thinking", "data": "three"}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "future_delta", "words": "four five"}})
    obs = observe(ad, call, body, "text/event-stream")
    assert obs.output_tokens_seen == sum(tokens.count(t, "o200k_base") for t in ("one two", "three", "four five"))


def test_cap_output_lowers_max_tokens_and_a_thinking_budget_to_fit() -> None:
    ad = adapter("anthropic")
    body = {"model": "claude-sonnet-4-5", "max_tokens": 20000, "messages": [],
            "thinking": {"type": "enabled", "budget_tokens": 16000}}
    fit = orjson.loads(ad.cap_output("/v1/messages", orjson.dumps(body), 5000))
    assert (fit["max_tokens"], fit["thinking"]) == (5000, {"type": "enabled", "budget_tokens": 4999})
    off = orjson.loads(ad.cap_output("/v1/messages", orjson.dumps(body), 800))
    assert off["max_tokens"] == 800 and "thinking" not in off
