"""`anthropic`: the Anthropic Messages API (`POST /v1/messages`), streamed and not.

Claude's tokenizer is not public, so prompt tokens are an o200k estimate marked estimated; the
response's usage settles the truth. Usage maps to the OpenAI meaning: `input_tokens` counts the
whole prompt (uncached + cache reads + cache writes), `cached_input_tokens` the cache reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ..core import tokens
from ..model import Call, Observation, Usage
from .base import (
    BufferedJsonObserver,
    JsonStreamObserver,
    NullObserver,
    Observer,
    UpstreamInfo,
    json_body,
    no_empty_result,
    safe_parse,
)
from .fields import as_int, as_str, json_text


class AnthropicAdapter:
    name = "anthropic"
    error_style = "anthropic"
    reject_status = 429  # the Anthropic SDK honours x-should-retry: false
    reads_body = True
    credential_headers = ("x-api-key", "authorization")  # the API key; else an OAuth Bearer token

    empty_result = staticmethod(no_empty_result)
    def __init__(self, upstream: UpstreamInfo) -> None:
        self.upstream = upstream

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call:
        if method != "POST" or not path.rstrip("/").endswith("/messages"):
            return Call(operation="other")  # count_tokens, models, batches: forwarded, not counted
        doc, error = json_body(body)
        call = Call(operation="chat", parse_error=error)
        if doc is None:
            return call
        return safe_parse(call, read_messages, doc)

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> Observer:
        if call.operation != "chat" or status >= 400:
            return NullObserver()
        enc, _exact = tokens.encoding_for_model(call.model)
        if "text/event-stream" in headers.get("content-type", ""):
            return MessagesStreamObserver(enc)
        return MessagesObserver()

    def stream_end(self, call: Call, observation: Observation, path: str, now_s: int) -> bytes:
        """`message_delta` with stop_reason max_tokens and the output so far, then `message_stop`."""
        delta = {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                 "usage": {"output_tokens": observation.output_tokens_seen}}
        return (b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n"
                b"event: message_stop\ndata: " + orjson.dumps({"type": "message_stop"}) + b"\n\n")

    def finish(self, path: str, body: bytes, note: str | None) -> bytes | None:
        """The request made to answer now: `tool_choice: {"type": "none"}` (the tools stay defined:
        the transcript's tool_use blocks need them), `note` added to the last user turn."""
        doc, _error = json_body(body)
        if doc is None or not path.rstrip("/").endswith("/messages"):
            return None
        if doc.get("tools"):
            doc["tool_choice"] = {"type": "none"}
        messages = doc.get("messages")
        if note and isinstance(messages, list):
            last = messages[-1] if messages else None
            if isinstance(last, dict) and last.get("role") == "user":
                content = last.get("content")
                blocks = content if isinstance(content, list) else [{"type": "text", "text": content}] if isinstance(content, str) else []
                messages[-1] = {**last, "content": [*blocks, {"type": "text", "text": note}]}
            else:
                messages.append({"role": "user", "content": note})
        return orjson.dumps(doc)


    def cap_output(self, path: str, body: bytes, tokens: int) -> bytes | None:
        """The request with `max_tokens` at `tokens`; an extended-thinking budget (which must stay
        below max_tokens and at 1024 or more) lowered to fit, or thinking turned off when it cannot."""
        doc, _error = json_body(body)
        if doc is None or not path.rstrip("/").endswith("/messages"):
            return None
        doc["max_tokens"] = tokens
        thinking = doc.get("thinking")
        budget = as_int(thinking.get("budget_tokens")) if isinstance(thinking, dict) else None
        if budget is not None and budget >= tokens:
            if tokens - 1 >= MIN_THINKING_BUDGET:
                doc["thinking"] = {**thinking, "budget_tokens": tokens - 1}  # type: ignore[dict-item]
            else:
                doc.pop("thinking")
        return orjson.dumps(doc)


MIN_THINKING_BUDGET = 1024  # the Messages API's smallest thinking.budget_tokens


def _blocks_text(content: Any, out: list[str]) -> None:
    """Text of a content: a string or blocks (text, tool_use input, tool_result content, thinking,
    document text sources). Images and other binary sources are not counted."""
    if isinstance(content, str):
        out.append(content)
        return
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            out.append(block["text"])
        elif kind == "tool_use":
            out.append(f"{block.get('name') or ''}{json_text(block.get('input') or {})}")
        elif kind == "tool_result":
            _blocks_text(block.get("content"), out)
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            out.append(block["thinking"])
        elif kind == "document":
            source = block.get("source") or {}
            if isinstance(source, dict) and source.get("type") == "text" and isinstance(source.get("data"), str):
                out.append(source["data"])
            elif isinstance(source, dict) and source.get("type") == "content":
                _blocks_text(source.get("content"), out)


def read_messages(doc: dict[str, Any], call: Call) -> None:
    call.model = as_str(doc.get("model"))
    call.stream = doc.get("stream") is True
    call.max_output_tokens = as_int(doc.get("max_tokens"))
    texts: list[str] = []
    messages = 0
    system = doc.get("system")
    if system is not None:
        messages += 1
        _blocks_text(system, texts)
    for m in doc.get("messages") or []:
        if isinstance(m, dict):
            messages += 1
            _blocks_text(m.get("content"), texts)
            if m.get("role") == "user":
                parts: list[str] = []
                _blocks_text(m.get("content"), parts)
                call.user_text = " ".join(parts) or call.user_text
    for tool in doc.get("tools") or []:
        if isinstance(tool, dict):
            texts.append(json_text({k: tool[k] for k in ("name", "description", "input_schema") if k in tool}))
    call.prompt_texts = texts
    call.prompt_tokens, _exact = tokens.count_prompt(call.model, texts, messages)
    call.prompt_estimated = True  # never Claude's own tokenizer


def usage(u: Any, prev: Usage | None = None) -> Usage | None:
    """Anthropic usage; streamed `message_delta` usage is cumulative and may omit input fields."""
    if not isinstance(u, dict):
        return prev
    fresh = as_int(u.get("input_tokens"))
    read = as_int(u.get("cache_read_input_tokens"))
    write = as_int(u.get("cache_creation_input_tokens"))
    if fresh is None and read is None and write is None:
        total = prev.input_tokens if prev else None
        cached = prev.cached_input_tokens if prev else None
    else:
        total = (fresh or 0) + (read or 0) + (write or 0)
        cached = read if read is not None else (prev.cached_input_tokens if prev else None)
        if prev is not None and prev.input_tokens is not None and total < prev.input_tokens:
            total = prev.input_tokens  # counts are cumulative: a later event naming fewer parts is not less
    out = as_int(u.get("output_tokens"))
    return Usage(input_tokens=total, output_tokens=out if out is not None else (prev.output_tokens if prev else None),
                 cached_input_tokens=cached, reasoning_tokens=None)


class MessagesObserver(BufferedJsonObserver):
    def read(self, doc: Any) -> None:
        obs = self.observation
        obs.response_model = as_str(doc.get("model"))
        obs.usage = usage(doc.get("usage"))
        if doc.get("stop_reason"):
            obs.finish_reasons = [doc["stop_reason"]]
        for block in doc.get("content") or []:
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                obs.keep_output(block["text"])


# content_block_delta types -> the field holding their output text
_DELTA_TEXT = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking"}
# deltas that carry no generated text: a thinking block's signature, a citation of a source
_DELTA_NOT_OUTPUT = frozenset({"signature_delta", "citations_delta"})
_META = frozenset({"type", "id", "index", "signature", "cache_control"})


class MessagesStreamObserver(JsonStreamObserver):
    """message_start (model, input usage) -> content_block_delta (text, tool input, thinking) ->
    message_delta (stop_reason, cumulative output usage) -> message_stop."""

    def on_event(self, event: str, doc: dict[str, Any]) -> None:
        obs: Observation = self.observation
        kind = doc.get("type") or event
        if kind == "message_start":
            msg = doc.get("message") or {}
            obs.response_model = as_str(msg.get("model")) or obs.response_model
            obs.usage = usage(msg.get("usage"), obs.usage)
        elif kind == "content_block_delta":
            delta = doc.get("delta") or {}
            field = _DELTA_TEXT.get(str(delta.get("type")))
            if field is not None:
                self.saw_output(delta.get(field))
            elif delta.get("type") not in _DELTA_NOT_OUTPUT:
                self.saw_unknown(delta, _META)  # a delta type not known here: its text counts all the same
        elif kind == "content_block_start":
            block = doc.get("content_block") or {}
            kind = block.get("type")
            if kind in ("text", "thinking"):
                self.saw_output(block.get(kind))
            elif kind in ("tool_use", "server_tool_use"):
                self.saw_output(block.get("name"))
                self.saw_unknown(block.get("input"))
            elif kind == "redacted_thinking":
                self.saw_unknown(block.get("data"))  # encrypted thinking, billed as output
            elif kind is not None and not str(kind).endswith("_tool_result"):
                self.saw_unknown(block, _META)
        elif kind == "message_delta":
            stop = (doc.get("delta") or {}).get("stop_reason")
            if stop:
                obs.finish_reasons = [stop]
            obs.usage = usage(doc.get("usage"), obs.usage)
        elif kind == "error":
            obs.finish_reasons = ["error"]
