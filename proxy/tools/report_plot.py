"""`ragtoll report --plot` and `ragtoll demo --plot`: one figure comparing runs of task records.

Draws the values of report_compare.py with matplotlib (the `plot` extra), the only module that
imports it: offscreen on the Agg canvas, no pyplot state, no display. Panels: cost and retrieval
calls per task by group, correct answers by group, where budgets bit, the costliest tasks; when
the records carry them, the context economy: groundedness, cached-input share and evidence tokens
resent per task by group.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from . import report_compare as rc
from .report import ReportError, format_usd

FORMATS = ("png", "svg", "pdf")
PANEL_IN = 6.3  # inches of plot area in each of the two columns of bar panels
DPI = 110
_STYLE = {
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 8,
    "svg.hashsalt": "ragtoll",
}
# Okabe-Ito: told apart with any colour vision, and none of them reads as "right" or "wrong"
RUN_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
# the context economy row: (Row field, title, share drawn in percent)
ECONOMY = (
    ("groundedness", "Groundedness of the last answer by {by} (mean of graded tasks)", True),
    ("cached_input_share", "Cached input by {by} (provider cache reads / LLM input)", True),
    ("evidence_tokens_resent", "Evidence tokens resent per task by {by} (mean)", False),
)
# a value label stays readable where it crosses a limit line or a grid line
_LABEL_BOX = {"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 0.6}


def plot_format(path: str) -> str:
    """The figure format named by the file's extension; anything else is a ReportError."""
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in FORMATS:
        raise ReportError(f"cannot plot to {path!r}: name a .png, .svg or .pdf file")
    return ext


def render(
    runs: Sequence[rc.Run],
    by: str,
    path: str,
    *,
    profiles: Mapping[str, Mapping[str, float]] | None = None,
    top: int = 8,
) -> None:
    """Write the comparison figure of `runs` (one colour each) to `path` (.png, .svg or .pdf).

    `profiles` (profile -> {dimension: limit}) draws each group's limits on the cost and retrieval
    panels when all its tasks ran under one known profile; without it bars scale to the data.
    """
    fmt = plot_format(path)
    fig = figure(runs, by, profiles=profiles, top=top)
    with matplotlib.rc_context(_STYLE):  # type: ignore[arg-type]  # rcParams keys are Literal-typed
        fig.savefig(path, format=fmt, dpi=DPI)  # Agg for PNG; savefig switches to the SVG/PDF canvas


def figure(
    runs: Sequence[rc.Run],
    by: str,
    *,
    profiles: Mapping[str, Mapping[str, float]] | None = None,
    top: int = 8,
) -> Figure:
    """The comparison figure on an Agg canvas (see `render`), for callers that save or inspect it."""
    rc.check_runs(runs, by)
    if len(runs) > len(RUN_COLOURS):
        raise ReportError(f"at most {len(RUN_COLOURS)} runs fit one figure, got {len(runs)}")
    with matplotlib.rc_context(_STYLE):  # type: ignore[arg-type]
        fig = _draw(runs, by, profiles or {}, top)
    FigureCanvasAgg(fig)
    return fig


