"""Fake vendor back-ends for SDK tests, as one tiny ASGI app answering from tests/fixtures:
Anthropic Messages (JSON and SSE), OpenAI Responses (JSON and SSE), Cohere v2 rerank, TEI rerank,
and a Qdrant REST endpoint (server info, points query/search) with a small in-memory collection.

It records each request (path, headers, body) so tests can check the bytes arrived unchanged.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import orjson

from support.adapter_fixtures import FIXTURES

from .asgi import read_body, serve_lifespan

_QDRANT = re.compile(r"^/collections/([^/]+)/points/(query|search)$")
# Qdrant collection: id -> (vector, payload)
POINTS: dict[int, tuple[list[float], dict[str, Any]]] = {
    1: ([1.0, 0.0, 0.0], {"text": "Paris is the capital of France.", "source": "geo", "groups": ["public"]}),
    2: ([0.0, 1.0, 0.0], {"text": "Berlin is the capital of Germany.", "source": "geo", "groups": ["eu"]}),
    3: ([0.7, 0.7, 0.0], {"text": "Both cities have rivers: the Seine and the Spree.", "source": "rivers"}),
    4: ([0.0, 0.0, 1.0], {"text": "Canberra is the capital of Australia.", "source": "geo", "groups": ["public"]}),
}


def _fixture(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((FIXTURES / name).read_bytes())
    return doc


class FakeBackends:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        body = await read_body(receive)
        if body is None:
            return
        path: str = scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        with self.lock:
            self.requests.append({"path": path, "method": scope["method"], "headers": headers, "body": body})
        try:
            doc: Any = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            return await _json(send, 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                      "message": "body is not JSON"}})
        stream = isinstance(doc, dict) and doc.get("stream") is True
        if path == "/v1/messages":
            if stream:
                return await _sse(send, (FIXTURES / "anthropic_messages_stream.sse").read_bytes())
            return await _json(send, 200, _fixture("anthropic_messages.json")["response"])
        if path == "/v1/responses":
            if stream:
                return await _sse(send, (FIXTURES / "openai_responses_stream.sse").read_bytes())
            return await _json(send, 200, _fixture("openai_responses.json")["response"])
        if path in ("/v1/rerank", "/v2/rerank"):
            fx = _fixture("cohere_rerank_v2.json")["response"]
            n = len(doc.get("documents") or [])
            results = [r for r in fx["results"] if r["index"] < n][: doc.get("top_n") or n]
            return await _json(send, 200, {**fx, "results": results})
        if path == "/rerank":
            texts = doc.get("texts") or []
            return await _json(send, 200, [{"index": i, "score": round(1 - i / 10, 3)} for i in range(len(texts))])
        if path == "/" and scope["method"] == "GET":
            return await _json(send, 200, {"title": "qdrant - vector search engine", "version": "1.15.0"})
        m = _QDRANT.match(path)
        if m:
            return await _json(send, 200, _qdrant(doc, m.group(2)), extra=[(b"x-index-version", b"idx-3")])
        return await _json(send, 404, {"error": "no such fake route", "path": path})


def _qdrant(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    q = doc.get("query") if kind == "query" else doc.get("vector")
    if isinstance(q, dict):
        q = q.get("nearest", q.get("vector"))
    vec = q if isinstance(q, list) else [0.0, 0.0, 0.0]
    limit = int(doc.get("limit") or 10)
    scored = sorted(((sum(a * b for a, b in zip(vec, v, strict=False)), pid, payload)
                     for pid, (v, payload) in POINTS.items()), key=lambda t: -t[0])[:limit]
    points = [{"id": pid, "version": 1, "score": round(s, 4), "payload": payload} for s, pid, payload in scored]
    result: Any = {"points": points} if kind == "query" else points
    return {"result": result, "status": "ok", "time": 0.0001}


async def _json(send: Any, status: int, doc: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = orjson.dumps(doc)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": payload})


async def _sse(send: Any, raw: bytes) -> None:
    """Send the fixture in awkward 7-byte pieces, as a slow network would."""
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
    for i in range(0, len(raw), 7):
        await send({"type": "http.response.body", "body": raw[i:i + 7], "more_body": True})
        if i % 140 == 0:
            await asyncio.sleep(0)
    await send({"type": "http.response.body", "body": b""})
