"""Outcome stage: a verdict on the task carried in baggage (`ragtoll.outcome=correct|incorrect`),
signed with the operator's key (`ragtoll.outcome.sig`, from `ragtoll sign-outcome`), is recorded
as `POST /admin/tasks/{id}/outcome` records one. An unsigned verdict is ignored (a span note):
verdicts feed `report` and `recommend`. It never answers or fails a call."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ragtoll.instrumentation import semconv as sc

from ..core.signing import verify_outcome
from ..request.exchange import Exchange, Stage, contract


class OutcomeStage(Stage):
    contract = contract(end_reads="task span")

    def __init__(self, record: Callable[[str, bool], Awaitable[object]], timeout_s: float, *,
                 hmac_key: bytes | None = None) -> None:
        """`record(task_id, correct)`: where verdicts go (tasks.records.TaskEnder.record_outcome);
        `hmac_key`: the operator's key (secrets.budget_hmac_key); None accepts no baggage verdict."""
        self.record = record
        self.timeout_s = timeout_s
        self.hmac_key = hmac_key

    async def on_end(self, ex: Exchange) -> None:
        if ex.task is None:
            return
        verdict, note = verify_outcome(dict(ex.task.baggage), ex.task.id, self.hmac_key)
        if note and ex.span is not None:
            ex.span.set_attribute(sc.BUDGET_NOTES, [note])
        if verdict is None:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.record(ex.task.id, verdict)
        except Exception as exc:  # noqa: BLE001 - a verdict that cannot be written never fails the call
            if ex.span is not None:
                ex.span.add_event(sc.EVENT_DEGRADED, {"reason": f"outcome not recorded: {type(exc).__name__}"})