def _draw(runs: Sequence[rc.Run], by: str, profiles: Mapping[str, Mapping[str, float]], top: int) -> Figure:
    groups = rc.groups_of(runs, by)
    colours = {run.label: RUN_COLOURS[i] for i, run in enumerate(runs)}
    hits = [rc.budget_hits(run, by, groups) for run in runs]
    dims = rc.hit_dimensions(hits)
    slow = rc.runaways(runs, by, top)
    # heat maps side by side, or one under another when their columns would not fit in a row
    stacked = len(runs) * len(groups) > 16
    heat_h = (1.2 + 0.42 * max(len(dims), 1)) * (len(runs) if stacked and dims else 1)
    # the costliest-tasks row grows so that each bar stays taller than its 7 pt note (~0.13 in)
    middle_h = max(4.2, 0.13 * len(runs) * len(slow) / 0.8 + 1.4)
    economy = {key: rc.means(runs, by, key) for key, _, _ in ECONOMY}
    recorded = any(by_group for by_run in economy.values() for by_group in by_run.values())
    heights = [4.2, middle_h, heat_h] + ([3.8] if recorded else [])
    fig = Figure(figsize=(15, 1.0 + sum(heights)), layout="constrained")
    grid = fig.add_gridspec(len(heights), 2, height_ratios=heights)
    limits = rc.group_limits(runs, by, profiles)
    drawn = {"max_cost_usd", "max_retrieval_calls"}  # the limits the bar panels can show

    _bars(
        fig.add_subplot(grid[0, 0]),
        groups,
        rc.means(runs, by, "cost_usd"),
        colours,
        title=f"Cost per task by {by} (mean, USD)",
        label=format_usd,
        money=True,
        limits={g: lim["max_cost_usd"] for g, lim in limits.items() if "max_cost_usd" in lim},
    )
    _bars(
        fig.add_subplot(grid[0, 1]),
        groups,
        rc.means(runs, by, "retrieval_calls"),
        colours,
        title=f"Retrieval calls per task by {by} (mean)",
        label=lambda v: f"{v:.2f}",
        limits={g: lim["max_retrieval_calls"] for g, lim in limits.items() if "max_retrieval_calls" in lim},
    )
    _accuracy(fig.add_subplot(grid[1, 0]), [*groups, "all"], rc.accuracy(runs, by), colours, by)
    _runaways(fig.add_subplot(grid[1, 1]), slow, colours, by)
    _heat(fig, grid[2, :], hits, dims, by)
    if recorded:
        _economy(fig, grid[3, :], groups, economy, colours, by)

    handles: list[Any] = [Patch(facecolor=c, label=f"run {label}") for label, c in colours.items()]
    if any(drawn & set(lim) for lim in limits.values()):
        handles.append(Line2D([], [], color="black", linestyle="--", label="limit of the group's profile"))
    # the title rides on the legend: a suptitle and an "outside" legend are laid out on top of each other
    names = _wrap(" vs ".join(f"{run.label} ({len(run.records)} tasks)" for run in runs), 110)
    fig.legend(
        handles=handles,
        loc="outside upper center",
        ncols=len(handles),
        frameon=False,
        title=f"ragtoll report by {by}: {names}",
        title_fontproperties={"size": 13, "weight": "bold"},
    )
    return fig


def _money_axis(axis: Any, ticks: Iterable[float]) -> None:
    # as few decimals as tell every tick apart: $0.05, $0.10, not $0.050, $0.10
    values = [float(t) for t in ticks]
    decimals = next((d for d in range(9) if all(abs(round(t, d) - t) < 1e-12 for t in values)), 9)
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"${v:.{decimals}f}"))


def _wrap(label: str, width: int) -> str:
    """Lines of at most `width` characters, broken after spaces, `_`, `-`, `.`, `/` (never inside a word)."""
    lines = [""]
    for piece in re.split(r"(?<=[\s_\-./])", label):
        if lines[-1] and len(lines[-1]) + len(piece.rstrip()) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line.strip() for line in lines)


def _xaxis(ax: Axes, groups: Sequence[str], span_in: float) -> None:
    """Group names under their bars: wrapped to the room each has, upright if a word still does not fit."""
    width = max(6, int(span_in * 72 / len(groups) / 6))  # ~6 pt per 9 pt character
    labels = [_wrap(g, width) for g in groups]
    if all(len(line) <= width for label in labels for line in label.splitlines()):
        ax.set_xticks(range(len(groups)), labels)
        return
    # one upright line each: a group apart they cannot touch (slanted ones' boxes do, wrapped ones' text)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.tick_params(axis="x", labelrotation=90)


def _offsets(n: int) -> tuple[float, list[float]]:
    width = 0.8 / n
    return width, [(i - (n - 1) / 2) * width for i in range(n)]


