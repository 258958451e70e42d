"""Runs of task records side by side: the numbers behind every panel of `ragtoll report --plot`.

Pure: parsed records in, values out. It must not import matplotlib (report_plot.py draws these
values) nor any I/O library. A run is one records file or stream with a label; a task is matched
across runs by `task_keys`, its id without what every id of its run shares.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from .report import (
    DIMENSION_OF,
    GROUPS,
    ReportError,
    Row,
    format_rows,
    render_table,
    summarize,
    table_cells,
    table_header,
)

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Run:
    label: str
    records: Sequence[Record]


def run_labels(sources: Sequence[str], labels: Sequence[str] | None = None) -> list[str]:
    """One label per source: `labels` if given (as many as sources), else each file's stem.

    Two files with the same stem (`a/enforced.jsonl`, `b/enforced.jsonl`) get their folder in front.
    """
    if labels:
        if len(labels) != len(sources):
            raise ReportError(f"{len(labels)} --label for {len(sources)} record sources; give one per source")
        if len(set(labels)) != len(labels):
            raise ReportError(f"run labels must differ, got {', '.join(labels)}")
        return list(labels)
    stems = [os.path.splitext(os.path.basename(s.rstrip("/")))[0] or s for s in sources]
    out = []
    for source, stem in zip(sources, stems, strict=True):
        if stems.count(stem) > 1:
            parent = os.path.basename(os.path.dirname(os.path.abspath(source)))
            stem = f"{parent}/{stem}"
        out.append(stem)
    if len(set(out)) != len(out):
        raise ReportError(f"record sources {', '.join(sources)} need distinct --label values")
    return out


def check_runs(runs: Sequence[Run], by: str) -> None:
    if by not in GROUPS:
        raise ReportError(f"cannot group by {by!r}; expected one of {', '.join(GROUPS)}")
    for run in runs:
        if not run.records:
            raise ReportError(f"run {run.label!r} has no task records")
    if not runs:
        raise ReportError("no task records")


# ---- the table: one row per run and group ------------------------------------------------------


def rows_by_run(runs: Sequence[Run], by: str) -> dict[str, dict[str, Row]]:
    """run label -> group -> its evaluation row (`summarize`), the "all" row included."""
    check_runs(runs, by)
    return {run.label: {row.group: row for row in summarize(run.records, by)} for run in runs}


def format_runs(runs: Sequence[Run], fmt: str, by: str) -> str:
    """The evaluation table of several runs: a leading `run` column (a `run` key in json and csv)."""
    table = rows_by_run(runs, by)
    if fmt in ("json", "csv"):
        parts = [format_rows(list(rows.values()), fmt, by) for rows in table.values()]
        if fmt == "csv":  # one header, then every run's rows with its label in front
            lines = [f"run,{parts[0].splitlines()[0]}"]
            for label, part in zip(table, parts, strict=True):
                lines += [f"{_csv_field(label)},{line}" for line in part.splitlines()[1:]]
            return "\n".join(lines) + "\n"
        merged = [
            {"run": label, **item}
            for label, part in zip(table, parts, strict=True)
            for item in orjson.loads(part)
        ]
        return orjson.dumps(merged, option=orjson.OPT_INDENT_2).decode()
    if fmt != "table":
        raise ReportError(f"unknown format {fmt!r}; expected table, json or csv")
    body = [[label, *table_cells(row)] for label, rows in table.items() for row in rows.values()]
    return render_table(["run", *table_header(by)], body, left=2)


def _csv_field(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if re.search(r'[",\n]', text) else text


# ---- grouped bars: cost, retrieval calls, accuracy ------------------------------------------------


def groups_of(runs: Sequence[Run], by: str) -> list[str]:
    """Every group any run has, sorted (the x axis of the grouped bars)."""
    return sorted({str(r.get(by) or "-") for run in runs for r in run.records})


def means(runs: Sequence[Run], by: str, key: str) -> dict[str, dict[str, float]]:
    """run label -> group -> `key` of the group's row (a Row field: cost_usd, retrieval_calls,
    groundedness, ...); a group whose row has no value for it (None: not recorded) is left out."""
    return {
        label: {g: float(v) for g, row in rows.items() if g != "all" and (v := getattr(row, key)) is not None}
        for label, rows in rows_by_run(runs, by).items()
    }


@dataclass(frozen=True)
class Accuracy:
    correct: int
    judged: int  # tasks with an outcome; the others do not count
    tasks: int

    @property
    def rate(self) -> float | None:
        return self.correct / self.judged if self.judged else None


def accuracy(runs: Sequence[Run], by: str) -> dict[str, dict[str, Accuracy]]:
    """run label -> group (and "all") -> correct answers over judged tasks."""
    return {
        label: {g: Accuracy(row.correct, row.judged, row.tasks) for g, row in rows.items()}
        for label, rows in rows_by_run(runs, by).items()
    }


def group_limits(
    runs: Sequence[Run], by: str, profiles: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """group -> {dimension: limit} of the one profile its tasks ran under in every run.

    A group whose tasks ran under several profiles, or under one `profiles` does not know, has no
    single limit to draw, so it is left out.
    """
    used: dict[str, set[str]] = {}
    for run in runs:
        for r in run.records:
            used.setdefault(str(r.get(by) or "-"), set()).add(str(r.get("profile") or "-"))
    out = {}
    for group, names in used.items():
        if len(names) == 1 and (name := next(iter(names))) in profiles:
            out[group] = {dim: float(v) for dim, v in profiles[name].items()}
    return out


# ---- where budgets bit ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetHits:
    """For one run: per dimension and group, the tasks a limit refused (or in shadow mode would have).

    `tasks_hit[dim][group]` counts tasks with at least one refused (or would-be refused) call on
    `dim`; `calls[dim][group]` counts those calls. `refused` is False when every hit is a shadow one.
    """

    label: str
    groups: tuple[str, ...]
    tasks: dict[str, int]  # group -> tasks in the run
    tasks_hit: dict[str, dict[str, int]]
    calls: dict[str, dict[str, int]]
    refused: bool
    shadow: bool


def budget_hits(run: Run, by: str, groups: Sequence[str] | None = None) -> BudgetHits:
    groups = list(groups) if groups is not None else groups_of([run], by)
    tasks = {g: 0 for g in groups}
    hit: dict[str, dict[str, int]] = {}
    calls: dict[str, dict[str, int]] = {}
    refused = shadow = False
    for r in run.records:
        group = str(r.get(by) or "-")
        tasks[group] = tasks.get(group, 0) + 1
        books = (r.get("rejections") or {}, r.get("would_reject") or {})
        refused = refused or any(books[0].values())
        shadow = shadow or any(books[1].values())
        for dim in {d for book in books for d, n in book.items() if n}:
            n = sum(int(book.get(dim) or 0) for book in books)
            hit.setdefault(dim, {}).setdefault(group, 0)
            hit[dim][group] += 1
            calls.setdefault(dim, {}).setdefault(group, 0)
            calls[dim][group] += n
    return BudgetHits(run.label, tuple(groups), tasks, hit, calls, refused, shadow)


def hit_dimensions(hits: Sequence[BudgetHits]) -> list[str]:
    """Dimensions any run hit, in the budget's own order (DIMENSION_OF), unknown names last."""
    order = list(DIMENSION_OF.values())
    dims = {d for h in hits for d in h.tasks_hit}
    return sorted(dims, key=lambda d: (order.index(d) if d in order else len(order), d))


