"""Small readers shared by adapters: dotted field paths, typed getters, prompt text collection.

Pure and total: every function returns None / empty for a shape it does not expect, so adapters
can read untrusted JSON without try/except around each field.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

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
