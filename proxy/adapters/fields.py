"""Small readers shared by adapters: dotted field paths, typed getters, prompt text collection.

Pure and total: every function returns None / empty for a shape it does not expect, so adapters
can read untrusted JSON without try/except around each field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import orjson
import xxhash

from ..core import queries

_MISSING = object()


def get_path(doc: Any, path: str | None) -> Any:
    """`doc` at a dotted path ("metadata.groups", "hits.hits", "0.text"); "" or "." is `doc` itself."""
    if path is None:
        return None
    if path in ("", "."):
        return doc
    node = doc
    for part in path.split("."):
        if isinstance(node, dict):
            node = node.get(part, _MISSING)
        elif isinstance(node, list) and part.lstrip("-").isdigit():
            i = int(part)
            node = node[i] if -len(node) <= i < len(node) else _MISSING
        else:
            return None
        if node is _MISSING:
            return None
    return node


def as_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def as_str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def as_float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def as_vector(v: Any) -> list[float] | None:
    """A flat list of finite numbers, else None."""
    if not isinstance(v, list) or not v:
        return None
    out: list[float] = []
    for x in v:
        f = as_float(x)
        if f is None:
            return None
        out.append(f)
    return out


def as_acl(v: Any) -> tuple[str, ...] | None:
    """ACL groups from a list of strings or one string; None when the response said nothing."""
    if v is None:
        return None
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list):
        return tuple(str(x) for x in v if isinstance(x, (str, int)) and not isinstance(x, bool))
    return None


def as_id(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return None


def json_text(v: Any) -> str:
    """A JSON value as the compact text a model would see (tool schemas, arguments)."""
    if isinstance(v, str):
        return v
    try:
        return orjson.dumps(v).decode()
    except (TypeError, orjson.JSONEncodeError):
        return ""


def unknown_fields(doc: dict[str, Any], understood: Iterable[str]) -> str | None:
    """A hash of what `doc` holds besides the `understood` dotted paths (None: nothing else).

    Retrieval adapters key cached evidence by it: a body field the adapter does not read (a
    namespace, a score threshold, a named vector, `with_payload`) may change the results, so two
    requests that differ in one never share an entry. Canonical: key order and 1 vs 1.0 do not count.
    Raises ValueError past 64 levels of nesting (the adapter records a parse error: no cache).
    """
    rest = _without(doc, [p.split(".") for p in understood if p])
    if not rest:
        return None
    return xxhash.xxh3_64_hexdigest(queries.filters_json(rest))


def _without(node: dict[str, Any], paths: list[list[str]]) -> dict[str, Any]:
    """`node` less the leaves at `paths`, copying only the dicts along them; dicts left empty go too."""
    heads: dict[str, list[list[str]]] = {}
    for parts in paths:
        heads.setdefault(parts[0], []).append(parts[1:])
    out: dict[str, Any] = {}
    for key, value in node.items():
        tails = heads.get(key)
        if tails is None:
            out[key] = value
        elif any(not t for t in tails):
            continue  # the whole field is understood
        elif isinstance(value, dict):
            inner = _without(value, tails)
            if inner:
                out[key] = inner
        else:
            out[key] = value  # a path into a list or scalar: kept whole, so it still counts
    return out
