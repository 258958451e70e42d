"""The evaluation table over task records (the budgets sink's output); limits: recommend.py.

Pure core: `summarize` and the formatters take parsed records and return values or
text. I/O shell: `read_jsonl` and `read_stream` (through the store that writes the records). Record keys are the
task-record contract: task_id, profile, class, route, duration_ms, calls, steps, retrieval_calls,
unique_queries, rerank_calls, context_tokens, completion_tokens, cost_usd, cache_hits,
rejections, exhausted, outcome, end_reason.
"""

from __future__ import annotations

import asyncio
import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import orjson

from ..errors import RagtollError, StoreUnavailable
from ..redact import redact

GROUPS = ("profile", "class", "route")
# record key -> the budget dimension that limits it (max_prompt_tokens and max_stalled_retrievals
# are per call / per streak, so a task total says nothing about them)
DIMENSION_OF = {
    "steps": "max_steps",
    "calls": "max_calls",
    "retrieval_calls": "max_retrieval_calls",
    "unique_queries": "max_unique_queries",
    "rerank_calls": "max_rerank_calls",
    "context_tokens": "max_context_tokens",
    "completion_tokens": "max_completion_tokens",
    "cost_usd": "max_cost_usd",
    "duration_ms": "max_latency_ms",
}
_NUMERIC = tuple(DIMENSION_OF) + ("cache_hits",)


class ReportError(RagtollError):
    """Unreadable task records; the message names the source and line."""

    code = "report_input_invalid"


# ---- reading (I/O shell) ------------------------------------------------------------------------


