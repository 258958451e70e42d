"""`openai`: the OpenAI HTTP API (and the many servers that speak it: vLLM, Ollama, LiteLLM, ...).

Dispatches on the path suffix: `/chat/completions`, `/completions` (legacy), `/responses`,
`/embeddings`; anything else is `other`. Prompt tokens are counted from the request with the
model's encoding; streams are read event by event as they pass, nothing is held back.
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

_ENDPOINTS = (
    ("/chat/completions", "chat"),
    ("/completions", "text_completion"),
    ("/responses", "responses"),
    ("/embeddings", "embeddings"),
)
# Responses API status -> the finish reason the chat API would have given
_STATUS_FINISH = {"completed": "stop", "failed": "error", "cancelled": "cancelled"}
_INCOMPLETE_FINISH = {"max_output_tokens": "length", "content_filter": "content_filter"}


def endpoint(method: str, path: str) -> str | None:
    if method != "POST":
        return None
    path = path.rstrip("/")
    for suffix, kind in _ENDPOINTS:
        if path.endswith(suffix):
            return kind
    return None


class OpenAIAdapter:
    name = "openai"
    error_style = "openai"
    reject_status = 429  # the OpenAI SDK honours x-should-retry: false
    reads_body = True
    credential_headers = ("authorization", "api-key")  # Bearer; Azure OpenAI's `api-key`

    empty_result = staticmethod(no_empty_result)
    def __init__(self, upstream: UpstreamInfo) -> None:
        self.upstream = upstream

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call:
        kind = endpoint(method, path)
        if kind is None:
            return Call(operation="other")
        doc, error = json_body(body)
        call = Call(operation="chat" if kind == "responses" else kind, parse_error=error)
        if doc is None:
            return call
        safe_parse(call, _READERS[kind], doc)
        if call.model is None and "/deployments/" in path:  # Azure OpenAI names the deployment in the path
            call.model = path.split("/deployments/", 1)[1].split("/", 1)[0] or None
        return call

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> Observer:
        if call.operation == "other" or status >= 400:
            return NullObserver()
        enc, _exact = tokens.encoding_for_model(call.model)
        stream = "text/event-stream" in headers.get("content-type", "")
        if call.operation == "embeddings":
            return EmbeddingsObserver()
        # one observer each for streamed and whole bodies: chat, completions and Responses bodies
        # are told apart by their own shape, so no endpoint flag has to travel on the Call
        return ChatStreamObserver(enc) if stream else ChatObserver(enc)

    def stream_end(self, call: Call, observation: Observation, path: str, now_s: int) -> bytes:
        """A Responses stream ends with `response.incomplete` (reason max_output_tokens) repeating the
        response's id; chat and legacy completions with a last chunk whose finish_reason is `length`,
        then `[DONE]`."""
        model = observation.response_model or call.model or ""
        if path.endswith("/responses"):
            response = {"id": observation.response_id or "resp_ragtoll_budget", "object": "response",
                        "created_at": now_s, "model": model, "status": "incomplete",
                        "incomplete_details": {"reason": "max_output_tokens"}, "parallel_tool_calls": True,
                        "tool_choice": "auto", "tools": [], "error": None}
            # no `output`: the SDK's stream accumulator then fills in the items that did stream
            event = {"type": "response.incomplete", "sequence_number": 1_000_000, "response": response}
            return b"event: response.incomplete\ndata: " + orjson.dumps(event) + b"\n\n"
        if path.endswith("/completions") and not path.endswith("/chat/completions"):
            chunk = {"id": "cmpl-ragtoll-budget", "object": "text_completion", "created": now_s, "model": model,
                     "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]}
        else:
            chunk = {"id": "chatcmpl-ragtoll-budget", "object": "chat.completion.chunk", "created": now_s,
                     "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        return b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n"

    def finish(self, path: str, body: bytes, note: str | None) -> bytes | None:
        """The request made to answer now: tools disabled (`tool_choice: "none"`, `function_call:
        "none"` for the legacy functions), `note` added as a last user message. None for a request
        that generates no answer (embeddings, legacy completions, unreadable JSON)."""
        kind = endpoint("POST", path)
        doc, _error = json_body(body)
        if doc is None or kind not in ("chat", "responses"):
            return None
        if doc.get("tools"):
            doc["tool_choice"] = "none"
        if isinstance(doc.get("n"), int) and not isinstance(doc["n"], bool) and doc["n"] != 1:
            doc["n"] = 1  # one answer: the finish's allowance is for one
        if kind == "chat":
            if doc.get("functions"):
                doc["function_call"] = "none"
            if note and isinstance(doc.get("messages"), list):
                doc["messages"] = [*doc["messages"], {"role": "user", "content": note}]
        elif note:
            given = doc.get("input")
            items = given if isinstance(given, list) else [{"role": "user", "content": given}] if isinstance(given, str) else []
            doc["input"] = [*items, {"role": "user", "content": note}]
        return orjson.dumps(doc)


    def cap_output(self, path: str, body: bytes, tokens: int) -> bytes | None:
        """The request with its output cap at `tokens` per answer: the cap it named (chat's
        `max_completion_tokens` or `max_tokens`, the legacy endpoint's `max_tokens`, Responses'
        `max_output_tokens`), else the one its model reads (reasoning models only know
        `max_completion_tokens`; other chat servers all know `max_tokens`)."""
        kind = endpoint("POST", path)
        doc, _error = json_body(body)
        if doc is None or kind not in ("chat", "text_completion", "responses"):
            return None
        keys: tuple[str, ...]
        if kind == "responses":
            keys = ("max_output_tokens",)
        elif kind == "text_completion":
            keys = ("max_tokens",)
        else:
            keys = ("max_completion_tokens", "max_tokens")
        named = [k for k in keys if as_int(doc.get(k)) is not None]
        if not named:
            model = (as_str(doc.get("model")) or "").lower().rpartition("/")[2]
            named = [keys[0] if kind != "chat" or model.startswith(_REASONING_MODELS) else "max_tokens"]
        for key in named:
            doc[key] = tokens
        return orjson.dumps(doc)


# model families that take only `max_completion_tokens` (OpenAI's reasoning models)
_REASONING_MODELS = ("o1", "o3", "o4", "gpt-5")


def _common(doc: dict[str, Any], call: Call) -> None:
    call.model = as_str(doc.get("model"))
    call.stream = doc.get("stream") is True


def _limit(doc: dict[str, Any], call: Call, *keys: str) -> None:
    n = as_int(doc.get("n"))
    call.choices = n if n is not None and n > 0 else 1
    for key in keys:
        limit = as_int(doc.get(key))
        if limit is not None:
            call.max_output_tokens = limit * call.choices
            return


def _parts_text(content: Any, out: list[str]) -> None:
    """Text of a message content: a string or a list of parts (text / input_text / output_text / refusal)."""
    if isinstance(content, str):
        out.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str):
                    out.append(text)


def _tools_text(doc: dict[str, Any], out: list[str]) -> None:
    for key in ("tools", "functions"):
        for tool in doc.get(key) or []:
            if isinstance(tool, dict):
                out.append(json_text(tool.get("function", tool)))
    fmt = doc.get("response_format")
    if isinstance(fmt, dict) and fmt.get("json_schema"):
        out.append(json_text(fmt["json_schema"]))


def _count(call: Call, texts: list[str], messages: int) -> None:
    call.prompt_texts = texts
    call.prompt_tokens, call.prompt_estimated = tokens.count_prompt(call.model, texts, messages)


def read_chat(doc: dict[str, Any], call: Call) -> None:
    _common(doc, call)
    _limit(doc, call, "max_completion_tokens", "max_tokens")
    texts: list[str] = []
    messages = 0
    for m in doc.get("messages") or []:
        if not isinstance(m, dict):
            continue
        messages += 1
        _parts_text(m.get("content"), texts)
        if m.get("role") == "user":
            parts: list[str] = []
            _parts_text(m.get("content"), parts)
            call.user_text = " ".join(parts) or call.user_text
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict):
                texts.append(f"{fn.get('name') or ''}{json_text(fn.get('arguments') or '')}")
        fc = m.get("function_call")
        if isinstance(fc, dict):
            texts.append(f"{fc.get('name') or ''}{json_text(fc.get('arguments') or '')}")
    _tools_text(doc, texts)
    _count(call, texts, messages)


def read_completion(doc: dict[str, Any], call: Call) -> None:
    _common(doc, call)
    _limit(doc, call, "max_tokens")
    if call.max_output_tokens is None:
        call.max_output_tokens = 16 * call.choices  # the legacy endpoint's documented default
    _count_inputs(doc.get("prompt"), call)


def _count_inputs(value: Any, call: Call) -> int:
    """Count a string, list of strings, token array or list of token arrays; returns how many inputs."""
    if isinstance(value, str) or _is_token_array(value):
        value = [value]
    items = value if isinstance(value, list) else []
    _count(call, [x for x in items if isinstance(x, str)], 0)
    call.prompt_tokens = (call.prompt_tokens or 0) + sum(len(x) for x in items if isinstance(x, list))
    return len(items)


def _is_token_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, int) for x in v)


def read_responses(doc: dict[str, Any], call: Call) -> None:
    _common(doc, call)
    _limit(doc, call, "max_output_tokens")
    texts: list[str] = []
    messages = 0
    if isinstance(doc.get("instructions"), str):
        texts.append(doc["instructions"])
        messages += 1
    inp = doc.get("input")
    if isinstance(inp, str):
        texts.append(inp)
        messages += 1
    for item in inp if isinstance(inp, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message" or "role" in item:
            messages += 1
            _parts_text(item.get("content"), texts)
        elif kind == "function_call":
            texts.append(f"{item.get('name') or ''}{json_text(item.get('arguments') or '')}")
        elif kind == "function_call_output":
            texts.append(json_text(item.get("output") or ""))
        elif kind == "reasoning":
            _parts_text(item.get("summary"), texts)
    _tools_text(doc, texts)
    fmt = (doc.get("text") or {}).get("format") if isinstance(doc.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("schema"):
        texts.append(json_text(fmt["schema"]))
    _count(call, texts, messages)


def read_embeddings(doc: dict[str, Any], call: Call) -> None:
    _common(doc, call)
    call.inputs = _count_inputs(doc.get("input"), call)


_READERS = {"chat": read_chat, "text_completion": read_completion, "responses": read_responses,
            "embeddings": read_embeddings}


def usage(u: Any) -> Usage | None:
    """Chat / completions / embeddings usage (prompt_tokens...) or Responses usage (input_tokens...)."""
    if not isinstance(u, dict):
        return None
    pd = u.get("prompt_tokens_details") or u.get("input_tokens_details") or {}
    cd = u.get("completion_tokens_details") or u.get("output_tokens_details") or {}
    inp = u.get("prompt_tokens", u.get("input_tokens"))
    out = u.get("completion_tokens", u.get("output_tokens"))
    return Usage(
        input_tokens=as_int(inp),
        output_tokens=as_int(out),
        cached_input_tokens=as_int(pd.get("cached_tokens")) if isinstance(pd, dict) else None,
        reasoning_tokens=as_int(cd.get("reasoning_tokens")) if isinstance(cd, dict) else None,
    )


def _read_response(obs: Observation, r: Any) -> None:
    obs.response_model = as_str(r.get("model")) or obs.response_model
    obs.response_id = obs.response_id or as_str(r.get("id"))
    if r.get("usage"):
        obs.usage = usage(r["usage"])
    status = r.get("status")
    reason = as_str((r.get("incomplete_details") or {}).get("reason")) or "incomplete"
    if status == "incomplete":
        obs.finish_reasons = [_INCOMPLETE_FINISH.get(reason, reason)]
    elif status in _STATUS_FINISH:
        called = any(isinstance(o, dict) and o.get("type") == "function_call" for o in r.get("output") or [])
        obs.finish_reasons = ["tool_calls" if called and status == "completed" else _STATUS_FINISH[status]]


class ChatObserver(BufferedJsonObserver):
    """Non-streamed chat, legacy completion or Responses API body."""

    def __init__(self, encoding: str) -> None:
        super().__init__()
        self._encoding = encoding

    def read(self, doc: Any) -> None:
        if doc.get("object") == "response":
            return self._read_responses(doc)
        obs = self.observation
        obs.response_model = as_str(doc.get("model"))
        obs.usage = usage(doc.get("usage"))
        texts: list[str] = []
        for c in doc.get("choices") or []:
            if c.get("finish_reason"):
                obs.finish_reasons.append(c["finish_reason"])
            msg = c.get("message") or {}
            _parts_text(msg.get("content"), texts)
            for key in ("refusal", "reasoning", "reasoning_content"):
                if isinstance(msg.get(key), str):
                    texts.append(msg[key])
            if isinstance(c.get("text"), str):
                texts.append(c["text"])
            for tc in msg.get("tool_calls") or []:
                texts.append(json_text((tc.get("function") or {}).get("arguments") or ""))
        for text in texts:
            obs.keep_output(text)
        if obs.usage is None or obs.usage.output_tokens is None:  # counted only when usage is missing
            obs.output_tokens_seen = tokens.count_many(texts, self._encoding)

    def _read_responses(self, doc: Any) -> None:
        _read_response(self.observation, doc)
        u = self.observation.usage
        if u is None or u.output_tokens is None:
            texts: list[str] = []
            for item in doc.get("output") or []:
                _parts_text(item.get("content"), texts)
                if isinstance(item.get("arguments"), str):
                    texts.append(item["arguments"])
            self.observation.output_tokens_seen = tokens.count_many(texts, self._encoding)


# chat delta fields that are not generated text
_DELTA_META = frozenset({"role", "index", "id", "type", "name", "logprobs", "obfuscation"})
_TOOL_META = frozenset({"index", "id", "type"})
# Responses API `.delta` events whose delta is not text (audio bytes)
_NOT_TEXT_DELTAS = frozenset({"response.audio.delta"})


class ChatStreamObserver(JsonStreamObserver):
    """`chat.completion.chunk` (or legacy `text_completion`) events - usage arrives in the last one
    when `stream_options.include_usage` asked for it - or Responses API semantic events."""

    _DELTAS = frozenset({"response.output_text.delta", "response.function_call_arguments.delta",
                         "response.reasoning_summary_text.delta", "response.refusal.delta",
                         "response.reasoning_text.delta"})
    _FINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "response.created",
                        "response.in_progress"})

    def on_event(self, event: str, doc: dict[str, Any]) -> None:
        kind = doc.get("type")
        if isinstance(kind, str) and (kind.startswith("response.") or kind == "error"):
            return self._on_responses_event(kind, doc)
        obs = self.observation
        obs.response_model = as_str(doc.get("model")) or obs.response_model
        if doc.get("usage"):
            obs.usage = usage(doc["usage"])
        for choice in doc.get("choices") or []:
            delta = choice.get("delta") or {}
            if isinstance(delta, dict):
                self._delta(delta)
            self.saw_output(choice.get("text"))
            if choice.get("finish_reason"):
                obs.finish_reasons.append(choice["finish_reason"])

    def _delta(self, delta: dict[str, Any]) -> None:
        """Every text a chat delta carries is output: content, refusal (OpenAI), reasoning
        (OpenRouter and others), reasoning_content (vLLM, DeepSeek), tool and function call
        arguments, an audio transcript; a field not known here counted by its text all the same."""
        for key, value in delta.items():
            if key in _DELTA_META or value is None:
                continue
            if key == "reasoning_details" and isinstance(delta.get("reasoning"), str):
                continue  # OpenRouter sends the reasoning twice: as text and as details
            if key == "function_call" and isinstance(value, dict):  # the legacy functions API
                self.saw_output(value.get("name"))
                self.saw_output(value.get("arguments"))
            elif key == "tool_calls" and isinstance(value, list):
                for tc in value:
                    fn = tc.get("function") if isinstance(tc, dict) else None
                    if isinstance(fn, dict):
                        self.saw_output(fn.get("name"))
                        self.saw_output(fn.get("arguments"))
                    elif isinstance(tc, dict):
                        self.saw_unknown(tc, _TOOL_META)
            elif key == "audio" and isinstance(value, dict):
                self.saw_output(value.get("transcript"))  # `data` is audio, not text
            elif isinstance(value, str):
                self.saw_output(value)
            else:
                self.saw_unknown(value, _DELTA_META)

    def _on_responses_event(self, kind: str, doc: dict[str, Any]) -> None:
        if kind in self._DELTAS or (kind.endswith(".delta") and kind not in _NOT_TEXT_DELTAS):
            self.saw_output(doc.get("delta"))  # any text delta: one not named here counts all the same
        elif kind in self._FINAL and isinstance(doc.get("response"), dict):
            _read_response(self.observation, doc["response"])
        elif kind == "error":
            self.observation.finish_reasons = ["error"]


class EmbeddingsObserver(BufferedJsonObserver):
    def read(self, doc: Any) -> None:
        self.observation.response_model = as_str(doc.get("model"))
        self.observation.usage = usage(doc.get("usage"))
