"""Unique retrieval intents: query normalisation, canonical filters and the xxhash query key.

Normalisation drops only what cannot change meaning (case, Unicode form, whitespace, trailing
punctuation) and keeps word order, numbers and symbols ("C++" != "C", "A to B" != "B to A").
Pure: no I/O.
"""

from __future__ import annotations

import math
import re
import struct
import unicodedata
from typing import Any

import orjson
import xxhash

_SPACE = re.compile(r"\s+")
# Sentence-final marks only; symbols that carry meaning ("C++", "C#", "50%", "$") are kept.
_TRAILING = ".?!;:,…。？！；：、"
_FILTER_DEPTH = 64


def normalize(text: str) -> str:
    """The form two queries share when they ask the same thing in the same words."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _SPACE.sub(" ", text).strip()
    return text.rstrip(_TRAILING + " ")


def canonical_filters(obj: Any, _depth: int = 0) -> Any:
    """Filters with sorted keys and one spelling per number (1 == 1.0, -0.0 == 0).

    Lists keep their order: in most filter languages order can matter (ranges, `$and` short
    cuts), and a false miss costs less than a false hit. Booleans stay booleans (True != 1).
    """
    if _depth > _FILTER_DEPTH:
        raise ValueError("filters nested too deeply")
    if isinstance(obj, dict):
        return {str(k): canonical_filters(obj[k], _depth + 1) for k in sorted(obj, key=str)}
    if isinstance(obj, (list, tuple)):
        return [canonical_filters(v, _depth + 1) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj
    if isinstance(obj, float):
        if math.isfinite(obj) and obj == int(obj) and abs(obj) < 2**53:
            return int(obj)
        return obj
    return str(obj)


def filters_json(filters: Any) -> bytes:
    """Canonical filters as compact JSON bytes (the form keys and partitions hash)."""
    if filters is None:
        return b"null"
    return orjson.dumps(canonical_filters(filters), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def query_key(route: str, text: str | None, vector: list[float] | None, filters: Any) -> str:
    """xxh3-128 hex key of one retrieval intent: route, normalised text (or the vector), filters.

    top_k is deliberately not part of the key: a cached top_k=10 can serve top_k<=10.
    A vector is keyed by its float64 bytes, so the same embedding from any client matches.
    """
    return _key(route, None if text is None else (b"\x00t\x00", normalize(text)), vector, filters)


def oversized_key(route: str, text: str, vector: list[float] | None, filters: Any) -> str:
    """xxh3-128 hex key of a query too long to read (past `server.max_query_chars`): its raw text,
    hashed as sent (never normalised: linear in the text, and two spellings stay two queries, a
    key never looser than the upstream), with the route, vector and filters as `query_key` has them."""
    return _key(route, (b"\x00raw\x00", text), vector, filters)


def _key(route: str, text: tuple[bytes, str] | None, vector: list[float] | None, filters: Any) -> str:
    """The hash both keys share: the route, the text under its tag (normalised or raw), the vector's
    float64 bytes, the canonical filters."""
    h = xxhash.xxh3_128()
    h.update(route.encode("utf-8", "surrogatepass"))
    if text is not None:
        h.update(text[0])
        h.update(text[1].encode("utf-8", "surrogatepass"))
    if vector is not None:
        h.update(b"\x00v\x00")
        h.update(struct.pack(f"<{len(vector)}d", *vector))
    h.update(b"\x00f\x00")
    h.update(filters_json(filters))
    return h.hexdigest()
