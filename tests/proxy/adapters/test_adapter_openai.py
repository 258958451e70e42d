"""The `openai` adapter against fixtures from the public API reference."""

from __future__ import annotations

import orjson
import pytest
from ragtoll.proxy.core import tokens
from ragtoll.proxy.model import Usage
from support.adapter_fixtures import adapter, load, observe, observe_every_split, parse, raw

SSE = "text/event-stream"


def test_chat_request_counts_messages_with_the_model_encoding() -> None:
    fx = load("openai_chat.json")
    call = parse(adapter("openai"), fx["path"], fx["request"])
    assert (call.operation, call.model, call.stream, call.parse_error) == ("chat", "gpt-4o", False, None)
    assert call.prompt_texts == ["You are a helpful assistant.", "Hello!"]
    assert call.prompt_estimated is False
    enc = tokens.encoding("o200k_base")
    expected = sum(len(enc.encode_ordinary(t)) for t in call.prompt_texts) + 3 * 2 + 3
    assert call.prompt_tokens == expected
    # the API reported 19 for this request: the estimate is close, not a guess
    assert abs(call.prompt_tokens - fx["response"]["usage"]["prompt_tokens"]) <= 3


def test_chat_response_usage_model_and_finish() -> None:
    fx = load("openai_chat.json")
    ad = adapter("openai")
    obs = observe(ad, parse(ad, fx["path"], fx["request"]), orjson.dumps(fx["response"]))
    assert obs.usage == Usage(input_tokens=19, output_tokens=10, cached_input_tokens=0, reasoning_tokens=0)
    assert obs.response_model == "gpt-4o-2024-08-06"
    assert obs.finish_reasons == ["stop"]
    assert obs.parse_error is None


def test_tools_and_n_are_counted_and_reserved_for_every_choice() -> None:
    fx = load("openai_chat_tools.json")
    ad = adapter("openai")
    call = parse(ad, fx["path"], fx["request"])
    assert call.choices == 2
    assert call.max_output_tokens == 400  # 200 per choice, two choices
    assert any("get_current_weather" in t and "celsius" in t for t in call.prompt_texts)
    without_tools = parse(ad, fx["path"], {**fx["request"], "tools": []})
    assert call.prompt_tokens is not None and without_tools.prompt_tokens is not None
    assert call.prompt_tokens - without_tools.prompt_tokens > 30
    obs = observe(ad, call, orjson.dumps(fx["response"]))
    assert obs.finish_reasons == ["tool_calls", "tool_calls"]
    assert obs.usage is not None and obs.usage.output_tokens == 36


def test_stream_with_include_usage_at_every_byte_boundary() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/chat/completions", {"model": "gpt-4o-mini", "stream": True,
                                              "stream_options": {"include_usage": True},
                                              "messages": [{"role": "user", "content": "hi"}]})
    assert call.stream is True
    body = raw("openai_chat_stream_usage.sse")
    for obs in observe_every_split(ad, call, body, SSE):
        assert obs.usage == Usage(input_tokens=9, output_tokens=2, cached_input_tokens=4, reasoning_tokens=0)
        assert obs.finish_reasons == ["stop"]
        assert obs.response_model == "gpt-4o-mini"
        assert obs.output_tokens_seen == tokens.count("Hello", "o200k_base") + tokens.count(" wörld", "o200k_base")
        assert obs.parse_error is None


def test_stream_without_usage_counts_output_as_it_passes() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/chat/completions", {"model": "gpt-4o", "stream": True, "messages": []})
    body = raw("openai_chat_stream_tools.sse")
    obs = ad.observer(call, 200, {"content-type": SSE})
    seen = []
    for line in body.split(b"\n\n"):
        obs.feed(line + b"\n\n", False)
        seen.append(obs.observation.output_tokens_seen)
    obs.feed(b"", True)
    o = obs.observation
    assert o.usage is None
    assert o.finish_reasons == ["tool_calls"]
    # tool name and argument fragments are output too, counted event by event (monotonic)
    assert seen == sorted(seen) and seen[1] > 0 and o.output_tokens_seen > seen[1]


def test_stream_with_two_choices_and_crlf_framing() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/chat/completions", {"model": "gpt-4o", "stream": True, "n": 2, "messages": []})
    for obs in observe_every_split(ad, call, raw("openai_chat_stream_n2_crlf.sse"), SSE):
        assert obs.finish_reasons == ["stop", "length"]
        assert obs.output_tokens_seen == tokens.count_many(["Hi", "Hey", " there"])


