"""The outcome stage on exchanges without a server: a verdict in baggage (`ragtoll.outcome`) signed
with the operator key is recorded through the real TaskEnder into its JSONL sink; anything else
(unsigned, forged, another task's) is noted, never recorded and never an error."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.core.signing import sign_outcome
from ragtoll.proxy.stages.outcome import OutcomeStage
from ragtoll.proxy.stores.memory import MemoryStore
from ragtoll.proxy.tasks.records import JsonlSink, TaskEnder
from support.exchanges import Exchanges, answer

KEY = b"operator-hmac-key-0123456789abcdef"
OK = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


def verdicts(path: Path) -> list[tuple[str, bool]]:
    if not path.exists():
        return []
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    return [(r["task_id"], r["outcome"]["correct"]) for r in lines if r["kind"] == "outcome"]


async def run(stage: OutcomeStage, xs: Exchanges, baggage: Mapping[str, str] | None, task: str | None = "task-1",
              ) -> dict[str, Any]:
    ex = xs(baggage=baggage, task=task)
    answer(ex, OK)
    await stage.on_end(ex)
    span = xs.finished(ex)
    return {"attributes": dict(span.attributes), "events": [(e.name, dict(e.attributes or {})) for e in span.events]}


@pytest.fixture
def records(tmp_path: Path) -> Path:
    return tmp_path / "records.jsonl"


def ender_stage(records: Path, timeout_s: float = 1.0, key: bytes | None = KEY) -> OutcomeStage:
    ender = TaskEnder(MemoryStore(), JsonlSink(str(records)), idle_timeout_s=60)
    return OutcomeStage(ender.record_outcome, timeout_s, hmac_key=key)


def signed(task: str, correct: bool, raw: str | None = None) -> dict[str, str]:
    members = dict(m.split("=", 1) for m in sign_outcome(task, correct, KEY).split(","))
    if raw is not None:
        members["ragtoll.outcome"] = raw
    return members


@pytest.mark.parametrize(("raw", "correct"), [("correct", True), ("incorrect", False), (" TRUE ", True),
                                              ("False", False)])
async def test_a_signed_verdict_in_baggage_is_recorded_for_the_task(records: Path, raw: str, correct: bool) -> None:
    await run(ender_stage(records), Exchanges(), signed("task-1", correct, raw))
    assert verdicts(records) == [("task-1", correct)]


@pytest.mark.parametrize(("baggage", "key", "why"), [
    ({"ragtoll.outcome": "correct"}, KEY, "unsigned"),
    (signed("task-1", False, "correct"), KEY, "bad signature"),  # a verdict signed the other way
    (signed("other-task", True), KEY, "bad signature"),
    (signed("task-1", True), None, "no HMAC key configured"),
])
async def test_a_verdict_without_the_operators_signature_is_not_recorded(records: Path, baggage: dict[str, str],
                                                                         key: bytes | None, why: str) -> None:
    span = await run(ender_stage(records, key=key), Exchanges(), baggage)
    assert verdicts(records) == []
    assert why in span["attributes"][sc.BUDGET_NOTES][0]


async def test_no_verdict_records_nothing(records: Path) -> None:
    stage = ender_stage(records)
    await run(stage, Exchanges(), None)
    await run(stage, Exchanges(), {"ragtoll.outcome": "correct"}, task=None)  # no task to give it to
    assert verdicts(records) == []


async def test_an_unknown_verdict_is_noted_on_the_span_and_not_recorded(records: Path) -> None:
    span = await run(ender_stage(records), Exchanges(), {"ragtoll.outcome": "mostly"})
    assert verdicts(records) == []
    assert span["attributes"][sc.BUDGET_NOTES] == (
        "baggage ragtoll.outcome='mostly' ignored: expected correct or incorrect",)


class BrokenSink:
    """A record sink (the RecordSink protocol) that fails, or never answers."""

    def __init__(self, hang: bool) -> None:
        self.hang = hang

    async def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        if self.hang:
            await asyncio.sleep(3600)
        raise OSError("disk full")


@pytest.mark.parametrize(("hang", "error"), [(False, "OSError"), (True, "TimeoutError")])
async def test_a_verdict_that_cannot_be_written_is_an_event_not_an_error(hang: bool, error: str) -> None:
    ender = TaskEnder(MemoryStore(), BrokenSink(hang), idle_timeout_s=60)
    stage = OutcomeStage(ender.record_outcome, timeout_s=0.05, hmac_key=KEY)
    span = await asyncio.wait_for(run(stage, Exchanges(), signed("task-1", True)), 5)
    assert span["events"] == [(sc.EVENT_DEGRADED, {"reason": f"outcome not recorded: {error}"})]
