"""The task ender over the memory store: each ended task's record is written once, listeners
hear of it (a failing one does not stop the others), and a sweep writes in one sink call."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from ragtoll.proxy.core import budget as bm
from ragtoll.proxy.core.budget import Charge
from ragtoll.proxy.stores.base import TaskMeta
from ragtoll.proxy.stores.memory import MemoryStore
from ragtoll.proxy.tasks import records
from ragtoll.proxy.tasks.records import JsonlSink, TaskEnder


async def test_task_ender_writes_once_and_tells_listeners() -> None:
    class Sink:
        def __init__(self) -> None:
            self.records: list[dict[str, Any]] = []
            self.writes = 0

        async def append(self, records: Any) -> None:
            self.writes += 1
            self.records.extend(dict(r) for r in records)

    def broken(record: dict[str, Any]) -> None:
        raise RuntimeError("telemetry hook bug")

    store, sink, seen = MemoryStore(), Sink(), []
    ender = TaskEnder(store, sink, idle_timeout_s=1.0, wall_ms=lambda: 50_000)
    ender.listeners += [broken, seen.append]
    meta = TaskMeta("p", "", "openai", "header", "ab" * 16)
    done = await store.reserve("a", meta, {}, Charge(steps=1), 10_000)
    await store.settle("a", done.reservation, bm.Actual(), 10_000)
    await store.reserve("b", meta, {}, Charge(steps=1), 49_500)
    d = await store.reserve("c", meta, {}, Charge(steps=1), 10_000)  # still in flight: not idle
    assert d.admitted
    assert await ender.sweep() == 1
    assert [r["task_id"] for r in sink.records] == ["a"] and seen == sink.records and sink.writes == 1
    record = sink.records[0]
    assert (record["end_reason"], record["task_source"], record["trace_id"]) == ("idle", "header", "ab" * 16)
    assert record["ended_at"] == record["started_at"] and record["duration_ms"] == 0
    assert await ender.end("a", None) is None  # exactly once


async def test_a_sweep_writes_its_records_in_one_sink_call(tmp_path: Path) -> None:
    """One write per sweep, not per task: per-task thread hops fell behind a busy proxy and idle
    ledgers piled up (about half of 10,000 tasks never ended under 450 calls/s)."""
    writes: list[int] = []

    class CountingSink(JsonlSink):
        def _write(self, data: bytes) -> None:
            writes.append(data.count(b"\n"))
            super()._write(data)

    sink = CountingSink(str(tmp_path / "tasks.jsonl"))
    store = MemoryStore()
    ender = TaskEnder(store, sink, idle_timeout_s=1.0, wall_ms=lambda: 50_000)
    meta = TaskMeta("p", "", "openai", "header", "ab" * 16)
    for i in range(500):
        d = await store.reserve(f"t{i}", meta, {}, Charge(steps=1), 10_000 + i)
        await store.settle(f"t{i}", d.reservation, bm.Actual(), 10_000 + i)
    assert await ender.sweep() == 500
    assert writes == [500]
    lines = (tmp_path / "tasks.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["task_id"] for line in lines] == [f"t{i}" for i in range(500)]
    assert await store.idle_tasks(50_000) == [] and await ender.sweep() == 0 and writes == [500]


async def test_per_call_tasks_end_at_once_and_their_records_go_in_batches(tmp_path: Path) -> None:
    """`end_with_call`: the task ends now (its record returned, listeners told) and its record is
    written with the others that ended within one delay, in one sink write; at shutdown the
    records still waiting are written first."""
    writes: list[int] = []

    class CountingSink(JsonlSink):
        def _write(self, data: bytes) -> None:
            writes.append(data.count(b"\n"))
            super()._write(data)

    store, seen = MemoryStore(), []
    ender = TaskEnder(store, CountingSink(str(tmp_path / "tasks.jsonl")), idle_timeout_s=3600.0)
    ender.listeners.append(seen.append)
    meta = TaskMeta("p", "", "openai", "per-call", "cd" * 16)
    for n in range(8):
        done = await store.reserve(f"call-{n}", meta, {}, Charge(steps=1), 10_000 + n)
        await store.settle(f"call-{n}", done.reservation, bm.Actual(), 10_000 + n)
    for n in range(5):
        record = await ender.end_with_call(f"call-{n}")
        assert record is not None and record["end_reason"] == "call" and seen[-1] is record
    assert writes == []  # not yet: one write for the batch
    await asyncio.sleep(records.CALL_END_DELAY_S * 4)
    assert writes == [5]
    lines = [orjson.loads(line) for line in (tmp_path / "tasks.jsonl").read_bytes().splitlines()]
    assert [(r["task_id"], r["end_reason"]) for r in lines] == [(f"call-{n}", "call") for n in range(5)]
    assert lines[0]["ended_at"] == lines[0]["started_at"]  # at its call's end
    for n in range(5, 8):
        await ender.end_with_call(f"call-{n}")
    assert await ender.shutdown() == (0, 0)  # nothing left to end: the three ended with their calls
    assert writes == [5, 3] and store.local_tasks() == []
    assert await ender.end_with_call("call-0") is None  # ended already: nothing written twice
    await asyncio.sleep(records.CALL_END_DELAY_S * 4)
    assert writes == [5, 3]


async def test_per_call_records_wait_for_a_stalled_sink_one_write_at_a_time_and_bounded(
        monkeypatch: Any) -> None:
    """A sink that stalls (a full disk, a paused store) gets one write at a time: records of the
    calls that end meanwhile wait for the next batch, at most MAX_WAITING_RECORDS of them; past
    that the oldest are counted lost, not held. Once the sink answers, the rest are written."""
    monkeypatch.setattr(records, "MAX_WAITING_RECORDS", 20)

    class StalledSink:
        def __init__(self) -> None:
            self.open = asyncio.Event()
            self.in_flight = self.most_in_flight = 0
            self.written: list[str] = []

        async def append(self, batch: Any) -> None:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                await self.open.wait()
                self.written += [r["task_id"] for r in batch]
            finally:
                self.in_flight -= 1

    store, sink, told = MemoryStore(), StalledSink(), []
    ender = TaskEnder(store, sink, idle_timeout_s=3600.0)
    ender.on_lost = told.append  # the app counts them in ragtoll_task_records_lost_total
    meta = TaskMeta("p", "", "openai", "per-call", "cd" * 16)

    async def call(n: int) -> None:
        done = await store.reserve(f"call-{n}", meta, {}, Charge(steps=1), 10_000 + n)
        await store.settle(f"call-{n}", done.reservation, bm.Actual(), 10_000 + n)
        assert await ender.end_with_call(f"call-{n}") is not None

    await call(0)
    await asyncio.sleep(records.CALL_END_DELAY_S * 3)  # the first batch's write is stuck now
    for n in range(1, 51):
        await call(n)
        if n % 10 == 0:
            await asyncio.sleep(records.CALL_END_DELAY_S * 2)  # time for more writes, were they allowed
    assert sink.in_flight == 1 and sink.most_in_flight == 1
    assert len(ender._unwritten) == 20 and ender.sink_failures == sum(told) == 30  # 1-30 lost, 31-50 wait
    sink.open.set()
    await ender.shutdown()
    assert sink.most_in_flight == 1
    assert sink.written == ["call-0", *(f"call-{n}" for n in range(31, 51))]