def test_legacy_completions() -> None:
    fx = load("openai_completions.json")
    ad = adapter("openai")
    call = parse(ad, fx["path"], fx["request"])
    assert (call.operation, call.max_output_tokens, call.prompt_estimated) == ("text_completion", 7, False)
    assert call.prompt_tokens == fx["response"]["usage"]["prompt_tokens"]  # cl100k, exactly what the API said
    obs = observe(ad, call, orjson.dumps(fx["response"]))
    assert obs.finish_reasons == ["length"] and obs.usage is not None and obs.usage.output_tokens == 7
    default = parse(ad, fx["path"], {"model": "gpt-3.5-turbo-instruct", "prompt": [[1, 2, 3], [4]]})
    assert default.max_output_tokens == 16 and default.prompt_tokens == 4
    stream = parse(ad, fx["path"], {**fx["request"], "stream": True})
    for obs in observe_every_split(ad, stream, raw("openai_completions_stream.sse"), SSE):
        assert obs.finish_reasons == ["stop"]
        assert obs.output_tokens_seen == tokens.count_many(["This", " is a test"], "cl100k_base")


def test_responses_api_request_and_response() -> None:
    fx = load("openai_responses.json")
    ad = adapter("openai")
    call = parse(ad, fx["path"], fx["request"])
    assert (call.operation, call.model, call.max_output_tokens) == ("chat", "gpt-4.1", 300)
    assert call.prompt_texts[0] == "Answer briefly."
    assert "Unicorns are mythical." in call.prompt_texts
    assert any("lookup" in t and "unicorn" in t for t in call.prompt_texts)
    obs = observe(ad, call, orjson.dumps(fx["response"]))
    assert obs.usage == Usage(input_tokens=36, output_tokens=87, cached_input_tokens=0, reasoning_tokens=0)
    assert obs.finish_reasons == ["stop"] and obs.response_model == "gpt-4.1-2025-04-14"


def test_responses_api_stream_at_every_byte_boundary() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/responses", {"model": "gpt-4.1", "input": "hi", "stream": True})
    for obs in observe_every_split(ad, call, raw("openai_responses_stream.sse"), SSE):
        assert obs.usage == Usage(input_tokens=37, output_tokens=11, cached_input_tokens=0, reasoning_tokens=0)
        assert obs.finish_reasons == ["stop"]
        assert obs.output_tokens_seen == tokens.count_many(["Hi", " there!"])


