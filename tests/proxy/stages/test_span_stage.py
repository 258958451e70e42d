"""The span stage on exchanges without a server: what the call really was, written on its span in
`on_end` (request and response models, usage, parse problems, an unread response), and content
only when `telemetry.capture_content` is on."""

from __future__ import annotations

from typing import Any

from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.stages.span import SpanStage
from support.exchanges import CHAT, Exchanges, answer, results

COMPLETION = {
    "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini-2024-07-18",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "The refund window is 30 days."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 14, "completion_tokens": 8, "total_tokens": 22,
              "prompt_tokens_details": {"cached_tokens": 4}, "completion_tokens_details": {"reasoning_tokens": 2}},
}
CONTENT_KEYS = {sc.CONTENT_PROMPT, sc.CONTENT_COMPLETION, sc.CONTENT_QUERY, sc.CONTENT_CHUNKS}


async def recorded(xs: Exchanges, route: str = "openai", body: Any = CHAT, response: Any = COMPLETION,
                   unread: str | None = None) -> dict[str, Any]:
    ex = xs(route, body)
    answer(ex, response)
    if unread is not None:
        ex.observation.unread = unread  # what the forwarder's Inspector sets when it stops reading
    await SpanStage(xs.settings).on_end(ex)
    return dict(xs.finished(ex).attributes)


async def test_request_and_response_models_and_usage() -> None:
    attrs = await recorded(Exchanges())
    assert attrs[sc.GEN_AI_REQUEST_MODEL] == "gpt-4o-mini" and attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] == 20
    assert attrs[sc.GEN_AI_RESPONSE_MODEL] == "gpt-4o-mini-2024-07-18"
    assert attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert (attrs[sc.GEN_AI_USAGE_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_OUTPUT_TOKENS]) == (14, 8)
    assert (attrs[sc.GEN_AI_USAGE_CACHED_INPUT_TOKENS], attrs[sc.GEN_AI_USAGE_REASONING_TOKENS]) == (4, 2)
    assert attrs[sc.STREAM] is False
    estimate = attrs[sc.PROMPT_TOKENS_ESTIMATE]
    assert attrs[sc.PROMPT_TOKENS_DELTA] == 14 - estimate  # how far the offline count was off


async def test_no_usage_in_the_answer_writes_no_usage() -> None:
    attrs = await recorded(Exchanges(), response={**COMPLETION, "usage": None})
    assert not {sc.GEN_AI_USAGE_INPUT_TOKENS, sc.GEN_AI_USAGE_OUTPUT_TOKENS, sc.PROMPT_TOKENS_DELTA} & set(attrs)


async def test_retrieval_names_its_data_source_and_top_k() -> None:
    attrs = await recorded(Exchanges(), "docs", {"query": "refunds", "top_k": 4}, results(["a", "b"]))
    assert attrs[sc.GEN_AI_DATA_SOURCE_ID] == "docs" and attrs[sc.GEN_AI_REQUEST_TOP_K] == 4
    assert sc.GEN_AI_REQUEST_MODEL not in attrs


async def test_parse_errors_of_request_and_response() -> None:
    bad_request = await recorded(Exchanges(), body=b'{"model": "gpt')
    assert bad_request[sc.PARSE_ERROR].startswith("request is not JSON")
    bad_answer = await recorded(Exchanges(), response=b"<html>upstream proxy error</html>")
    assert bad_answer[sc.PARSE_ERROR].startswith("response is not JSON")
    assert sc.PARSE_ERROR not in await recorded(Exchanges())


async def test_an_unread_response_says_why() -> None:
    attrs = await recorded(Exchanges(), unread="larger than max_inspect_bytes (8388608)")
    assert attrs[sc.RESPONSE_UNREAD] == "larger than max_inspect_bytes (8388608)"
    assert sc.RESPONSE_UNREAD not in await recorded(Exchanges())


async def test_content_is_not_captured_by_default() -> None:
    chat = await recorded(Exchanges())
    retrieval = await recorded(Exchanges(), "docs", {"query": "refunds", "top_k": 2}, results(["a", "b"]))
    assert not CONTENT_KEYS & (set(chat) | set(retrieval))


async def test_content_is_captured_when_enabled_and_cut_to_the_limit() -> None:
    xs = Exchanges(telemetry={"capture_content": True, "content_max_chars": 40})
    chat = await recorded(xs)
    assert chat[sc.CONTENT_PROMPT] == '["hi"]'
    assert chat[sc.CONTENT_COMPLETION] == '["The refund window is 30 days."]'
    retrieval = await recorded(xs, "docs", {"query": "refunds", "top_k": 2},
                               results(["a", "b"], text="a long chunk of text, number {id}, about refunds"))
    assert retrieval[sc.CONTENT_QUERY] == '["refunds"]'
    assert retrieval[sc.CONTENT_CHUNKS].endswith("...[truncated]") and len(retrieval[sc.CONTENT_CHUNKS]) == 40
    assert sc.CONTENT_PROMPT not in retrieval  # a retrieval's "prompt" is its query
