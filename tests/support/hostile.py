"""An upstream that answers as a hostile or broken service would: gzip bombs, an SSE event that never
ends, and (for comparison) a large, well-formed stream. Serve it with `serve_in_thread`.

Routes (POST): `/search` answers a buffered JSON bomb (`x-hostile: bomb`) or small results;
`/v1/chat/completions` answers by `x-hostile`: `bomb` (gzip SSE), `endless` (one 20 MB event, no
blank line), `normal` (20 MB of ordinary chat-completion events).
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import orjson

from .asgi import read_body, serve_lifespan

BOMB_INFLATED = 512 * 1024 * 1024  # what the bomb decompresses to
STREAM_BYTES = 20 * 1024 * 1024
_PIECE = 64 * 1024


@functools.cache
def gzip_bomb() -> bytes:
    """BOMB_INFLATED zero bytes, gzip-compressed (about 0.5 MB)."""
    z = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    block = bytes(1024 * 1024)
    parts = [z.compress(block) for _ in range(BOMB_INFLATED // len(block))]
    parts.append(z.flush())
    return b"".join(parts)


def chat_event(i: int) -> bytes:
    doc = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o-mini",
           "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}
    return b"data: " + orjson.dumps(doc) + b"\n\n"


@functools.cache
def normal_stream() -> tuple[bytes, int]:
    """About STREAM_BYTES of chat-completion events ending with usage and [DONE]; (body, events)."""
    parts, size, i = [], 0, 0
    while size < STREAM_BYTES:
        event = chat_event(i)
        parts.append(event)
        size += len(event)
        i += 1
    usage = {"id": "c", "object": "chat.completion.chunk", "model": "gpt-4o-mini", "choices": [],
             "usage": {"prompt_tokens": 5, "completion_tokens": i, "total_tokens": 5 + i}}
    parts += [b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n"]
    return b"".join(parts), i


class HostileUpstream:
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        if await read_body(receive) is None:
            return
        kind = dict(scope["headers"]).get(b"x-hostile", b"").decode()
        if scope["path"] == "/search":
            if kind == "bomb":
                body = gzip_bomb()
                return await _answer(send, body, b"application/json", [(b"content-encoding", b"gzip")])
            body = orjson.dumps({"results": [{"id": "d1", "text": "refunds take 30 days", "score": 0.9,
                                              "metadata": {"groups": ["public"]}}]})
            return await _answer(send, body, b"application/json", [])
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), *([(b"content-encoding", b"gzip")] if kind == "bomb" else [])]})
        if kind == "bomb":
            body = gzip_bomb()
        elif kind == "endless":
            body = b"data: " + b"x" * STREAM_BYTES
        else:
            body = normal_stream()[0]
        for i in range(0, len(body), _PIECE):
            await send({"type": "http.response.body", "body": body[i:i + _PIECE], "more_body": True})
        await send({"type": "http.response.body", "body": b""})


async def _answer(send: Any, body: bytes, content_type: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(body)).encode()), *extra]})
    await send({"type": "http.response.body", "body": body})
