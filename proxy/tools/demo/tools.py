"""The agent's tools, `retrieve` and `rerank`, as HTTP calls through ragtoll (httpx lives here only).

A refused call (budget exhausted, upstream down) becomes `{"error": message}`: the tool result the
LLM reads, as an agent framework would hand a tool failure back to the model.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson

SPECS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "retrieve",
            "description": "Search the document index; returns chunks with id, text and score.",
            "parameters": {
                "type": "object",
                "required": ["query"],
                "properties": {
                    "query": {"type": "string"},
                    "top_k": {"type": "integer", "minimum": 1, "maximum": 50},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "rerank",
            "description": "Rerank chunks returned by retrieve for a query; returns the best ones.",
            "parameters": {
                "type": "object",
                "required": ["query", "ids"],
                "properties": {
                    "query": {"type": "string"},
                    "ids": {"type": "array", "items": {"type": "string"}},
                    "top_n": {"type": "integer", "minimum": 1},
                },
            },
        },
    },
]


class Tools:
    """Tool calls of one task; `received` lists every chunk id a response handed to the agent."""

    def __init__(self, http: httpx.Client, base_url: str, headers: dict[str, str]) -> None:
        self.http = http
        self.base = base_url.rstrip("/")
        self.headers = headers
        self.texts: dict[str, str] = {}
        self.received: list[str] = []

    def call(self, name: str, arguments: str) -> dict[str, Any]:
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return {"error": "tool arguments are not JSON"}
        if name == "retrieve":
            return self.retrieve(str(args.get("query", "")), int(args.get("top_k") or 6))
        if name == "rerank":
            return self.rerank(
                str(args.get("query", "")),
                [str(i) for i in args.get("ids") or []],
                int(args.get("top_n") or 3),
            )
        return {"error": f"no tool named {name!r}"}

    def _post(self, path: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
        try:
            resp = self.http.post(
                self.base + path,
                content=orjson.dumps(body),
                headers={**self.headers, "content-type": "application/json"},
            )
        except httpx.HTTPError as exc:
            return None, f"{path} failed: {type(exc).__name__}"
        try:
            doc = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            doc = {}
        if resp.status_code >= 400:
            err = doc.get("error") if isinstance(doc, dict) else None
            message = err.get("message") if isinstance(err, dict) else (err or resp.text[:300])
            return None, f"HTTP {resp.status_code}: {message}"
        return (doc if isinstance(doc, dict) else {}), None

    def retrieve(self, query: str, top_k: int) -> dict[str, Any]:
        doc, error = self._post("/docs/search", {"query": query, "top_k": top_k})
        if doc is None:
            return {"error": error}
        chunks = []
        for r in doc.get("results") or []:
            cid = str(r.get("id"))
            self.texts[cid] = str(r.get("text", ""))
            self.received.append(cid)
            chunks.append({"id": cid, "text": self.texts[cid], "score": r.get("score")})
        return {"chunks": chunks}

    def rerank(self, query: str, ids: list[str], top_n: int) -> dict[str, Any]:
        known = [i for i in ids if i in self.texts]
        if not known:
            return {"error": "rerank needs chunk ids returned by retrieve"}
        doc, error = self._post(
            "/rerank/v2/rerank",
            {
                "model": "rerank-v3.5",
                "query": query,
                "top_n": top_n,
                "documents": [self.texts[i] for i in known],
            },
        )
        if doc is None:
            return {"error": error}
        ranked = []
        for r in doc.get("results") or []:
            cid = known[int(r["index"])]
            ranked.append({"id": cid, "text": self.texts[cid], "relevance": r.get("relevance_score")})
        return {"ranked": ranked}
