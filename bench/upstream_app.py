"""The loopback upstream the benchmarks call: chat JSON, retrieval JSON, a paced SSE stream,
and an OTLP sink (so ragtoll's tracing exports for real). Raw ASGI, as cheap as it gets."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

CHAT = json.dumps({
    "id": "chatcmpl-b", "object": "chat.completion", "created": 1700000000, "model": "gpt-4o-mini",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "The refund window is 30 days."},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 42, "completion_tokens": 9, "total_tokens": 51},
}).encode()
SEARCH = json.dumps({"results": [
    {"id": f"doc-{i}", "text": f"Chunk {i}: annual plans can be refunded within 30 days.", "score": 0.9 - i / 20,
     "metadata": {"groups": ["public"]}} for i in range(5)]}).encode()
EVENTS = [b'data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,'
          b'"delta":{"content":"w%d"},"finish_reason":null}]}\n\n' % i for i in range(5)] + [
    (b'data: {"id":"c","object":"chat.completion.chunk","model":"gpt-4o-mini","choices":[{"index":0,"delta":{},'
     b'"finish_reason":"stop"}],"usage":{"prompt_tokens":42,"completion_tokens":5,"total_tokens":47}}\n\n'),
    b"data: [DONE]\n\n"]
STREAM_GAP_S = float(os.environ.get("UPSTREAM_STREAM_GAP_S", "0.02"))  # bench_tail paces faster


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            while True:
                m = await receive()
                await send({"type": m["type"] + ".complete"})
                if m["type"] == "lifespan.shutdown":
                    return
        return
    body = b""
    more = True
    while more:
        m = await receive()
        body += m.get("body", b"")
        more = m.get("more_body", False)
    path = scope["path"]
    if path.endswith("/chat/completions") and b'"stream": true' not in body and b'"stream":true' not in body:
        payload = CHAT
    elif path.endswith("/chat/completions"):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for event in EVENTS:
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await asyncio.sleep(STREAM_GAP_S)
        await send({"type": "http.response.body", "body": b""})
        return
    elif path == "/search":
        payload = SEARCH
    else:
        payload = b"{}"
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