def _bars(
    ax: Axes,
    groups: Sequence[str],
    values: Mapping[str, Mapping[str, float]],
    colours: Mapping[str, str],
    *,
    title: str,
    label: Any,
    limits: Mapping[str, float],
    money: bool = False,
    span_in: float = PANEL_IN,
) -> None:
    width, offsets = _offsets(len(values))
    upright = len(values) * len(groups) > 10  # value labels turned upright when bars are narrow
    peak = 0.0
    for (run, by_group), dx in zip(values.items(), offsets, strict=True):
        xs = [i + dx for i, g in enumerate(groups) if g in by_group]
        ys = [by_group[g] for g in groups if g in by_group]
        bars = ax.bar(xs, ys, width * 0.92, color=colours[run])
        ax.bar_label(
            bars,
            [label(v) for v in ys],
            padding=2,
            fontsize=7,
            zorder=4,
            bbox=_LABEL_BOX,
            rotation=90 if upright else 0,
        )
        peak = max([peak, *ys])
    for i, g in enumerate(groups):
        if g in limits:
            ax.hlines(limits[g], i - 0.45, i + 0.45, colors="black", linestyles="--", linewidth=1.2)
            peak = max(peak, limits[g])
    ax.set_ylim(0, (peak or 1) * (1.45 if upright else 1.22))  # room for the labels above the tallest bar
    if money:
        _money_axis(ax.yaxis, ax.get_yticks())
    _xaxis(ax, groups, span_in)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)


def _economy(fig: Figure, cell: Any, groups: Sequence[str], values: Mapping[str, Mapping[str, Mapping[str, float]]],
             colours: Mapping[str, str], by: str) -> None:
    """Groundedness, cached-input share and evidence tokens resent, one panel each (no bar: not recorded)."""
    cells = cell.subgridspec(1, len(ECONOMY))
    for i, (key, title, share) in enumerate(ECONOMY):
        ax = fig.add_subplot(cells[0, i])
        data = {run: {g: v * 100 if share else v for g, v in by_group.items()} for run, by_group in values[key].items()}
        _bars(ax, groups, data, colours, title=_wrap(title.format(by=by), 48),
              label=(lambda v: f"{v:.0f}%") if share else (lambda v: f"{v:,.0f}"), limits={},
              span_in=PANEL_IN * 2 / len(ECONOMY))
        if share:
            ax.set_ylim(0, 125)
            ax.set_yticks([0, 25, 50, 75, 100], ["0%", "25%", "50%", "75%", "100%"])
        if not any(data.values()):
            ax.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=ax.transAxes, color="#555")


def _accuracy(
    ax: Axes,
    groups: Sequence[str],
    acc: Mapping[str, Mapping[str, rc.Accuracy]],
    colours: Mapping[str, str],
    by: str,
) -> None:
    width, offsets = _offsets(len(acc))
    for (run, by_group), dx in zip(acc.items(), offsets, strict=True):
        for i, g in enumerate(groups):
            a = by_group.get(g)
            if a is None:
                continue
            if a.rate is None:  # no outcome was posted for these tasks: no bar, say so
                ax.text(
                    i + dx, 2, "not judged", rotation=90, ha="center", va="bottom", fontsize=7, color="#555"
                )
                continue
            bar = ax.bar(i + dx, a.rate * 100, width * 0.92, color=colours[run])
            ax.bar_label(
                bar,
                [f"{a.correct}/{a.judged}"],
                padding=2,
                fontsize=7,
                rotation=90 if len(acc) * len(groups) > 10 else 0,
            )
            if a.tasks > a.judged:  # up the bar's foot, where no neighbour's label can be
                ax.text(
                    i + dx,
                    2,
                    f"+{a.tasks - a.judged} not judged",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    bbox=_LABEL_BOX,
                    zorder=4,
                )
    ax.set_ylim(0, 118)
    ax.set_yticks([0, 25, 50, 75, 100], ["0%", "25%", "50%", "75%", "100%"])
    _xaxis(ax, groups, PANEL_IN)
    ax.set_title(f"Correct answers by {by} (bar: share of judged tasks; label: correct/judged)")
    ax.grid(axis="y", alpha=0.3)


