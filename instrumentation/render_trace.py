"""Draws a trace as a text tree, the way Jaeger's trace view nests it: for docs and for eyes.

Pure: takes decoded spans (dicts with name, span_id, parent_span_id, start, end, attributes and
resource, as tests/support/otlp.py decodes an OTLP export) and returns text. Imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Span = Mapping[str, Any]

# Per span, the few attributes a person reads first; (key, label, format).
_COST = ("ragtoll.cost.usd", "cost", lambda v: f"${v:.7f}".rstrip("0").rstrip(".") if v else "$0")
# the task's identity and profile are drawn once, on the task span; calls repeat them in Jaeger
TASK_FIELDS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("ragtoll.task.id", "task", str),
    ("ragtoll.task.source", "source", str),
    ("ragtoll.budget.profile", "profile", str),
    ("ragtoll.task.calls", "calls", str),
    _COST,
)
DEFAULT_FIELDS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("gen_ai.usage.input_tokens", "in", str),
    ("gen_ai.usage.output_tokens", "out", str),
    ("ragtoll.cache.result", "cache", str),
    ("ragtoll.evidence.new_chunks", "new chunks", str),
    _COST,
    ("ragtoll.budget.exceeded.dimension", "REJECTED", str),
)
# "used/limit" pairs shown for these dimensions when the span carries them
BUDGET_DIMENSIONS = ("max_steps", "max_calls", "max_retrieval_calls", "max_cost_usd")


def describe(span: Span, fields: Sequence[tuple[str, str, Callable[[Any], str]]] = DEFAULT_FIELDS) -> str:
    """One line of annotations for `span`: chosen attributes and budget used/limit pairs."""
    attrs = span.get("attributes", {})
    if span.get("name") == "ragtoll.task":
        fields = TASK_FIELDS
    parts = [f"{label} {fmt(attrs[key])}" if label else fmt(attrs[key]) for key, label, fmt in fields
             if key in attrs and attrs[key] not in ("", None)]
    for dim in BUDGET_DIMENSIONS:
        used, limit = attrs.get(f"ragtoll.budget.{dim}.used"), attrs.get(f"ragtoll.budget.{dim}.limit")
        if used is not None and limit is not None:
            short = dim.removeprefix("max_")
            parts.append(f"{short} {_num(used)}/{_num(limit)}")
    return " · ".join(parts)


def render_tree(spans: Sequence[Span], *, durations: bool = True,
                fields: Sequence[tuple[str, str, Callable[[Any], str]]] = DEFAULT_FIELDS) -> str:
    """The spans as an indented tree, children in start order. Spans whose parent is not in the
    list are drawn as roots and marked `(parent not exported)`, so an incomplete tree shows."""
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str, list[Span]] = {}
    roots: list[Span] = []
    for span in spans:
        parent = span.get("parent_span_id") or ""
        if parent and parent in by_id:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)
    lines: list[str] = []

    def walk(span: Span, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        service = span.get("resource", {}).get("service.name", "")
        head = f"{prefix}{branch}{span['name']}" + (f"  [{service}]" if service else "")
        if top and span.get("parent_span_id"):
            head += "  (parent not exported)"
        note = describe(span, fields)
        if durations:
            note = " · ".join(p for p in (_duration(span), note) if p)
        lines.append(f"{head}  {note}".rstrip())
        kids = sorted(children.get(span["span_id"], []), key=lambda s: (s.get("start", 0), s["name"]))
        inner = prefix + ("" if top else ("   " if last else "│  "))
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for root in sorted(roots, key=lambda s: (s.get("start", 0), s["name"])):
        walk(root, "", True, True)
    return "\n".join(lines)


def _duration(span: Span) -> str:
    start, end = span.get("start"), span.get("end")
    if start is None or end is None:
        return ""
    ms = (end - start) / 1e6
    return f"{ms:.1f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def _num(value: Any) -> str:
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.6f}".rstrip("0")
    return str(int(value)) if isinstance(value, float) else str(value)
