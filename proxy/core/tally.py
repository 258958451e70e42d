"""A task's context-economy numbers (the record's `context` object and the `evidence` object's
token counts): what one call adds to them, their names in the task's ledger, and the record
objects built from the sums. Pure: no I/O, imports nothing of ragtoll's.

The stages count a call's additions on the exchange (`Tallies`); the budget stage settles them
into the task's ledger with the call (the settle step's one store round trip), so the sums cover
every replica that served the task, whichever one ends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

CONTEXT = "context."  # ledger key prefix of the `context` object's counts
EVIDENCE = "evidence."  # ... and of the `evidence` object's token counts
# the `context` object's counts kept in the ledger under CONTEXT; its cache reads and writes are
# the ledger's own `cached_input_tokens` and `cache_write_tokens` (settled before these were)
CONTEXT_COUNTS = ("llm_calls", "input_tokens", "cache_keys_set", "breakpoints_added", "chunks_referenced",
                  "evidence_chars_saved", "results_trimmed", "searches_widened", "budget_notes")
EVIDENCE_COUNTS = ("prompt_tokens", "resent_tokens")
# every count of a record's `context` object (its share is derived from two of them)
RECORD_COUNTS = (*CONTEXT_COUNTS, "cached_input_tokens", "cache_write_tokens")


@dataclass(slots=True)
class Tallies:
    """One call's additions to its task's numbers, counted by the stages that know them: the
    context stage (its rewrites, adaptive depth, widening) and the evidence stage (evidence tokens
    in the prompt, and of those the ones this replica saw sent before). The budget stage adds the
    upstream's usage (an LLM call, its input tokens) when it settles the call."""

    cache_keys_set: int = 0
    breakpoints_added: int = 0
    chunks_referenced: int = 0
    evidence_chars_saved: int = 0
    results_trimmed: int = 0
    searches_widened: int = 0
    budget_notes: int = 0
    prompt_tokens: int = 0  # evidence tokens in this call's prompt
    resent_tokens: int = 0  # ... of those, already in an earlier prompt of the task (this replica's)

    def ledger_counts(self, *, llm_input_tokens: int = 0) -> tuple[tuple[str, int], ...]:
        """The nonzero additions under their ledger names; `llm_input_tokens`: an LLM call's input
        as the upstream reported it (the call counts as one of `llm_calls`)."""
        out = [(_ledger_name(f.name), v) for f in fields(self) if (v := getattr(self, f.name))]
        if llm_input_tokens > 0:
            out += [(CONTEXT + "llm_calls", 1), (CONTEXT + "input_tokens", llm_input_tokens)]
        return tuple(out)


def _ledger_name(name: str) -> str:
    return (EVIDENCE if name in EVIDENCE_COUNTS else CONTEXT) + name


def context_record(counts: Mapping[str, int]) -> dict[str, Any]:
    """A record's `context` object from a task's sums (CONTEXT_COUNTS with `cached_input_tokens`
    and `cache_write_tokens`; a missing count is 0)."""
    n = {k: int(counts.get(k, 0)) for k in RECORD_COUNTS}
    share = round(n["cached_input_tokens"] / n["input_tokens"], 4) if n["input_tokens"] else None
    return {"llm_calls": n["llm_calls"], "input_tokens": n["input_tokens"],
            "cached_input_tokens": n["cached_input_tokens"], "cache_write_tokens": n["cache_write_tokens"],
            "cached_input_share": share, "cache_keys_set": n["cache_keys_set"],
            "breakpoints_added": n["breakpoints_added"], "chunks_referenced": n["chunks_referenced"],
            "evidence_chars_saved": n["evidence_chars_saved"], "results_trimmed": n["results_trimmed"],
            "searches_widened": n["searches_widened"], "budget_notes": n["budget_notes"]}


def ledger_context(counters: Mapping[str, int]) -> dict[str, Any] | None:
    """The `context` object the ledger's sums make, or None when the ledger holds none of them
    (no call settled any: a store written before they were kept, or no LLM call and no rewrite)."""
    if not any(CONTEXT + k in counters for k in CONTEXT_COUNTS):
        return None
    counts = {k: counters.get(CONTEXT + k, 0) for k in CONTEXT_COUNTS}
    return context_record({**counts, "cached_input_tokens": counters.get("cached_input_tokens", 0),
                           "cache_write_tokens": counters.get("cache_write_tokens", 0)})


def ledger_evidence(counters: Mapping[str, int]) -> dict[str, int] | None:
    """The evidence token counts the ledger's sums hold, or None when it holds none."""
    if not any(EVIDENCE + k in counters for k in EVIDENCE_COUNTS):
        return None
    return {k: int(counters.get(EVIDENCE + k, 0)) for k in EVIDENCE_COUNTS}