def parse_record(raw: Any, where: str) -> dict[str, Any]:
    """One record, checked and with numeric fields normalised; bad input names `where`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("task_id"), str):
        raise ReportError(f"{where}: not a task record (a JSON object with a string task_id)")
    rec = dict(raw)
    for key in _NUMERIC:
        value = rec.get(key)
        if value is None:
            rec[key] = 0
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReportError(f"{where}: field {key!r} has value {value!r}, expected a number")
    rejections = rec.get("rejections") or {}
    if not isinstance(rejections, dict):
        raise ReportError(f"{where}: field 'rejections' must be an object of dimension -> count")
    rec["rejections"] = rejections
    outcome = rec.get("outcome")
    if outcome is not None and not (isinstance(outcome, dict) and isinstance(outcome.get("correct"), bool)):
        raise ReportError(f"{where}: field 'outcome' must be null or {{\"correct\": true|false}}")
    grounded = rec.get("groundedness")
    if grounded is not None and (isinstance(grounded, bool) or not isinstance(grounded, (int, float))
                                 or not 0 <= grounded <= 1):
        raise ReportError(f"{where}: field 'groundedness' has value {grounded!r}, expected null or a share 0..1")
    for key in GROUPS:
        rec[key] = str(rec.get(key) or "-")
    return rec


OUTCOME_KIND = (
    "outcome"  # {"kind": "outcome", "task_id", "outcome": {"correct": bool}}: a verdict posted later
)


def parse_records(items: Iterable[tuple[Any, str]]) -> list[dict[str, Any]]:
    """Task records in order, each with the last outcome posted for it applied.

    Outcome entries (`kind: outcome`, written by `POST /admin/tasks/{id}/outcome`) may come before
    or after their task's record; the last one for a task wins over the record's own outcome.
    """
    records: list[dict[str, Any]] = []
    verdicts: dict[str, dict[str, bool]] = {}
    for raw, where in items:
        if isinstance(raw, dict) and raw.get("kind") == OUTCOME_KIND:
            outcome = raw.get("outcome")
            if not isinstance(raw.get("task_id"), str) or not (
                isinstance(outcome, dict) and isinstance(outcome.get("correct"), bool)
            ):
                raise ReportError(
                    f'{where}: an outcome entry needs task_id and outcome {{"correct": true|false}}'
                )
            verdicts[raw["task_id"]] = {"correct": outcome["correct"]}
            continue
        records.append(parse_record(raw, where))
    for rec in records:
        if rec["task_id"] in verdicts:
            rec["outcome"] = verdicts[rec["task_id"]]
    return records


def read_jsonl(path: str) -> list[dict[str, Any]]:
    """Records of a JSONL file and of the files the sink rotated it to (`path.N` ... `path.1`, read
    oldest first); blank lines skipped, any other bad line is an error naming its file and line."""
    import glob

    suffixes = (p[len(path) + 1:] for p in glob.glob(glob.escape(path) + ".*"))
    rotated = {int(s): f"{path}.{s}" for s in suffixes if s.isdecimal()}
    items = []
    for name in [*(rotated[n] for n in sorted(rotated, reverse=True)), path]:
        try:
            with open(name, "rb") as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            raise ReportError(f"cannot read task records {name!r}: {exc.strerror}") from exc
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                raw = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise ReportError(f"{name}:{n}: not JSON ({exc})") from exc
            items.append((raw, f"{name}:{n}"))
    return parse_records(items)


def read_stream(url: str, key: str, *, batch: int = 1000) -> list[dict[str, Any]]:
    """Records of a Redis Stream (read by the store that writes them, stores/redis.py). An entry is
    either one JSON field (any name) or flat fields."""
    from ..stores.redis import read_records  # late: only Redis deployments import redis

    try:
        entries = asyncio.run(read_records(url, key, batch=batch))
    except StoreUnavailable as exc:
        raise ReportError(f"{exc.message} ({redact(url)})") from exc
    return parse_records([(_entry(fields), f"{key}#{entry_id}") for entry_id, fields in entries])


def _entry(fields: Mapping[bytes, bytes]) -> Any:
    decoded = {k.decode(): v for k, v in fields.items()}
    if len(decoded) == 1:
        (only,) = decoded.values()
        try:
            value = orjson.loads(only)
        except orjson.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            return value
    flat: dict[str, Any] = {}
    for k, v in decoded.items():
        try:
            flat[k] = orjson.loads(v)
        except orjson.JSONDecodeError:
            flat[k] = v.decode("utf-8", "replace")
    return flat


# ---- the evaluation table (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    group: str
    tasks: int
    judged: int  # tasks with an outcome posted
    correct: int
    accuracy: float | None
    steps: float
    retrieval_calls: float  # means per task
    rerank_calls: float
    context_tokens: float
    cost_usd: float
    total_cost_usd: float
    cost_per_correct_usd: float | None  # cost of judged tasks / their correct answers
    exhaustion_rate: float
    would_exhaust_rate: float | None  # shadow mode: tasks a limit would have stopped (None: not recorded)
    cache_hit_rate: float | None  # cache hits / (hits + retrieval and rerank calls sent upstream)
    latency_p50_ms: float
    latency_p95_ms: float
    # the context economy (records' `context`, stages/context.py): the provider's cache reads / input
    # tokens, and the characters of chunk text not sent again per task (None: no context numbers)
    cached_input_share: float | None = None
    evidence_chars_saved: float | None = None
    # the evidence stage's (records' `groundedness` and `evidence`, stages/evidence.py): the mean
    # groundedness of the graded tasks' last answers, and evidence prompt tokens resent per task
    groundedness: float | None = None
    graded: int = 0  # tasks whose last answer was graded
    evidence_tokens_resent: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default); 0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    rank = (len(xs) - 1) * p / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def summarize(records: Iterable[Mapping[str, Any]], by: str = "profile") -> list[Row]:
    """One row per value of `by` (sorted), then an "all" row."""
    if by not in GROUPS:
        raise ReportError(f"cannot group by {by!r}; expected one of {', '.join(GROUPS)}")
    recs = list(records)
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for rec in recs:
        groups.setdefault(str(rec.get(by) or "-"), []).append(rec)
    rows = [_row(name, groups[name]) for name in sorted(groups)]
    if recs:
        rows.append(_row("all", recs))
    return rows


def overall(records: Iterable[Mapping[str, Any]], name: str = "all") -> Row:
    """One row over all `records` (at least one)."""
    recs = list(records)
    if not recs:
        raise ReportError("no task records")
    return _row(name, recs)


def _row(name: str, recs: list[Mapping[str, Any]]) -> Row:
    n = len(recs)
    judged = [r for r in recs if r.get("outcome") is not None]
    correct = sum(1 for r in judged if r["outcome"]["correct"])

    def mean(key: str) -> float:
        return sum(float(r[key]) for r in recs) / n

    lookups = sum(r["cache_hits"] + r["retrieval_calls"] + r["rerank_calls"] for r in recs)
    judged_cost = sum(float(r["cost_usd"]) for r in judged)
    durations = [float(r["duration_ms"]) for r in recs]
    return Row(
        group=name,
        tasks=n,
        judged=len(judged),
        correct=correct,
        accuracy=correct / len(judged) if judged else None,
        steps=mean("steps"),
        retrieval_calls=mean("retrieval_calls"),
        rerank_calls=mean("rerank_calls"),
        context_tokens=mean("context_tokens"),
        cost_usd=mean("cost_usd"),
        total_cost_usd=sum(float(r["cost_usd"]) for r in recs),
        cost_per_correct_usd=judged_cost / correct if correct else None,
        exhaustion_rate=sum(1 for r in recs if r.get("exhausted")) / n,
        would_exhaust_rate=(
            sum(1 for r in recs if r.get("would_reject") or r.get("exhausted")) / n
            if any("would_reject" in r for r in recs)
            else None
        ),
        cache_hit_rate=sum(r["cache_hits"] for r in recs) / lookups if lookups else None,
        latency_p50_ms=percentile(durations, 50),
        latency_p95_ms=percentile(durations, 95),
        **_context(recs),
        **_evidence(recs),
    )


def _context(recs: list[Mapping[str, Any]]) -> dict[str, float | None]:
    """Cached-input share over the tasks' LLM input, and evidence characters not resent per task.
    The share is the ledger's (`cached_input_tokens` of `context_tokens`: every replica's calls)
    where the record has it, else its `context` object's (the replica's own calls)."""
    ctx = [r["context"] for r in recs if isinstance(r.get("context"), Mapping)]
    pairs = [(int(r["cached_input_tokens"] or 0), int(r["context_tokens"] or 0)) if "cached_input_tokens" in r
             else (int(r["context"].get("cached_input_tokens") or 0), int(r["context"].get("input_tokens") or 0))
             for r in recs if "cached_input_tokens" in r or isinstance(r.get("context"), Mapping)]
    out: dict[str, float | None] = {}
    if pairs:
        inp = sum(n for _, n in pairs)
        out["cached_input_share"] = sum(c for c, _ in pairs) / inp if inp else None
    if ctx:
        out["evidence_chars_saved"] = sum(int(c.get("evidence_chars_saved") or 0) for c in ctx) / len(recs)
    return out


def _evidence(recs: list[Mapping[str, Any]]) -> dict[str, float | int | None]:
    """Mean groundedness over the graded tasks, and evidence tokens resent per task."""
    graded = [float(r["groundedness"]) for r in recs if r.get("groundedness") is not None]
    ev = [r["evidence"] for r in recs if isinstance(r.get("evidence"), Mapping)]
    out: dict[str, float | int | None] = {"graded": len(graded)}
    if graded:
        out["groundedness"] = sum(graded) / len(graded)
    if ev:
        out["evidence_tokens_resent"] = sum(int(e.get("resent_tokens") or 0) for e in ev) / len(recs)
    return out


_COLUMNS = (
    ("group", "group", "s"),
    ("tasks", "tasks", "d"),
    ("correct", "correct", "d"),
    ("accuracy", "accuracy", "%"),
    ("steps", "steps/task", ".1f"),
    ("retrieval_calls", "retrievals/task", ".2f"),
    ("rerank_calls", "reranks/task", ".2f"),
    ("context_tokens", "ctx tokens/task", ".0f"),
    ("cost_usd", "cost/task", "$"),
    ("cost_per_correct_usd", "cost/correct", "$"),
    ("exhaustion_rate", "exhausted", "%"),
    ("would_exhaust_rate", "would exhaust", "%"),
    ("cache_hit_rate", "cache hits", "%"),
    ("latency_p50_ms", "p50 ms", ".0f"),
    ("latency_p95_ms", "p95 ms", ".0f"),
    ("cached_input_share", "cached input", "%"),
    ("evidence_chars_saved", "evidence chars not resent/task", ".0f"),
    ("evidence_tokens_resent", "evidence tokens resent/task", ".0f"),
    ("groundedness", "grounded", "%"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "%":
        return f"{value * 100:.1f}%"
    if fmt == "$":
        return format_usd(value)
    return format(value, fmt)


def format_usd(value: float, digits: int = 3) -> str:
    """Dollars to `digits` significant digits, never in exponent form: $0.0130, $0.353, $0.00000120.

    A cost per task spans six orders of magnitude (a cached lookup to a runaway investigation), so a
    fixed number of decimals either prints $0.00000 or hides the cents of the large ones.
    """
    if value == 0 or not math.isfinite(value):
        return f"${value:g}"
    if abs(value) >= 10 ** (digits - 1):
        return f"${value:,.0f}"
    decimals = digits - 1 - math.floor(math.log10(abs(value)))
    text = f"{abs(value):.{decimals}f}"
    if len(text.replace(".", "").lstrip("0")) > digits:  # rounding carried into a new digit (0.09996)
        text = f"{abs(value):.{decimals - 1}f}"
    return ("-$" if value < 0 else "$") + text


def format_rows(rows: Sequence[Row], fmt: str = "table", by: str = "profile") -> str:
    """`table` (aligned text), `json` (a list of objects) or `csv` (raw numbers)."""
    if fmt == "json":
        return orjson.dumps([r.as_dict() | {"by": by} for r in rows], option=orjson.OPT_INDENT_2).decode()
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=["by", *Row.__dataclass_fields__], lineterminator="\n")
        writer.writeheader()
        for r in rows:
            writer.writerow({"by": by, **r.as_dict()})
        return buf.getvalue()
    if fmt != "table":
        raise ReportError(f"unknown format {fmt!r}; expected table, json or csv")
    return render_table(table_header(by), [table_cells(r) for r in rows])


def table_header(by: str) -> list[str]:
    """The table's column titles; the first names what rows are grouped by."""
    # a record's route is its first call's (the one profile rules match), so say which route it is
    first = "route (first call)" if by == "route" else by
    return [first if key == "group" else title for key, title, _ in _COLUMNS]


def table_cells(row: Row) -> list[str]:
    """One row of the table as text (money to three significant digits, rates in percent)."""
    return [_cell(getattr(row, key), f) for key, _, f in _COLUMNS]


def render_table(header: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> str:
    """Aligned text columns: the first `left` columns flush left (names), the rest flush right."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=False))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(b) for b in body)]) + "\n"