def _short(dim: str) -> str:
    return dim.removeprefix("max_").removesuffix("_usd").removesuffix("_ms").replace("_", " ")


def _runaways(ax: Axes, slow: Sequence[rc.Runaway], colours: Mapping[str, str], by: str) -> None:
    labels = list(colours)
    width, offsets = _offsets(len(labels))
    peak = max((c for t in slow for c in t.cost_usd.values()), default=0.0) or 1.0
    for row, task in enumerate(slow):
        for run, dy in zip(labels, offsets, strict=True):
            if run not in task.cost_usd:
                continue
            cost = task.cost_usd[run]
            ax.barh(row + dy, cost, width * 0.92, color=colours[run])
            note = format_usd(cost)
            stop = task.stopped.get(run)
            if stop and stop.startswith("would: "):
                note += "; would hit " + ", ".join(_short(d) for d in stop[7:].split(", "))
            elif stop:
                note += f"; stopped by {_short(stop)}"
            if task.correct.get(run) is False:
                note += "; wrong answer"
            ax.text(cost + peak * 0.01, row + dy, note, va="center", fontsize=7)
    ax.set_yticks(range(len(slow)), [f"{t.key} ({t.group})" for t in slow])
    ax.invert_yaxis()  # costliest first
    ax.set_xlim(0, peak * 1.75)  # the notes sit right of the bars
    _money_axis(ax.xaxis, ax.get_xticks())
    ax.set_xlabel("cost of the task")
    ax.set_ylabel(f"task ({by})")
    ax.set_title(f"Costliest {len(slow)} tasks: cost in each run and the limit they hit")
    ax.grid(axis="x", alpha=0.3)


def _heat(fig: Figure, cell: Any, hits: Sequence[rc.BudgetHits], dims: Sequence[str], by: str) -> None:
    # a subfigure of its own: one heading for the row, short titles per run that cannot collide
    sub = fig.add_subfigure(cell)
    sub.suptitle(
        f"Where budgets bit: tasks that hit each limit / tasks in the {by} (colour: that share)",
        fontsize=10,
        fontweight="bold",
    )
    if not dims:
        ax = sub.add_subplot()
        ax.axis("off")
        ax.text(
            0.5,
            0.5,
            "no call was refused by a limit, and none would have been (shadow)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        return
    stacked = len(hits) * len(hits[0].groups) > 16
    shape = (len(hits), 1) if stacked else (1, len(hits))
    axes = list(sub.subplots(*shape, squeeze=False).flat)
    span = 12.0 if stacked else 12.0 / len(hits)  # inches of heat map per run, without labels and colour bar
    width = int(span * 72 / 7)  # characters a title may take
    image = None
    for ax, h in zip(axes, hits, strict=True):
        share = [[h.tasks_hit.get(d, {}).get(g, 0) / (h.tasks.get(g) or 1) for g in h.groups] for d in dims]
        image = ax.imshow(share, cmap="Reds", vmin=0, vmax=1, aspect="auto")
        for i, d in enumerate(dims):
            for j, g in enumerate(h.groups):
                n, of = h.tasks_hit.get(d, {}).get(g, 0), h.tasks.get(g, 0)
                ax.text(
                    j,
                    i,
                    f"{n}/{of}" if of else "-",
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if of and n / of > 0.6 else "black",
                )
        _xaxis(ax, h.groups, span)
        ax.set_yticks(range(len(dims)), list(dims))
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        what = [*(["refused"] if h.refused else []), *(["would have refused (shadow)"] if h.shadow else [])]
        ax.set_title(
            _wrap(
                f"{h.label}: tasks a limit {' or '.join(what)}" if what else f"{h.label}: no limit hit", width
            )
        )
    assert image is not None
    bar = sub.colorbar(image, ax=list(axes), shrink=0.9, pad=0.01)
    bar.set_label("share of the tasks")
