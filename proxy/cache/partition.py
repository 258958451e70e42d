"""Partition and exact keys of the evidence cache (pure: no I/O, no clock).

A partition is the hard boundary no lookup ever crosses: the route, the selector (the upstream
path and query string after the prefix, and a hash of every body field the adapter does not
understand: collection, namespace, score threshold...), the source version, canonical filters
and tenant. Inside it, the exact key is the normalised query text (and a query vector's hash);
`top_k` is not part of any key - an entry fetched with top_k=N serves any ask of top_k <= N.
"""

from __future__ import annotations

import re
import struct
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import xxhash

_SPACE = re.compile(r"\s+")
# Lucene / query_string operators: case-sensitive there ("cats AND dogs" != "cats and dogs"), so
# case folding leaves them as they are
_OPERATORS = re.compile(r"\b(AND|OR|NOT|TO)\b")
DEFAULT_NORMALIZE = ("whitespace", "nfc")  # config.NORMALIZE_MODES: what no upstream tells apart


def normalize_query(text: str, modes: Sequence[str] = DEFAULT_NORMALIZE) -> str:
    """The exact tier's form of a query text: never looser than the route's upstream.

    By default only what no upstream tells apart: runs of whitespace (collapsed, trimmed) and the
    Unicode composition form (NFC). Opt-in per route (`cache.normalize`, upstreams[].cache.normalize):
    `width` (NFKC: full-width letters, superscripts, ligatures), `lowercase`, `casefold` (full
    Unicode folding: "Maße" == "masse"), for an upstream that ignores them. Punctuation, wildcards
    (`?`, `*`) and query operators (`AND`, `OR`, `NOT`, `TO`, kept in capitals when folding case)
    are never touched: a false miss costs a retrieval, a false hit serves another query's evidence.
    """
    t = unicodedata.normalize("NFKC" if "width" in modes else "NFC", text) \
        if "width" in modes or "nfc" in modes else text
    fold = str.casefold if "casefold" in modes else str.lower if "lowercase" in modes else None
    if fold is not None:
        parts = _OPERATORS.split(t)  # odd items are the operators
        t = "".join(p if i % 2 else fold(p) for i, p in enumerate(parts))
    if "whitespace" in modes:
        t = _SPACE.sub(" ", t).strip()
    return t


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
    selector: str = ""  # `selector(target, unknown)`: where the query went and what else its body said

    @property
    def key(self) -> str:
        """Short stable id; the Redis hash tag of every key of this partition."""
        raw = b"\x00".join((self.route.encode(), self.version.encode(), self.filters, self.tenant.encode(),
                            self.selector.encode("utf-8", "surrogatepass")))
        return xxhash.xxh3_128_hexdigest(raw)

    @property
    def source(self) -> str:
        """The threshold/audit scope: route + selector + filters + tenant, across versions."""
        raw = b"\x00".join((self.route.encode(), self.filters, self.tenant.encode(),
                            self.selector.encode("utf-8", "surrogatepass")))
        return xxhash.xxh3_64_hexdigest(raw)


def selector(target: str, unknown: str | None) -> str:
    """What selects the evidence besides query, filters and top_k: the upstream target (path and query
    string after the route's prefix, as sent) and the hash of the body fields the adapter does not
    understand (`Call.selector`). Kept verbatim, so `/search` and `/search/` are two partitions: a
    false miss costs a retrieval, a false hit serves another index's evidence."""
    return f"{target}\x00{unknown or ''}"


def exact_key(normalized_query: str, vector: Sequence[float] | None = None) -> str:
    """The exact tier's key: the normalised text, and the query vector's float64 bytes when there is one."""
    h = xxhash.xxh3_128()
    h.update(normalized_query.encode("utf-8", "surrogatepass"))
    if vector is not None:
        h.update(b"\x00v\x00")
        h.update(struct.pack(f"<{len(vector)}d", *vector))
    return h.hexdigest()


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
