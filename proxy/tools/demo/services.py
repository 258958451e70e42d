"""The demo stack's three upstreams as small Starlette apps (served on loopback by the runner).

* retrieval: `POST /search {"query", "top_k"}` -> `{"results": [{id, text, score, metadata: {groups,
  doc, title}}]}` with header `x-index-version`; results are filtered by the caller's groups,
  read from `x-auth-groups` (set by the trusted gateway in front: here the agent via ragtoll).
* rerank: Cohere's `POST /v1/rerank` and `/v2/rerank` shape.
* llm: OpenAI `POST /v1/chat/completions` (non-streaming), replies chosen by `policy.decide`,
  with usage counted by ragtoll's own offline tokenizer.
Each app counts what it served (`.served`), for tests only; the demo's numbers come from ragtoll.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...core import tokens
from .corpus import INDEX_VERSION, PRINCIPALS, Chunk, Index
from .policy import Action, decide
from .text import overlap, sentences

MODEL = "gpt-4o"
MAX_TOP_K = 50


def _json(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


def _error(status: int, message: str) -> Response:
    return _json({"error": {"message": message, "type": "invalid_request_error"}}, status)


async def _body(request: Request) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def retrieval_app(chunks: list[Chunk]) -> Starlette:
    index = Index(chunks)
    served: Counter[str] = Counter()

    async def search(request: Request) -> Response:
        doc = await _body(request)
        if doc is None or not isinstance(doc.get("query"), str):
            return _error(400, 'body must be {"query": str, "top_k": int}')
        top_k = doc.get("top_k", 5)
        if not isinstance(top_k, int) or not 1 <= top_k <= MAX_TOP_K:
            return _error(400, f"top_k must be an integer in 1..{MAX_TOP_K}")
        header = request.headers.get("x-auth-groups", "")
        groups = [g.strip() for g in header.split(",") if g.strip()] or list(PRINCIPALS["bob"])
        served["search"] += 1
        results = [
            {
                "id": c.id,
                "text": c.text,
                "score": s,
                "metadata": {"groups": list(c.groups), "doc": c.doc, "title": c.title},
            }
            for c, s in index.search(doc["query"], groups, top_k)
        ]
        return _json({"results": results}, headers={"x-index-version": INDEX_VERSION})

    app = Starlette(routes=[Route("/search", search, methods=["POST"])])
    app.state.served = served
    return app


def rerank_score(query: str, text: str) -> float:
    """Relevance in [0, 1]: how fully the best sentence covers the query, precision breaking ties."""
    best = max((overlap(query, s) for s in sentences(text)), default=(0.0, 0.0))
    return round(0.8 * best[0] + 0.2 * best[1], 4)


def rerank_app() -> Starlette:
    served: Counter[str] = Counter()

    async def rerank(request: Request) -> Response:
        doc = await _body(request)
        if doc is None or not isinstance(doc.get("query"), str) or not isinstance(doc.get("documents"), list):
            return _json({"message": 'body must be {"query": str, "documents": [str], "top_n": int}'}, 400)
        texts = [d if isinstance(d, str) else str((d or {}).get("text", "")) for d in doc["documents"]]
        top_n = doc.get("top_n") or len(texts)
        served["rerank"] += 1
        ranked = sorted(
            ((rerank_score(doc["query"], t), i) for i, t in enumerate(texts)), key=lambda si: (-si[0], si[1])
        )
        return _json(
            {
                "id": f"rr-{served['rerank']}",
                "results": [{"index": i, "relevance_score": s} for s, i in ranked[: int(top_n)]],
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
            }
        )

    app = Starlette(
        routes=[Route("/v1/rerank", rerank, methods=["POST"]), Route("/v2/rerank", rerank, methods=["POST"])]
    )
    app.state.served = served
    return app


def _prompt_texts(body: dict[str, Any]) -> list[str]:
    texts: list[str] = []
    for m in body.get("messages") or []:
        if isinstance(m, dict):
            if isinstance(m.get("content"), str):
                texts.append(m["content"])
            for call in m.get("tool_calls") or []:
                texts.append(str((call.get("function") or {}).get("arguments", "")))
    if body.get("tools"):
        texts.append(orjson.dumps(body["tools"]).decode())
    return texts


def llm_app(policy: Callable[..., Action] = decide) -> Starlette:
    """`policy(messages, final=...)` picks each reply; the demo's scripted agent policy by default
    (bench/eval_agents passes one that dispatches on the agent's system prompt)."""
    served: Counter[str] = Counter()
    ids = itertools.count(1)

    async def chat(request: Request) -> Response:
        body = await _body(request)
        if body is None or not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "messages must be a non-empty list")
        if body.get("stream"):
            return _error(400, "the demo LLM does not stream; call it without stream=true")
        served["chat"] += 1
        final = not body.get("tools") or body.get("tool_choice") == "none"
        action = policy([m for m in body["messages"] if isinstance(m, dict)], final=final)
        n = next(ids)
        if action.answer is not None:
            message: dict[str, Any] = {"role": "assistant", "content": action.answer}
            finish, out_text = "stop", action.answer
        else:
            args = orjson.dumps(action.arguments).decode()
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": action.tool, "arguments": args},
                    }
                ],
            }
            finish, out_text = "tool_calls", f"{action.tool} {args}"
        prompt, _ = tokens.count_prompt(MODEL, _prompt_texts(body), len(body["messages"]))
        completion = tokens.count(out_text) + 3
        return _json(
            {
                "id": f"chatcmpl-demo-{n}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": MODEL,
                "system_fingerprint": "ragtoll-demo",
                "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )

    async def models(request: Request) -> Response:
        return _json(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "ragtoll-demo"}]}
        )

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
        ]
    )
    app.state.served = served
    return app
