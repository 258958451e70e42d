"""Retrieval presets on the `json` machinery: `qdrant`, `chroma`, `elasticsearch` (OpenSearch
too) and `langserve`. Each sets default field paths (overridable by `fields:`), reads the parts of
its API that a path cannot express, names the body fields it understands (the rest select the
evidence: `Call.selector`) and tells searches from the other calls on its route (collection info,
upserts, counts: `other`). Query keys include the collection / index.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from ..model import Call, Chunk
from .fields import as_acl, as_float, as_id, as_int, as_str, as_vector, get_path
from .retrieval_json import JsonRetrievalAdapter, text_id


class QdrantAdapter(JsonRetrievalAdapter):
    """`POST /collections/{c}/points/search` and `/points/query` (REST)."""

    name = "qdrant"
    credential_headers = ("api-key", "authorization")  # the API key; else a Bearer (JWT RBAC)
    defaults: ClassVar[Mapping[str, str]] = {"id": "id", "score": "score", "text": "payload.text", "source": "payload.source",
                "filters": "filter", "top_k": "limit"}
    _PATH = re.compile(r"/collections/([^/]+)/points/(search|query)$")
    # searches it does not read: batches, groups, recommend, discover (retrieval calls, never cached)
    _OTHER_SEARCH = re.compile(r"/collections/[^/]+/points/(search|query|recommend|discover)(/batch|/groups)?$")

    def route_id(self, method: str, path: str) -> str | None:
        m = self._PATH.search(path)
        return f"{self.upstream.name}/{m.group(1)}" if m and method == "POST" else None

    def is_search(self, method: str, path: str) -> bool:
        return method == "POST" and self._OTHER_SEARCH.search(path) is not None

    def read_request(self, doc: dict[str, Any], call: Call) -> tuple[str, ...]:
        top_k = self.fields["top_k"]
        call.filters = doc.get("filter")
        call.top_k = as_int(doc.get(top_k))
        if call.top_k is None and "query" in doc:
            call.top_k = 10  # /points/query's documented default limit
        path = "query" if "query" in doc else "vector"
        q = doc.get(path)
        if isinstance(q, dict):  # only the part read is understood: a named vector's name, a model, stay
            if isinstance(q.get("text"), str):  # a Document for server-side inference
                call.query = q["text"]
                return "filter", top_k, f"{path}.text"
            inner = "nearest" if "nearest" in q else "vector"
            q, path = q.get(inner), f"{path}.{inner}"
            if isinstance(q, dict):
                inner = "vector" if "vector" in q else "text"
                q, path = q.get(inner), f"{path}.{inner}"
        if isinstance(q, str):
            call.query = q
        else:
            call.query_vector = as_vector(q)
        return "filter", top_k, path

    def empty_result(self, path: str) -> bytes | None:
        points: Any = {"points": []} if path.rstrip("/").endswith("/query") else []
        return orjson.dumps({"result": points, "status": "ok", "time": 0.0})

    def results(self, doc: Any) -> list[Any] | None:
        result = doc.get("result") if isinstance(doc, dict) else None
        if isinstance(result, dict):
            result = result.get("points")
        return result if isinstance(result, list) else None


class ChromaAdapter(JsonRetrievalAdapter):
    """`POST .../collections/{id}/query` (v1 and v2 HTTP API). Results are parallel arrays per
    query; every query's rows become chunks. Chroma scores are distances (lower is nearer)."""

    name = "chroma"
    credential_headers = ("x-chroma-token", "authorization")  # Chroma's token header; else Bearer / Basic
    defaults: ClassVar[Mapping[str, str]] = {"source": "source"}  # `source` and `acl` are paths inside each result's metadata
    _PATH = re.compile(r"/collections/([^/]+)/query$")

    def empty_result(self, path: str) -> bytes | None:
        return orjson.dumps({"ids": [[]], "documents": [[]], "metadatas": [[]], "distances": [[]]})

    def route_id(self, method: str, path: str) -> str | None:
        m = self._PATH.search(path)
        return f"{self.upstream.name}/{m.group(1)}" if m and method == "POST" else None

    def read_request(self, doc: dict[str, Any], call: Call) -> tuple[str, ...]:
        emb = doc.get("query_embeddings")
        if isinstance(emb, list) and emb and isinstance(emb[0], list):
            emb = emb[0] if len(emb) == 1 else None  # a batch of several queries has no single key
        call.query_vector = as_vector(emb)
        texts = doc.get("query_texts")
        if isinstance(texts, list) and len(texts) == 1:
            call.query = as_str(texts[0])
        filters = {k: doc[k] for k in ("where", "where_document") if doc.get(k)}
        call.filters = filters or None
        call.top_k = as_int(doc.get("n_results", 10))
        return "query_embeddings", "query_texts", "where", "where_document", "n_results"  # `include` selects

    def chunks(self, doc: Any) -> list[Chunk] | None:
        if not isinstance(doc, dict) or not isinstance(doc.get("ids"), list):
            return None
        out: list[Chunk] = []
        for row, ids in enumerate(doc["ids"]):
            for i, cid in enumerate(ids if isinstance(ids, list) else []):
                text = get_path(doc, f"documents.{row}.{i}")
                meta = get_path(doc, f"metadatas.{row}.{i}")
                out.append(Chunk(
                    id=as_id(cid) or text_id(text),
                    text=text if isinstance(text, str) else "",
                    score=as_float(get_path(doc, f"distances.{row}.{i}")),
                    source=as_id(get_path(meta, self.fields.get("source"))),
                    acl=as_acl(get_path(meta, self.fields["acl"])) if self.fields.get("acl") else None,
                ))
        return out


