"""Outcome stage: a verdict on the task carried in baggage (`ragtoll.outcome=correct|incorrect`)
is recorded as `POST /admin/tasks/{id}/outcome` records one. It never answers or fails a call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ragtoll.instrumentation import semconv as sc

from ..request.exchange import Exchange, Stage

OUTCOME_BAGGAGE = "ragtoll.outcome"
_VERDICTS = {"correct": True, "true": True, "incorrect": False, "false": False}


class OutcomeStage(Stage):
    def __init__(self, record: Callable[[str, bool], Awaitable[object]], timeout_s: float) -> None:
        """`record(task_id, correct)`: where verdicts go (tasks.records.TaskEnder.record_outcome)."""
        self.record = record
        self.timeout_s = timeout_s

    async def on_end(self, ex: Exchange) -> None:
        raw = dict(ex.task.baggage).get(OUTCOME_BAGGAGE) if ex.task is not None else None
        if raw is None or ex.task is None:
            return
        verdict = _VERDICTS.get(raw.strip().lower())
        if verdict is None:
            if ex.span is not None:
                note = f"baggage {OUTCOME_BAGGAGE}={raw[:32]!r} ignored: expected correct or incorrect"
                ex.span.set_attribute(sc.BUDGET_NOTES, [note])
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.record(ex.task.id, verdict)
        except Exception as exc:  # noqa: BLE001 - a verdict that cannot be written never fails the call
            if ex.span is not None:
                ex.span.add_event(sc.EVENT_DEGRADED, {"reason": f"outcome not recorded: {type(exc).__name__}"})
