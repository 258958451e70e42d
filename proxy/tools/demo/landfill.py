"""The context landfill ragtoll measured during a demo run: per task, the prompt tokens that were
retrieved evidence and those of them already sent in an earlier prompt of the task (the evidence
stage's `ragtoll.evidence.prompt_tokens` / `.duplicate_tokens` on each LLM call span)."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from ragtoll.instrumentation import semconv as sc


class LandfillMeter(SpanProcessor):
    """A span processor that sums the two evidence counts of ended call spans by task id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, tuple[int, int]] = {}

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        if sc.EVIDENCE_DUPLICATE_TOKENS not in attrs:
            return
        task = str(attrs.get(sc.TASK_ID, ""))
        evidence, duplicate = int(attrs.get(sc.EVIDENCE_PROMPT_TOKENS, 0)), int(attrs[sc.EVIDENCE_DUPLICATE_TOKENS])
        with self._lock:
            e, d = self._tasks.get(task, (0, 0))
            self._tasks[task] = (e + evidence, d + duplicate)

    def totals(self, task_ids: Iterable[str]) -> tuple[int, int]:
        """(evidence tokens in prompts, of them resent) over `task_ids`."""
        with self._lock:
            pairs = [self._tasks.get(t, (0, 0)) for t in task_ids]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)