# ---- the runaway tasks ---------------------------------------------------------------------------

_SEP = re.compile(r"([-_.:/]+)")


def task_keys(records: Sequence[Record]) -> dict[str, str]:
    """task id -> the id without the separator-delimited parts every id of the run starts or ends with.

    The demo's `demo-690e16-shadow-q08` and `demo-690e16-enforced-q08` both become `q08`, so the
    same task is found in both runs. With one task, or when stripping would make ids clash, the
    full ids are the keys.
    """
    ids = [str(r["task_id"]) for r in records]
    if len(set(ids)) < 2:
        return {i: i for i in ids}
    split = [_SEP.split(i) for i in ids]
    head = 0
    while all(len(p) > head + 1 and p[head] == split[0][head] for p in split):
        head += 1
    tail = 0
    while all(len(p) - head > tail + 1 and p[-1 - tail] == split[0][-1 - tail] for p in split):
        tail += 1
    keys = {}
    for i, parts in zip(ids, split, strict=True):
        core = parts[head : len(parts) - tail]
        keys[i] = "".join(core).strip("-_.:/") or i
    if len(set(keys.values())) != len(set(ids)):
        return {i: i for i in ids}
    return keys


@dataclass(frozen=True)
class Runaway:
    key: str  # the matched task (see task_keys)
    group: str
    cost_usd: dict[str, float]  # run label -> the task's cost in that run (absent: not in the run)
    stopped: dict[str, str]  # run label -> the limit that refused it (enforced) or would have ("would ...")
    correct: dict[str, bool | None]  # run label -> its outcome (None: not judged)


def runaways(runs: Sequence[Run], by: str, top: int = 8) -> list[Runaway]:
    """The `top` tasks by their highest cost in any run, costliest first, with their cost in every run."""
    if top < 1:
        raise ReportError(f"top {top!r}: show at least one task")
    found: dict[str, Runaway] = {}
    for run in runs:
        keys = task_keys(run.records)
        for r in run.records:
            key = keys[str(r["task_id"])]
            entry = found.setdefault(key, Runaway(key, str(r.get(by) or "-"), {}, {}, {}))
            entry.cost_usd[run.label] = float(r["cost_usd"])
            entry.correct[run.label] = (r.get("outcome") or {}).get("correct")
            if r.get("exhausted"):
                entry.stopped[run.label] = str(r["exhausted"])
            elif would := [d for d, n in (r.get("would_reject") or {}).items() if n]:
                entry.stopped[run.label] = "would: " + ", ".join(sorted(would))
    ranked = sorted(found.values(), key=lambda t: (-max(t.cost_usd.values()), t.key))
    return ranked[:top]
