"""A greedy model and a search engine, as one tiny ASGI app, for the budget-bound tests: every
answer is as long as the request allows, so a call's worst case is what it costs.

- OpenAI chat (`/v1/chat/completions`): a whole answer reports `completion_tokens` = its cap
  (`max_completion_tokens` or `max_tokens`, else `x-test-tokens`, else 100,000) times `n`; a stream
  sends `x-test-tokens` (default 50,000) one-token events, the text in the delta field
  `x-test-field` names (content, refusal, reasoning, reasoning_content, or any other).
- Anthropic Messages (`/v1/messages`): a whole answer reports `output_tokens` = `max_tokens`.
- Search (`/search`): for `{"query": q}` the chunks `SEARCH` holds for q, else three chunks made from
  q's text (new ids per query: an agent asking a new question gets new results each time).

It records each request's path and JSON body (`requests`).
"""

from __future__ import annotations

import threading
import zlib
from typing import Any

import orjson

from .asgi import read_body, serve_lifespan

BATCH = 200  # stream events per body message (fast enough for 50,000 tokens, still many reads)


class GreedyModel:
    def __init__(self, search: dict[str, list[tuple[str, str]]] | None = None) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.search = search or {}

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [b for p, b in self.requests if p == path]

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        raw = await read_body(receive)
        if raw is None:
            return
        path: str = scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        doc: dict[str, Any] = orjson.loads(raw or b"{}")
        with self.lock:
            self.requests.append((path, doc))
        if path == "/v1/chat/completions":
            if doc.get("stream"):
                return await self._stream(send, doc, int(headers.get("x-test-tokens", "50000")),
                                          headers.get("x-test-field", "content"))
            cap = doc.get("max_completion_tokens", doc.get("max_tokens"))
            n = int(doc.get("n") or 1)
            out = (int(cap) if cap is not None else int(headers.get("x-test-tokens", "100000"))) * n
            choices = [{"index": i, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}
                       for i in range(n)]
            return await _json(send, {"id": "c", "object": "chat.completion", "created": 0, "model": doc.get("model"),
                                      "choices": choices, "usage": {"completion_tokens": out}})
        if path == "/v1/messages":
            out = int(doc.get("max_tokens") or 0)
            return await _json(send, {"id": "msg", "type": "message", "role": "assistant", "model": doc.get("model"),
                                      "content": [{"type": "text", "text": "ok"}], "stop_reason": "max_tokens",
                                      "usage": {"output_tokens": out}})
        if path == "/search":
            q = str(doc.get("query", ""))
            found = self.search.get(q.lower())
            if found is None:
                qid = f"{zlib.crc32(q.encode()):08x}"
                found = [(f"doc-{qid}-{i}", f"{q} (part {i})") for i in range(3)]
            results = [{"id": cid, "text": text, "score": round(0.9 - 0.1 * i, 2)} for i, (cid, text) in enumerate(found)]
            return await _json(send, {"results": results})
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def _stream(self, send: Any, doc: dict[str, Any], tokens: int, field: str) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        model = doc.get("model")
        for start in range(0, tokens, BATCH):
            events = b"".join(
                b"data: " + orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
                                          "choices": [{"index": 0, "delta": {field: " hi"}, "finish_reason": None}]})
                + b"\n\n" for _ in range(min(BATCH, tokens - start)))
            await send({"type": "http.response.body", "body": events, "more_body": True})
        done = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await send({"type": "http.response.body", "body": b"data: " + orjson.dumps(done) + b"\n\ndata: [DONE]\n\n"})


async def _json(send: Any, doc: dict[str, Any]) -> None:
    payload = orjson.dumps(doc)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
