"""A fake RAG stack upstream, as a tiny ASGI app: chat (JSON and slow SSE), embeddings, retrieval,
rerank, arbitrary statuses, slow and stalled responses, gzip, header echo.

It counts what it receives (`/_stats`) and notices when a client goes away mid-stream, so tests
can assert that the proxy made (or did not make) an upstream call and closed streams promptly.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from collections import Counter
from typing import Any

import orjson

from .asgi import read_body, serve_lifespan


class UpstreamState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.stream_closed_early = 0
        self.stream_finished = 0

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.requests.clear()
            self.stream_closed_early = 0
            self.stream_finished = 0


def chat_completion(model: str, content: str = "Hello there.", prompt_tokens: int = 12,
                    completion_tokens: int = 3, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": 1700000000, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": cached_tokens},
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    }


def chat_chunks(model: str, words: list[str], include_usage: bool) -> list[bytes]:
    events = []
    for i, word in enumerate(words):
        delta = {"role": "assistant", "content": word} if i == 0 else {"content": word}
        events.append({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1700000000,
                       "model": model, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    events.append({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1700000000,
                   "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    if include_usage:
        events.append({"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 1700000000,
                       "model": model, "choices": [],
                       "usage": {"prompt_tokens": 12, "completion_tokens": len(words), "total_tokens": 12 + len(words)}})
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


class UpstreamApp:
    def __init__(self) -> None:
        self.state = UpstreamState()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            return await serve_lifespan(receive, send)
        body = await read_body(receive)
        if body is None:
            return
        path: str = scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        with self.state.lock:
            self.state.calls[path] += 1
            self.state.requests.append({"path": path, "method": scope["method"], "headers": headers, "body": body,
                                        "query": scope["query_string"].decode()})
        delay = float(headers.get("x-test-delay", "0"))
        if path == "/_stats":
            with self.state.lock:
                doc = {"calls": dict(self.state.calls), "closed_early": self.state.stream_closed_early,
                       "finished": self.state.stream_finished}
            return await _json(send, 200, doc)
        if path.startswith("/status/"):
            return await _json(send, int(path.rsplit("/", 1)[1]), {"error": {"message": "as asked", "type": "test"}})
        if path == "/echo" or path.startswith("/echo/"):
            return await _json(send, 200, {"method": scope["method"], "path": path, "raw_path": scope["raw_path"].decode(),
                                           "http_version": scope.get("http_version"),
                                           "query": scope["query_string"].decode(), "headers": headers,
                                           "body": body.decode("utf-8", "replace")},
                               extra=[(b"set-cookie", b"upstream=1; Path=/"), (b"x-upstream", b"yes")])
        if path == "/slow":
            await asyncio.sleep(delay or 5)
            return await _json(send, 200, {"slow": True})
        if path == "/gzip":
            payload = gzip.compress(orjson.dumps(chat_completion("gpt-4o-mini")))
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"), (b"content-encoding", b"gzip"),
                                    (b"content-length", str(len(payload)).encode())]})
            return await send({"type": "http.response.body", "body": payload})
        if path == "/big":
            size = int(scope["query_string"].decode().partition("=")[2] or 10_000_000)
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", str(size).encode())]})
            block = b"x" * 65536
            sent = 0
            while sent < size:
                n = min(len(block), size - sent)
                await send({"type": "http.response.body", "body": block[:n], "more_body": True})
                sent += n
            return await send({"type": "http.response.body", "body": b""})
        if path.endswith("/chat/completions"):
            doc = orjson.loads(body or b"{}")
            model = doc.get("model", "gpt-4o-mini")
            if doc.get("stream"):
                words = ["Hel", "lo", " the", "re", "."] if "x-test-words" not in headers else \
                    headers["x-test-words"].split(",")
                include = bool((doc.get("stream_options") or {}).get("include_usage"))
                stall = headers.get("x-test-stall") == "1"
                return await self._stream(receive, send, chat_chunks(model, words, include), delay, stall)
            await asyncio.sleep(delay)
            return await _json(send, 200, chat_completion(model, headers.get("x-test-answer", "Hello there."),
                                                          cached_tokens=int(headers.get("x-test-cached", "0"))))
        if path.endswith("/embeddings"):
            doc = orjson.loads(body or b"{}")
            inputs = doc.get("input")
            inputs = [inputs] if isinstance(inputs, str) else (inputs or [])
            data = [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]} for i in range(len(inputs))]
            return await _json(send, 200, {"object": "list", "data": data, "model": doc.get("model", "e"),
                                           "usage": {"prompt_tokens": 4 * len(inputs), "total_tokens": 4 * len(inputs)}})
        if path == "/search":
            doc = orjson.loads(body or b"{}")
            q = str(doc.get("query", ""))
            k = int(doc.get("top_k", 3))
            # ids from a stable hash of the query: hash() is salted per process, and `% 97` of it gave
            # two different queries the same chunk ids in about one run in a hundred
            qid = f"{zlib.crc32(q.encode()):08x}"
            results = [{"id": f"doc-{qid}-{i}", "text": f"chunk {i} about {q}", "score": 0.9 - i * 0.1,
                        "metadata": {"groups": ["public"]}} for i in range(k)]
            return await _json(send, 200, {"results": results}, extra=[(b"x-index-version", b"v1")])
        if path.endswith("/rerank"):
            doc = orjson.loads(body or b"{}")
            docs = doc.get("documents") or []
            results = [{"index": i, "relevance_score": 1.0 - i / 10} for i in range(len(docs))]
            return await _json(send, 200, {"id": "rr", "results": results[: doc.get("top_n") or len(results)]})
        return await _json(send, 404, {"error": "no such test route", "path": path})

    async def _stream(self, receive: Any, send: Any, events: list[bytes], delay: float, stall: bool) -> None:
        async def produce() -> None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
            for i, event in enumerate(events):
                await send({"type": "http.response.body", "body": event, "more_body": True})
                if stall and i == 1:
                    await asyncio.sleep(3600)
                if delay:
                    await asyncio.sleep(delay)
            await send({"type": "http.response.body", "body": b""})

        producer = asyncio.ensure_future(produce())
        watcher = asyncio.ensure_future(receive())
        done, _ = await asyncio.wait({producer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if producer in done:
            watcher.cancel()
            with self.state.lock:
                self.state.stream_finished += 1
            return
        producer.cancel()  # the client went away mid-stream
        with self.state.lock:
            self.state.stream_closed_early += 1


async def _json(send: Any, status: int, doc: Any, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    payload = orjson.dumps(doc)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                            *(extra or [])]})
    await send({"type": "http.response.body", "body": payload})