def test_responses_incomplete_maps_to_length() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/responses", {"model": "gpt-5", "input": "x"})
    body = {"object": "response", "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "model": "gpt-5", "output": [], "usage": {"input_tokens": 5, "output_tokens": 16}}
    assert observe(ad, call, orjson.dumps(body)).finish_reasons == ["length"]


def test_embeddings() -> None:
    fx = load("openai_embeddings.json")
    ad = adapter("openai")
    call = parse(ad, fx["path"], fx["request"])
    assert (call.operation, call.inputs, call.prompt_estimated) == ("embeddings", 2, False)
    enc = tokens.encoding("cl100k_base")
    assert call.prompt_tokens == sum(len(enc.encode_ordinary(t)) for t in fx["request"]["input"])
    obs = observe(ad, call, orjson.dumps(fx["response"]))
    assert obs.usage is not None and obs.usage.input_tokens == 12
    assert parse(ad, fx["path"], {"model": "text-embedding-3-small", "input": "one"}).inputs == 1


@pytest.mark.parametrize("body", [b"", b"{not json", b"[1,2]", b'{"model": 5, "messages": "nope"}',
                                  b'{"messages": [{"content": {"x": 1}}, 7]}', b'{"n": "two", "max_tokens": true}'])
def test_malformed_requests_never_raise(body: bytes) -> None:
    ad = adapter("openai")
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings"):
        call = parse(ad, path, body)
        assert call.operation != "other"
        assert call.model is None


def test_unreadable_request_records_why() -> None:
    call = parse(adapter("openai"), "/v1/chat/completions", b"{not json")
    assert call.parse_error is not None and "not JSON" in call.parse_error


def test_malformed_responses_record_parse_error() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/chat/completions", {"model": "gpt-4o", "messages": []})
    assert observe(ad, call, b"<html>").parse_error is not None
    assert observe(ad, call, b'{"choices": 5}').parse_error is not None
    stream = observe(ad, call, b"data: {broken\n\ndata: [DONE]\n\n", SSE)
    assert stream.parse_error is not None


def test_other_paths_and_errors_are_not_read() -> None:
    ad = adapter("openai")
    assert parse(ad, "/v1/models", b"", method="GET").operation == "other"
    call = parse(ad, "/v1/chat/completions", {"model": "gpt-4o", "messages": []})
    assert observe(ad, call, b'{"error": {}}', status=429).usage is None


def test_azure_deployment_path_names_the_model() -> None:
    call = parse(adapter("openai"), "/openai/deployments/gpt-4o-prod/chat/completions",
                 {"messages": [{"role": "user", "content": "hi"}]})
    assert call.operation == "chat" and call.model == "gpt-4o-prod"


def _sse(*docs: dict[str, object]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in docs) + b"data: [DONE]\n\n"


def _chunk(delta: dict[str, object]) -> dict[str, object]:
    return {"object": "chat.completion.chunk", "model": "gpt-4o", "choices": [{"index": 0, "delta": delta}]}


@pytest.mark.parametrize("delta", [
    {"content": "one two three four"}, {"refusal": "one two three four"}, {"reasoning": "one two three four"},
    {"reasoning_content": "one two three four"}, {"thoughts": "one two three four"},
    {"thoughts": {"type": "text", "text": "one two three four"}},
    {"function_call": {"name": "", "arguments": "one two three four"}},
    {"audio": {"id": "a", "data": "AAAA", "transcript": "one two three four"}},
], ids=lambda d: next(iter(d)))
def test_every_text_a_stream_delta_carries_is_output(delta: dict[str, object]) -> None:
    """Text in any delta field counts toward output tokens (so a budget can cut it): the fields
    OpenAI, OpenRouter and vLLM use, and one ragtoll does not know, counted all the same."""
    ad = adapter("openai")
    call = parse(ad, "/v1/chat/completions", {"model": "gpt-4o", "stream": True, "messages": []})
    obs = observe(ad, call, _sse(_chunk({"role": "assistant"}), _chunk(delta)), SSE)
    assert obs.output_tokens_seen == tokens.count("one two three four", "o200k_base")


def test_openrouter_reasoning_details_are_not_counted_twice() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/chat/completions", {"model": "gpt-4o", "stream": True, "messages": []})
    text = "one two three four"
    delta = {"reasoning": text, "reasoning_details": [{"type": "reasoning.text", "text": text, "index": 0}]}
    assert observe(ad, call, _sse(_chunk(delta)), SSE).output_tokens_seen == tokens.count(text, "o200k_base")


def test_responses_deltas_of_any_kind_are_output() -> None:
    ad = adapter("openai")
    call = parse(ad, "/v1/responses", {"model": "gpt-4o", "stream": True, "input": "q"})
    events = [{"type": "response.reasoning_summary_text.delta", "delta": "one two"},
              {"type": "response.custom_tool_call_input.delta", "delta": "three four"},
              {"type": "response.audio.delta", "delta": "AAAAAAAA"}]
    obs = observe(ad, call, _sse(*events), SSE)
    assert obs.output_tokens_seen == tokens.count("one two", "o200k_base") + tokens.count("three four", "o200k_base")


@pytest.mark.parametrize(("path", "body", "expect"), [
    ("/v1/chat/completions", {"model": "gpt-4o", "max_tokens": 9000}, {"max_tokens": 70}),
    ("/v1/chat/completions", {"model": "gpt-4o", "max_completion_tokens": 9000}, {"max_completion_tokens": 70}),
    ("/v1/chat/completions", {"model": "gpt-4o"}, {"max_tokens": 70}),
    ("/v1/chat/completions", {"model": "o3-mini-2025-01-31"}, {"max_completion_tokens": 70}),
    ("/v1/chat/completions", {"model": "openai/gpt-5"}, {"max_completion_tokens": 70}),
    ("/v1/completions", {"model": "gpt-3.5-turbo-instruct", "max_tokens": 500}, {"max_tokens": 70}),
    ("/v1/responses", {"model": "gpt-4.1", "input": "q"}, {"max_output_tokens": 70}),
])
def test_cap_output_sets_the_cap_the_request_names_or_its_model_reads(path: str, body: dict[str, object],
                                                                      expect: dict[str, int]) -> None:
    capped = orjson.loads(adapter("openai").cap_output(path, orjson.dumps(body), 70))
    assert capped == {**body, **expect}
    assert adapter("openai").cap_output("/v1/embeddings", orjson.dumps(body), 70) is None


def test_a_finish_asks_for_one_answer() -> None:
    body = {"model": "gpt-4o", "n": 4, "messages": [], "tools": [{"type": "function", "function": {"name": "f"}}]}
    done = orjson.loads(adapter("openai").finish("/v1/chat/completions", orjson.dumps(body), None))
    assert (done["n"], done["tool_choice"]) == (1, "none")
