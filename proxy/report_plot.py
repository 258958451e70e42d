"""`ragtoll report --plot`: a self-contained HTML page (inline SVG, no scripts) or a bare SVG file.

Two pictures over task records: cost per task (one bar per task, coloured by outcome, grouped)
and budget use per dimension (p50 / p95 / max per group, with rejections counted per dimension).
Pure: records in, text out; the CLI writes the file.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from .report import DIMENSION_OF, GROUPS, ReportError, percentile

_COLOURS = {True: "#2e7d32", False: "#c62828", None: "#9e9e9e"}
_GROUP_COLOURS = ("#1565c0", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#558b2f", "#4e342e")
_W = 900


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def cost_svg(records: Sequence[Mapping[str, Any]], by: str) -> str:
    recs = sorted(records, key=lambda r: (str(r.get(by)), float(r["cost_usd"])))
    height, top, left, bottom = 300, 30, 70, 60
    plot_w, plot_h = _W - left - 20, height - top - bottom
    peak = max((float(r["cost_usd"]) for r in recs), default=0.0) or 1.0
    bar = plot_w / max(len(recs), 1)
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" font-family="sans-serif" '
            f'font-size="11"><title>Cost per task</title>'
        ),
        (
            f'<text x="{left}" y="18" font-size="14" font-weight="bold">Cost per task (USD), grouped by {_esc(by)}; '
            "green correct, red wrong, grey not judged</text>"
        ),
    ]
    for frac in (0, 0.5, 1):
        y = top + plot_h * (1 - frac)
        parts.append(
            f'<line x1="{left}" x2="{_W - 20}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{peak * frac:.4f}</text>'
        )
    last_group = None
    for i, r in enumerate(recs):
        x = left + i * bar
        h = plot_h * float(r["cost_usd"]) / peak
        outcome = r.get("outcome")
        colour = _COLOURS[outcome["correct"] if outcome else None]
        tip = f"{r['task_id']}: ${float(r['cost_usd']):.5f}" + (
            f" exhausted {r['exhausted']}" if r.get("exhausted") else ""
        )
        parts.append(
            f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{max(bar - 1, 0.5):.1f}" height="{h:.1f}" '
            f'fill="{colour}"><title>{_esc(tip)}</title></rect>'
        )
        if str(r.get(by)) != last_group:
            last_group = str(r.get(by))
            parts.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + plot_h + 14}" stroke="#555"/>'
                f'<text x="{x + 3:.1f}" y="{top + plot_h + 26}">{_esc(last_group)}</text>'
            )
        if r.get("exhausted"):
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{top + plot_h - h - 3:.1f}" text-anchor="middle" '
                f'fill="#c62828">×</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def budget_svg(records: Sequence[Mapping[str, Any]], by: str) -> str:
    groups = sorted({str(r.get(by)) for r in records})
    dims = list(DIMENSION_OF.items())
    row_h, label_w, height_top = 26 + 12 * len(groups), 190, 40
    height = height_top + row_h * len(dims) + 20
    plot_w = _W - label_w - 160
    parts = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" font-family="sans-serif" '
            f'font-size="11"><title>Budget use per dimension</title>'
        ),
        (
            f'<text x="10" y="18" font-size="14" font-weight="bold">Budget use per dimension by {_esc(by)}: '
            "bar p50, whisker p95, tick max; rejections at right</text>"
        ),
    ]
    for gi, g in enumerate(groups):
        parts.append(
            f'<rect x="{10 + gi * 120}" y="26" width="10" height="10" fill="{_GROUP_COLOURS[gi % 7]}"/>'
            f'<text x="{24 + gi * 120}" y="35">{_esc(g)}</text>'
        )
    for di, (key, dim) in enumerate(dims):
        y0 = height_top + di * row_h + 8
        peak = max((float(r[key]) for r in records), default=0.0) or 1.0
        rejected = sum(int((r.get("rejections") or {}).get(dim, 0)) for r in records)
        exhausted = sum(1 for r in records if r.get("exhausted") == dim)
        parts.append(
            f'<text x="10" y="{y0 + 10}">{_esc(dim)}</text>'
            f'<text x="{_W - 150}" y="{y0 + 10}">{rejected} rejected, {exhausted} exhausted</text>'
        )
        for gi, g in enumerate(groups):
            vals = [float(r[key]) for r in records if str(r.get(by)) == g]
            p50, p95, top = percentile(vals, 50), percentile(vals, 95), max(vals, default=0.0)
            y = y0 + gi * 12
            scale = plot_w / peak
            parts.append(
                f'<rect x="{label_w}" y="{y}" width="{p50 * scale:.1f}" height="9" fill="{_GROUP_COLOURS[gi % 7]}">'
                f"<title>{_esc(g)} {_esc(key)}: p50 {p50:.4g}, p95 {p95:.4g}, max {top:.4g}</title></rect>"
                f'<line x1="{label_w + p50 * scale:.1f}" x2="{label_w + p95 * scale:.1f}" y1="{y + 4.5}" y2="{y + 4.5}" '
                f'stroke="#333"/><line x1="{label_w + top * scale:.1f}" x2="{label_w + top * scale:.1f}" '
                f'y1="{y}" y2="{y + 9}" stroke="#333"/>'
                f'<text x="{label_w + plot_w + 4}" y="{y + 8}" fill="#555">{p95:.4g}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def render(records: Sequence[Mapping[str, Any]], by: str, fmt: str, table_html: str = "") -> str:
    """`fmt` is `html` (both pictures and the table) or `svg` (both pictures stacked)."""
    if by not in GROUPS:
        raise ReportError(f"cannot group by {by!r}; expected one of {', '.join(GROUPS)}")
    if not records:
        raise ReportError("no task records to plot")
    cost, budget = cost_svg(records, by), budget_svg(records, by)
    if fmt == "svg":
        h1 = int(cost.split('height="', 1)[1].split('"', 1)[0])
        h2 = int(budget.split('height="', 1)[1].split('"', 1)[0])
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{h1 + h2}">{cost}'
            f'<g transform="translate(0,{h1})">{budget}</g></svg>\n'
        )
    if fmt != "html":
        raise ReportError(f"cannot plot as {fmt!r}: write a .html or .svg file")
    return (
        '<!doctype html><html><head><meta charset="utf-8"><title>ragtoll report</title>'
        "<style>body{font-family:sans-serif;margin:2em}pre{font-size:12px}</style></head><body>"
        f"<h1>ragtoll report: {len(records)} tasks</h1>{cost}<br>{budget}"
        f"<h2>Evaluation table</h2><pre>{_esc(table_html)}</pre></body></html>\n"
    )
