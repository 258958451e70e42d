"""Span stage: writes what the call really was onto its span in `on_end`: the request's model and
limits, the response's model, usage and finish reasons, parse problems, and (only with
`telemetry.capture_content`) the content. It never answers or fails a call.
"""

from __future__ import annotations

from typing import Any

import orjson
from ragtoll.instrumentation import semconv as sc

from ..config import Settings
from ..model import Call, Observation
from ..request.exchange import Exchange, Stage, contract


class SpanStage(Stage):
    contract = contract(end_reads="span call observation route")

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._limit = settings.telemetry.content_max_chars

    def _content(self, call: Call, obs: Observation) -> dict[str, str]:
        """Prompts, completions, queries and chunk texts, each cut to `telemetry.content_max_chars`.
        Only with `telemetry.capture_content: true`: they may hold personal or secret data."""
        out: dict[str, str] = {}
        pieces = (
            (sc.CONTENT_PROMPT, call.prompt_texts if call.operation not in ("retrieval", "rerank") else []),
            (sc.CONTENT_COMPLETION, obs.output_text),
            (sc.CONTENT_QUERY, [call.query] if call.query else []),
            (sc.CONTENT_CHUNKS, [c.text for c in obs.chunks or [] if c.text]),
        )
        for key, texts in pieces:
            if texts:
                out[key] = _cut(orjson.dumps(texts).decode(), self._limit)
        return out

    async def on_end(self, ex: Exchange) -> None:
        span = ex.span
        if span is None or not span.is_recording():
            return
        call, obs = ex.call, ex.observation
        attrs: dict[str, Any] = {sc.STREAM: call.stream}
        if call.model:
            attrs[sc.GEN_AI_REQUEST_MODEL] = call.model
        if call.max_output_tokens is not None:
            attrs[sc.GEN_AI_REQUEST_MAX_TOKENS] = call.max_output_tokens
        if call.top_k is not None:
            attrs[sc.GEN_AI_REQUEST_TOP_K] = call.top_k
        if call.operation == "retrieval":
            attrs[sc.GEN_AI_DATA_SOURCE_ID] = ex.route.upstream.name
        if call.prompt_tokens is not None:
            attrs[sc.PROMPT_TOKENS_ESTIMATE] = call.prompt_tokens
            attrs[sc.PROMPT_TOKENS_ESTIMATED] = call.prompt_estimated
        if obs.response_model:
            attrs[sc.GEN_AI_RESPONSE_MODEL] = obs.response_model
        if obs.finish_reasons:
            attrs[sc.GEN_AI_RESPONSE_FINISH_REASONS] = obs.finish_reasons
        u = obs.usage
        if u is not None and isinstance(u.input_tokens, int) and call.prompt_tokens is not None:
            # the upstream's count wins; the gap shows how far the offline estimate was off
            attrs[sc.PROMPT_TOKENS_DELTA] = u.input_tokens - call.prompt_tokens
        if u is not None:
            for key, value in (
                (sc.GEN_AI_USAGE_INPUT_TOKENS, u.input_tokens),
                (sc.GEN_AI_USAGE_OUTPUT_TOKENS, u.output_tokens),
                (sc.GEN_AI_USAGE_CACHED_INPUT_TOKENS, u.cached_input_tokens),
                (sc.GEN_AI_USAGE_REASONING_TOKENS, u.reasoning_tokens),
                (sc.GEN_AI_USAGE_CACHE_WRITE_TOKENS, u.cache_write_tokens),
            ):
                if isinstance(value, int):
                    attrs[key] = value
        if self.settings.telemetry.capture_content:
            attrs.update(self._content(call, obs))
        parse_error = call.parse_error or obs.parse_error
        if parse_error:
            attrs[sc.PARSE_ERROR] = parse_error[:300]
        if obs.unread:
            attrs[sc.RESPONSE_UNREAD] = obs.unread
        span.set_attributes(attrs)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 14)] + "...[truncated]"
