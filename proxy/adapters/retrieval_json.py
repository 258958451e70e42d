"""`json`: the generic retrieval adapter, driven by field paths in the upstream's `fields:` config.

Request paths: `query`, `vector`, `filters`, `top_k`; `irrelevant` (comma-separated paths) names
body fields that never change the results. Every other body field is hashed into `Call.selector`,
so the cache never lets two requests that differ in it share evidence. Response paths: `results`
(the list; "" for a top-level list) and, relative to each result, `id`, `text`, `score`, `source`,
`acl`. Index version: `version_header` (response header) or `version_field` (response body path).
Operations: a POST (or a GET with a body) is a search; anything else on the route is `other`. The
presets in retrieval_presets.py are subclasses that change defaults, paths and a few readers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from ..core import queries
from ..core.evidence_track import chunk_key
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
from .fields import as_acl, as_float, as_id, as_int, as_str, as_vector, get_path, unknown_fields

FIELD_KEYS = frozenset({"query", "vector", "filters", "top_k", "results", "id", "text", "score", "source", "acl",
                        "version_header", "version_field", "irrelevant"})


class JsonRetrievalAdapter:
    name = "json"
    error_style = "plain"
    reject_status = 429  # qdrant-client does not retry a 429
    reads_body = True
    credential_headers: tuple[str, ...] = ("authorization", "api-key", "x-api-key")  # upstream unknown
    stream_end = staticmethod(no_stream_end)
    finish = staticmethod(no_finish)
    cap_output = staticmethod(no_cap_output)
    field_keys: ClassVar[frozenset[str]] = FIELD_KEYS  # config validation rejects other `fields:` keys
    defaults: ClassVar[Mapping[str, str]] = {"query": "query", "vector": "vector", "filters": "filter", "top_k": "top_k",
                                   "results": "results", "id": "id", "text": "text", "score": "score",
                                   "source": "source"}

    def __init__(self, upstream: UpstreamInfo) -> None:
        self.upstream = upstream
        # `fields` keys outside FIELD_KEYS are ignored here; config validation may reject them
        self.fields: dict[str, str] = {**self.defaults, **upstream.fields}
        # body fields that never change the results: left out of `Call.selector`
        self.irrelevant = tuple(p.strip() for p in self.fields.get("irrelevant", "").split(",") if p.strip())

    def keep_results(self, body: bytes, keep: int) -> bytes | None:
        """The answer with only its first `keep` results (adaptive depth, stages/context.py); None
        when it holds no results list longer than that (it is then sent as it came)."""
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        results = get_path(doc, self.fields.get("results"))
        if not isinstance(results, list) or keep >= len(results):
            return None
        del results[keep:]  # in place: the list is part of `doc`
        return orjson.dumps(doc)

    def with_top_k(self, body: bytes, top_k: int) -> bytes | None:
        """The search with its top_k raised to `top_k` (widening a weak first pass,
        stages/context.py); None when the body holds no integer top_k at the configured path under
        that (a search that left top_k to the upstream's default is not widened)."""
        path = self.fields.get("top_k")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if not path or not isinstance(doc, dict):
            return None
        head, _, last = path.rpartition(".")
        parent = get_path(doc, head) if head else doc
        current = parent.get(last) if isinstance(parent, dict) else None
        if current.__class__ is not int or current >= top_k:
            return None
        parent[last] = top_k
        return orjson.dumps(doc)

    # -- request ---------------------------------------------------------------------------------

    def route_id(self, method: str, path: str) -> str | None:
        """The key space of a search this adapter reads (route, plus collection / index for presets);
        None for any other operation."""
        return self.upstream.name if method in ("POST", "GET") else None

    def is_search(self, method: str, path: str) -> bool:
        """A search or query the adapter does not read (a batch): a retrieval call, never cached."""
        return False

    def parse_request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> Call:
        path = path.rstrip("/")
        route = self.route_id(method, path)
        if route is None or (method == "GET" and not body):
            # health checks, collection info, upserts: forwarded and counted as calls, not retrievals
            return Call(operation="retrieval" if self.is_search(method, path) else "other")
        doc, error = json_body(body)
        call = Call(operation="retrieval", parse_error=error)
        if doc is None:
            return call

        def read(d: dict[str, Any], c: Call) -> None:
            understood = self.read_request(d, c)
            c.filters = queries.canonical_filters(c.filters) if c.filters is not None else None
            c.selector = unknown_fields(d, (*understood, *self.irrelevant))
            if c.query is not None or c.query_vector is not None:
                c.query_key = queries.query_key(route, c.query, c.query_vector, c.filters)

        return safe_parse(call, read, doc)

    def read_request(self, doc: dict[str, Any], call: Call) -> tuple[str, ...]:
        """Fill `call` from the body; returns the dotted paths it understood (read or made irrelevant
        by what it read). Whatever else the body holds goes into `call.selector`."""
        f = self.fields
        call.query = as_str(get_path(doc, f.get("query")))
        call.query_vector = as_vector(get_path(doc, f.get("vector")))
        call.filters = get_path(doc, f.get("filters"))
        call.top_k = as_int(get_path(doc, f.get("top_k")))
        return tuple(p for p in (f.get("query"), f.get("vector"), f.get("filters"), f.get("top_k")) if p)

    # -- response --------------------------------------------------------------------------------

    def observer(self, call: Call, status: int, headers: Mapping[str, str]) -> Observer:
        if call.operation != "retrieval" or status >= 400:
            return NullObserver()
        version = None
        if self.fields.get("version_header"):
            version = headers.get(self.fields["version_header"].lower())
        return RetrievalObserver(self, version)

    def empty_result(self, path: str) -> bytes | None:
        """`{"results": []}`, nested along the configured results path (`hits.hits` -> `{"hits": {"hits": []}}`)."""
        doc: Any = []
        for key in reversed((self.fields.get("results") or "").split(".")):
            doc = {key: doc} if key else doc
        return orjson.dumps(doc)

    def results(self, doc: Any) -> list[Any] | None:
        items = get_path(doc, self.fields.get("results", ""))
        return items if isinstance(items, list) else None

    def chunks(self, doc: Any) -> list[Chunk] | None:
        items = self.results(doc)
        if items is None:
            return None
        return [self.chunk(item) for item in items]

    def chunk(self, item: Any) -> Chunk:
        f = self.fields
        text = get_path(item, f.get("text"))
        source = get_path(item, f.get("source"))
        return Chunk(
            id=as_id(get_path(item, f.get("id"))) or text_id(text),
            text=text if isinstance(text, str) else "",
            score=as_float(get_path(item, f.get("score"))),
            source=as_id(source),
            acl=as_acl(get_path(item, f["acl"])) if f.get("acl") else None,
        )


def text_id(text: object) -> str:
    """The id of a chunk the back-end gave none: its text fingerprint, so it is still recognised."""
    return chunk_key(Chunk(id="", text=text if isinstance(text, str) else ""))


class RetrievalObserver(BufferedJsonObserver):
    def __init__(self, adapter: JsonRetrievalAdapter, version: str | None) -> None:
        super().__init__()
        self._adapter = adapter
        self.observation.source_version = version

    def read(self, doc: Any) -> None:
        obs = self.observation
        field = self._adapter.fields.get("version_field")
        if field:
            v = get_path(doc, field)
            if isinstance(v, (str, int)) and not isinstance(v, bool):
                obs.source_version = str(v)
        chunks = self._adapter.chunks(doc)
        if chunks is None:
            obs.parse_error = "retrieval response has no results list"
        obs.chunks = chunks