_TEXT_QUERIES = ("match", "match_phrase", "match_phrase_prefix", "multi_match", "query_string",
                 "simple_query_string", "combined_fields", "match_bool_prefix", "semantic", "neural")


def _es_text(node: Any, depth: int = 0) -> str | None:
    """The first full-text query string in an Elasticsearch / OpenSearch query DSL."""
    if depth > 32:
        return None
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _TEXT_QUERIES and isinstance(value, dict):
                if isinstance(value.get("query"), str):
                    return str(value["query"])
                for v in value.values():
                    if isinstance(v, str):
                        return v
                    if isinstance(v, dict) and isinstance(v.get("query"), str):
                        return str(v["query"])
                    if isinstance(v, dict) and isinstance(v.get("query_text"), str):  # OpenSearch neural
                        return str(v["query_text"])
            found = _es_text(value, depth + 1)
            if found is not None:
                return found
    elif isinstance(node, list):
        for v in node:
            found = _es_text(v, depth + 1)
            if found is not None:
                return found
    return None


def _without(node: Any, text: str | None, vector: list[float] | None) -> Any:
    """The DSL with the query text and vector taken out: what remains is the filter structure."""
    if isinstance(node, dict):
        return {k: _without(v, text, vector) for k, v in node.items()}
    if isinstance(node, list):
        if vector is not None and as_vector(node) == vector:
            return "$vector"
        return [_without(v, text, vector) for v in node]
    if text is not None and node == text:
        return "$query"
    return node


class ElasticsearchAdapter(JsonRetrievalAdapter):
    """`/{index}/_search` and `/_search` (Elasticsearch and OpenSearch), with `query` and/or `knn`.
    Filters are the whole DSL minus the query text and vector, so any structural change is a new intent."""

    name = "elasticsearch"
    credential_headers = ("authorization",)  # ApiKey, Bearer or Basic
    defaults: ClassVar[Mapping[str, str]] = {"results": "hits.hits", "id": "_id", "score": "_score", "text": "_source.text",
                "source": "_source.source"}
    _PATH = re.compile(r"^(?:/([^/_][^/]*))?/_search$")
    _OTHER_SEARCH = re.compile(r"^(?:/[^/_][^/]*)?/(_msearch|_knn_search|_search/template|_msearch/template)$")

    def route_id(self, method: str, path: str) -> str | None:
        m = self._PATH.search(path)
        if not m or method not in ("POST", "GET"):
            return None
        return f"{self.upstream.name}/{m.group(1) or '*'}"

    def is_search(self, method: str, path: str) -> bool:
        return method in ("POST", "GET") and self._OTHER_SEARCH.search(path) is not None

    def read_request(self, doc: dict[str, Any], call: Call) -> tuple[str, ...]:
        knn = doc.get("knn")
        first_knn = knn[0] if isinstance(knn, list) and knn else knn
        call.query = _es_text(doc.get("query"))
        if isinstance(first_knn, dict):
            call.query_vector = as_vector(first_knn.get("query_vector"))
        size = as_int(doc.get("size"))
        k = as_int(first_knn.get("k")) if isinstance(first_knn, dict) else None
        call.top_k = size if size is not None else (k if k is not None else 10)
        rest = {key: doc[key] for key in ("query", "knn", "post_filter", "min_score") if key in doc}
        call.filters = _without(rest, call.query, call.query_vector) if rest else None
        # from, sort, _source, highlight, aggs...: not understood, so they select the evidence
        return "query", "knn", "post_filter", "min_score", "size"


class LangServeAdapter(JsonRetrievalAdapter):
    """LangServe retriever `POST /{name}/invoke`: `{"input": "query" | {...}}` ->
    `{"output": [{"page_content", "metadata", "id"?}, ...]}`."""

    name = "langserve"
    defaults: ClassVar[Mapping[str, str]] = {"results": "output", "id": "id", "text": "page_content", "score": "metadata.score",
                "source": "metadata.source"}
    _PATH = re.compile(r"/([^/]+)/invoke$|^/invoke$")
    _OTHER_SEARCH = re.compile(r"(?:^|/)(batch|stream|stream_log|stream_events)$")

    def route_id(self, method: str, path: str) -> str | None:
        m = self._PATH.search(path)
        if not m or method != "POST":
            return None
        return f"{self.upstream.name}/{m.group(1) or ''}"

    def is_search(self, method: str, path: str) -> bool:
        return method == "POST" and self._OTHER_SEARCH.search(path) is not None

    def read_request(self, doc: dict[str, Any], call: Call) -> tuple[str, ...]:
        inp = doc.get("input")
        if isinstance(inp, str):
            call.query = inp
        elif isinstance(inp, dict):
            key = self.fields.get("query")
            keys = [key] if key else ["query", "question", "input"]
            for k in keys:
                if isinstance(inp.get(k), str):
                    call.query = inp[k]
                    call.filters = {kk: v for kk, v in inp.items() if kk != k} or None
                    break
        if self.fields.get("top_k"):
            call.top_k = as_int(get_path(doc, self.fields["top_k"]))
        # the input's other keys are its filters; `config` and `kwargs` select the evidence
        return "input", self.fields.get("top_k") or ""

    def chunk(self, item: Any) -> Chunk:
        c = super().chunk(item)
        if c.id.startswith("fp:"):  # no id of its own: LangChain Documents often carry it in metadata
            mid = as_id(get_path(item, "metadata.id"))
            if mid:
                return Chunk(id=mid, text=c.text, score=c.score, source=c.source, acl=c.acl)
        return c
