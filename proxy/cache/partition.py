"""Partition and exact keys of the evidence cache (pure: no I/O, no clock).

A partition is the hard boundary no lookup ever crosses: route/index, source version, canonical
filters and tenant. Inside it, the exact key is the normalised query text; `top_k` is not part
of any key - an entry fetched with top_k=N serves any ask of top_k <= N.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

_SPACE = re.compile(r"\s+")
_EDGE_PUNCT = re.compile(r"^[\s\"'`.,;:!?¿¡]+|[\s.,;:!?¿¡]+$")


def normalize_query(text: str) -> str:
    """Case-folded, NFKC, whitespace-collapsed, trailing punctuation dropped.

    Conservative on purpose: two texts that normalise alike must mean the same thing, so
    quotes inside the text, digits and word order are kept.
    """
    t = unicodedata.normalize("NFKC", text).casefold()
    t = _SPACE.sub(" ", t)
    return _EDGE_PUNCT.sub("", t)


def canonical_filters(filters: Any) -> bytes:
    """Stable bytes for a filter document: keys sorted, so {a, b} and {b, a} share a partition."""
    if filters is None or filters == {} or filters == []:
        return b"null"
    try:
        return orjson.dumps(filters, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return repr(filters).encode()  # not JSON: still deterministic for the same value


@dataclass(frozen=True, slots=True)
class Partition:
    route: str
    version: str
    filters: bytes
    tenant: str

    @property
    def key(self) -> str:
        """Short stable id; the Redis hash tag of every key of this partition."""
        raw = b"\x00".join((self.route.encode(), self.version.encode(), self.filters, self.tenant.encode()))
        return xxhash.xxh3_128_hexdigest(raw)

    @property
    def source(self) -> str:
        """The threshold/audit scope: route + filters + tenant, across versions."""
        raw = b"\x00".join((self.route.encode(), self.filters, self.tenant.encode()))
        return xxhash.xxh3_64_hexdigest(raw)


def exact_key(normalized_query: str) -> str:
    return xxhash.xxh3_128_hexdigest(normalized_query.encode())


def serves_top_k(cached: int | None, asked: int | None) -> bool:
    """A cached top_k=N serves top_k <= N; an unspecified top_k (the upstream's default) only itself."""
    if asked is None or cached is None:
        return asked == cached
    return cached >= asked


def filter_words(filters: Any, limit: int = 200) -> set[str]:
    """Scalar string values of a filter document, lower-cased: words that act as filters."""
    out: set[str] = set()

    def walk(node: Any) -> None:
        if len(out) >= limit:
            return
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str) and 0 < len(node) <= 64:
            out.add(node.casefold())

    walk(filters)
    return out
