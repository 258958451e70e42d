"""Judging answers against gold, auditing every received chunk against the corpus ACLs, and the
side-by-side table of the two runs. Pure: values in, values and text out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..report import Row, overall, render_table
from .corpus import PRINCIPALS, Chunk, may_see

ABSTENTIONS = ("could not find", "cannot find", "can't find", "do not know", "don't know", "no information")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[^a-z0-9.\- ]", " ", text.lower())).strip()


def is_abstention(answer: str) -> bool:
    low = answer.lower()
    return any(p in low for p in ABSTENTIONS)


def judge(answer: str | None, gold: str | None) -> bool:
    """Right when the answer states the gold fact, or, for gold None ("not in the documents this
    principal may see"), when the agent says it could not find it. No answer at all is wrong."""
    if answer is None:
        return False
    if gold is None:
        return is_abstention(answer)
    return not is_abstention(answer) and _norm(gold) in _norm(answer)


@dataclass(frozen=True)
class AclFinding:
    task: str
    principal: str
    chunk: str
    groups: tuple[str, ...]


def audit_acl(
    received: Sequence[tuple[str, str, Sequence[str]]], chunks: Sequence[Chunk]
) -> tuple[int, list[AclFinding]]:
    """(chunks checked, violations) over (task, principal, chunk ids received) triples.
    An id missing from the corpus is a violation too: the agent got something nobody vetted."""
    acl = {c.id: c.groups for c in chunks}
    checked, bad = 0, []
    for task, principal, ids in received:
        groups = PRINCIPALS[principal]
        for cid in ids:
            checked += 1
            if cid not in acl or not may_see(groups, acl[cid]):
                bad.append(AclFinding(task, principal, cid, acl.get(cid, ())))
    return checked, bad


def _pct(new: float | None, old: float | None) -> str:
    if new is None or old is None or old == 0:
        return "-"
    return f"{(new - old) / old * 100:+.0f}%"


def _money(v: float | None) -> str:
    return "-" if v is None else f"${v:.4f}"


def compare(
    shadow: Sequence[Mapping[str, Any]], enforced: Sequence[Mapping[str, Any]]
) -> tuple[str, Row, Row]:
    """The two runs side by side, every number computed from ragtoll's task records."""
    a, b = overall(shadow, "shadow"), overall(enforced, "enforced")

    def acc(r: Row) -> str:
        return f"{r.correct}/{r.judged} ({(r.accuracy or 0) * 100:.1f}%)"

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v * 100:.1f}%"

    body = [
        ["tasks", str(a.tasks), str(b.tasks), ""],
        ["correct answers", acc(a), acc(b), f"{((b.accuracy or 0) - (a.accuracy or 0)) * 100:+.1f} pts"],
        [
            "retrieval calls / task",
            f"{a.retrieval_calls:.2f}",
            f"{b.retrieval_calls:.2f}",
            _pct(b.retrieval_calls, a.retrieval_calls),
        ],
        [
            "rerank calls / task",
            f"{a.rerank_calls:.2f}",
            f"{b.rerank_calls:.2f}",
            _pct(b.rerank_calls, a.rerank_calls),
        ],
        ["LLM steps / task", f"{a.steps:.2f}", f"{b.steps:.2f}", _pct(b.steps, a.steps)],
        [
            "context tokens / task",
            f"{a.context_tokens:.0f}",
            f"{b.context_tokens:.0f}",
            _pct(b.context_tokens, a.context_tokens),
        ],
        ["cost / task", _money(a.cost_usd), _money(b.cost_usd), _pct(b.cost_usd, a.cost_usd)],
        [
            "cost / correct answer",
            _money(a.cost_per_correct_usd),
            _money(b.cost_per_correct_usd),
            _pct(b.cost_per_correct_usd, a.cost_per_correct_usd),
        ],
        [
            "budget exhaustion rate",
            f"{rate(a.exhaustion_rate)} (would: {rate(a.would_exhaust_rate)})",
            rate(b.exhaustion_rate),
            "",
        ],
        ["cache hit rate", rate(a.cache_hit_rate), rate(b.cache_hit_rate), ""],
        [
            "task latency p95",
            f"{a.latency_p95_ms:.0f} ms",
            f"{b.latency_p95_ms:.0f} ms",
            _pct(b.latency_p95_ms, a.latency_p95_ms),
        ],
    ]
    return render_table(["", "shadow", "budgets + cache", "change"], body), a, b
