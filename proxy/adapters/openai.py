"""`openai`: the OpenAI HTTP API (and the many servers that speak it: vLLM, Ollama, LiteLLM, ...).

Dispatches on the path suffix: `/chat/completions` today; other endpoints are read as `other`.
Streams are read event by event as they pass; nothing is held back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ..config import UpstreamConfig
from ..model import Call, Observation, Usage
from .base import BufferedJsonObserver, NullObserver, SseReader, json_body


class OpenAIAdapter:
    name = "openai"
    error_style = "openai"
    reads_body = True

    def __init__(self, upstream: UpstreamConfig) -> None:
        self.upstream = upstream

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call:
        if method != "POST" or not path.endswith("/chat/completions"):
            return Call(operation="other")
        doc, error = json_body(body)
        call = Call(operation="chat", parse_error=error)
        if doc is None:
            return call
        model = doc.get("model")
        call.model = model if isinstance(model, str) else None
        call.stream = doc.get("stream") is True
        limit = doc.get("max_completion_tokens", doc.get("max_tokens"))
        if isinstance(limit, int) and not isinstance(limit, bool):
            call.max_output_tokens = limit
        return call

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> Any:
        if call.operation != "chat" or status >= 400:
            return NullObserver()
        if "text/event-stream" in headers.get("content-type", ""):
            return ChatStreamObserver()
        return ChatObserver()


def _usage(u: Any) -> Usage | None:
    if not isinstance(u, dict):
        return None
    prompt_details = u.get("prompt_tokens_details") or {}
    completion_details = u.get("completion_tokens_details") or {}
    return Usage(
        input_tokens=u.get("prompt_tokens"),
        output_tokens=u.get("completion_tokens"),
        cached_input_tokens=prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None,
        reasoning_tokens=completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None,
    )


class ChatObserver(BufferedJsonObserver):
    def read(self, doc: Any) -> None:
        obs = self.observation
        obs.response_model = doc.get("model")
        obs.usage = _usage(doc.get("usage"))
        obs.finish_reasons = [c.get("finish_reason") for c in doc.get("choices") or [] if c.get("finish_reason")]


class ChatStreamObserver:
    """Reads `chat.completion.chunk` events; usage arrives in the last chunk when requested."""

    def __init__(self) -> None:
        self.observation = Observation()
        self._sse = SseReader()

    def feed(self, chunk: bytes, end: bool) -> None:
        obs = self.observation
        for _event, data in self._sse.events(chunk):
            if data == "[DONE]":
                continue
            try:
                doc = orjson.loads(data)
                if not isinstance(doc, dict):
                    continue
                obs.response_model = doc.get("model") or obs.response_model
                if doc.get("usage"):
                    obs.usage = _usage(doc["usage"])
                for choice in doc.get("choices") or []:
                    if choice.get("finish_reason"):
                        obs.finish_reasons.append(choice["finish_reason"])
            except (orjson.JSONDecodeError, AttributeError, TypeError) as exc:
                obs.parse_error = f"unreadable stream event: {exc!r}"
