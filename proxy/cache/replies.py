"""Bodies in and out of the evidence cache (pure): a hit's body trimmed to the asked top_k, and the
filter-like words a retrieval answer's metadata teaches the verifier.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..adapters.fields import get_path


def trim_results(body: bytes, path: str, top_k: int) -> bytes:
    """The cached body with its results list cut to `top_k` (unchanged when the shape is unexpected)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if path in ("", ".") and isinstance(doc, list):
        return orjson.dumps(doc[:top_k])
    parent_path, _, leaf = path.rpartition(".")
    parent = get_path(doc, parent_path) if parent_path else doc
    if isinstance(parent, dict) and isinstance(parent.get(leaf), list):
        parent[leaf] = parent[leaf][:top_k]
        return orjson.dumps(doc)
    return body


def metadata_words(results: Any, skip: set[str], limit: int = 200) -> list[str]:
    """Short categorical metadata values of the results (plan types, regions, products): filter-like words."""
    out: set[str] = set()

    def walk(node: Any, depth: int) -> None:
        if len(out) >= limit or depth > 4:
            return
        if isinstance(node, dict):
            for k, v in node.items():
                if k not in skip:
                    walk(v, depth + 1)
        elif isinstance(node, list):
            for v in node[:50]:
                walk(v, depth + 1)
        elif isinstance(node, str) and 0 < len(node) <= 32 and len(node.split()) <= 2:
            out.update(w.casefold() for w in node.replace("_", " ").split())

    if isinstance(results, list):
        for r in results:
            walk(r, 0)
    return sorted(out)
