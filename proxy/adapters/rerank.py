"""Rerank adapters: `cohere` (Cohere v1/v2 `/rerank`; Jina and vLLM speak the same shape) and
`tei` (Hugging Face text-embeddings-inference `/rerank`).

A rerank Call carries the query, the candidate count (`documents`), `top_k` (top_n) and, in
`prompt_texts`, the query followed by each candidate's text, so results can name their text.
Results become chunks: id = the candidate's index (or its own id), score = relevance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from ..model import Call, Chunk
from .base import (
    BufferedJsonObserver,
    NullObserver,
    Observer,
    UpstreamInfo,
    json_body,
    no_cap_output,
    no_finish,
    no_stream_end,
    safe_parse,
)
from .fields import as_float, as_int, as_str, json_text


def _doc_text(d: Any) -> str:
    """A candidate: a string, {"text": ...} or a structured document (Cohere v1 / Jina)."""
    if isinstance(d, str):
        return d
    if isinstance(d, dict) and isinstance(d.get("text"), str):
        return str(d["text"])
    return json_text(d)


class _RerankAdapter:
    error_style = "plain"
    reject_status = 429  # TEI clients: the usual status, with x-should-retry: false
    reads_body = True
    credential_headers: tuple[str, ...] = ("authorization",)  # Cohere and TEI: Bearer
    stream_end = staticmethod(no_stream_end)
    finish = staticmethod(no_finish)
    cap_output = staticmethod(no_cap_output)
    texts_key = "documents"  # request: the candidate list
    results_key = "results"  # response: the ranked list ("" = the body itself)
    score_key = "relevance_score"

    def __init__(self, upstream: UpstreamInfo) -> None:
        self.upstream = upstream

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call:
        if method != "POST" or not path.rstrip("/").endswith("/rerank"):
            return Call(operation="other")
        doc, error = json_body(body)
        call = Call(operation="rerank", parse_error=error)
        if doc is None:
            return call
        return safe_parse(call, self.read, doc)

    def read(self, doc: dict[str, Any], call: Call) -> None:
        call.model = as_str(doc.get("model"))
        call.query = as_str(doc.get("query"))
        docs = doc.get(self.texts_key)
        docs = docs if isinstance(docs, list) else []
        call.documents = len(docs)
        call.top_k = as_int(doc.get("top_n"))
        call.prompt_texts = [call.query or ""] + [_doc_text(d) for d in docs]

    def empty_result(self, path: str) -> bytes | None:
        """No ranked documents: `{"results": []}` (or `[]` where the ranked list is the body)."""
        return orjson.dumps({self.results_key: []} if self.results_key else [])

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> Observer:
        if call.operation != "rerank" or status >= 400:
            return NullObserver()
        return RerankObserver(call.prompt_texts[1:], self.results_key, self.score_key)


class CohereRerankAdapter(_RerankAdapter):
    name = "cohere"
    reject_status = 402  # the Cohere SDK retries 429 (and 408, 409, 5xx) whatever the headers say


class TeiRerankAdapter(_RerankAdapter):
    """TEI: `{"query", "texts", "return_text"}` -> `[{"index", "score", "text"?}]`."""

    name = "tei"
    texts_key = "texts"
    results_key = ""
    score_key = "score"


class RerankObserver(BufferedJsonObserver):
    def __init__(self, candidates: list[str], results_key: str, score_key: str) -> None:
        super().__init__()
        self._candidates = candidates
        self._results_key = results_key
        self._score_key = score_key

    def read(self, doc: Any) -> None:
        obs = self.observation
        results = doc if not self._results_key else doc.get(self._results_key)
        if not isinstance(results, list):
            obs.parse_error = "rerank response has no results list"
            return
        if isinstance(doc, dict):
            obs.response_model = as_str(doc.get("model"))
        chunks: list[Chunk] = []
        for r in results:
            if not isinstance(r, dict):
                continue
            index = as_int(r.get("index"))
            text = r.get("text")
            if text is None and isinstance(r.get("document"), (dict, str)):
                text = _doc_text(r["document"])
            if text is None and index is not None and 0 <= index < len(self._candidates):
                text = self._candidates[index]
            chunks.append(Chunk(id=str(index) if index is not None else str(len(chunks)),
                                text=text if isinstance(text, str) else "",
                                score=as_float(r.get(self._score_key))))
        obs.chunks = chunks
