"""Task records: the summary written once when a task ends (admin end call, idle timeout, or the end
of a per-call task's one call).

`task_record` is pure (ledger in, dict out, fixed keys the report reads). Sinks append records:
a JSONL file by default (rotated by size), a Redis Stream when the store is Redis (through the
store's client, so this module imports no I/O library).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import orjson

from ..config import DEFAULT_RECORDS_KEEP, DEFAULT_RECORDS_MAX_BYTES
from ..core.budget import Ledger, usd
from ..core.tally import ledger_context, ledger_evidence
from ..redact import redact

log = logging.getLogger("ragtoll.records")
END_EXPLICIT = "explicit"
END_IDLE = "idle"
END_SHUTDOWN = "shutdown"
END_CALL = "call"  # a per-call task (`tasks.untracked: per-call`) ends with its one call
_SWEEP_YIELD_S = 0.002  # a sweep hands the event loop to calls at least this often
CALL_END_DELAY_S = 0.05  # records of per-call tasks are written together, this long after the first
# Records of per-call tasks waiting while a write is slow (one write at a time): past this many the
# oldest are counted lost (`sink_failures`, logged), so a stalled sink holds at most this many (~2 KB each)
MAX_WAITING_RECORDS = 10_000


def _iso(ms: int) -> str | None:
    if ms <= 0:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_record(ledger: Ledger, *, ended_ms: int, end_reason: str, outcome: Mapping[str, Any] | None) -> dict[str, Any]:
    """The record of an ended task. Keys are a contract (report and demo read them); add, never rename."""
    c = ledger.counters
    record: dict[str, Any] = {
        "task_id": ledger.task_id,
        "profile": ledger.profile,
        "class": ledger.cls or None,
        "route": ledger.route or None,
        "started_at": _iso(ledger.started_ms),
        "ended_at": _iso(ended_ms),
        "duration_ms": max(0, ledger.last_ms - ledger.started_ms),
        "calls": c.get("calls", 0),
        "steps": c.get("steps", 0),
        "retrieval_calls": c.get("retrieval_calls", 0),
        "unique_queries": c.get("unique_queries", 0),
        "rerank_calls": c.get("rerank_calls", 0),
        "context_tokens": c.get("context_tokens", 0),
        "completion_tokens": c.get("completion_tokens", 0),
        "cost_usd": round(usd(c.get("cost_nusd", 0)), 9),
        "cache_hits": c.get("cache_hits", 0),
        "rejections": dict(ledger.rejections),
        "exhausted": ledger.exhausted,
        "outcome": dict(outcome) if outcome is not None else None,
        "end_reason": end_reason,
        # beyond the contract: useful for the report and for finding the task's trace
        "task_source": ledger.source or None,
        "trace_id": ledger.trace_id or None,
        "would_reject": dict(ledger.shadow_rejections),
        "chunks_seen": ledger.chunks_seen,
        "stalled_retrievals": c.get("stalled", 0),
        "fruitless_retrievals": c.get("fruitless", 0),
        # LLM calls ragtoll rewrote to answer now (on_exhausted: finish): >0 = finished by ragtoll
        "finished_by_ragtoll": c.get("finished", 0),
        "escalated": bool(c.get("escalated", 0)),  # moved to its profile's escalate_to (the profile above)
        # of context_tokens, what the providers' prompt caches served and wrote (every replica's calls)
        "cached_input_tokens": c.get("cached_input_tokens", 0),
        "cache_write_tokens": c.get("cache_write_tokens", 0),
    }
    # the context-economy numbers every replica's calls settled (core/tally.py); absent when the
    # ledger holds none, and then the ending replica's own (the stages' `annotate`)
    for key, found in (("context", ledger_context(c)), ("evidence", ledger_evidence(c))):
        if found is not None:
            record[key] = found
    return record


class RecordSink(Protocol):
    async def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append `records` in order: a sweep's batch in one write, not one write each."""
        ...


class JsonlSink:
    """Appends one JSON line per record to `path`, rotating the file by size so records cannot fill a disk.

    Before lines would take `path` past `max_bytes`, it is renamed to `path.1` (`.1` to `.2`, ...,
    keeping `keep` rotated files; older ones are dropped). A line never straddles two files and is
    never cut: a batch is split between lines only, a line longer than `max_bytes` gets a file of its
    own, and a write that fails part-way (a full disk) is truncated back to where it started.
    Appends and rotations hold an exclusive `flock` on the file at `path`, so several processes may
    share it; within a process a lock keeps concurrent appends (a sweep's batch, an admin end) whole.
    """

    def __init__(self, path: str, max_bytes: int = DEFAULT_RECORDS_MAX_BYTES,
                 keep: int = DEFAULT_RECORDS_KEEP) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self._lock = threading.Lock()

    def _write(self, data: bytes) -> None:
        """Append `data` (whole lines), rotating first, or between lines, as often as it takes."""
        with self._lock:
            fd = self._open_locked()
            try:
                size = os.fstat(fd).st_size
                start = 0
                while start < len(data):
                    end = len(data)
                    if size + end - start > self.max_bytes:
                        # the most whole lines that fit; none fit: rotate first, or write one line alone
                        end = data.rfind(b"\n", start, start + max(0, self.max_bytes - size)) + 1
                        if end <= start:
                            if size > 0:
                                fd = self._rotate(fd)
                                size = 0
                                continue
                            end = data.index(b"\n", start) + 1
                    _append(fd, data[start:end], size)
                    size += end - start
                    start = end
            finally:
                os.close(fd)  # releases the flock

    def _open_locked(self) -> int:
        """An append descriptor of the file now at `path`, under an exclusive flock."""
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                held, now = os.fstat(fd), os.stat(self.path)
                if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)  # another process rotated the file while we waited for its lock: take the new one

    def _rotate(self, fd: int) -> int:
        """Shift `path` to `path.1` (and each `.n` to `.n+1`) while holding `fd`'s lock; returns the new file's."""
        n = self.keep + 1
        while os.path.exists(f"{self.path}.{n}"):  # left over from a larger `keep`
            os.unlink(f"{self.path}.{n}")
            n += 1
        for n in range(self.keep - 1, 0, -1):
            if os.path.exists(f"{self.path}.{n}"):
                os.replace(f"{self.path}.{n}", f"{self.path}.{n + 1}")
        os.replace(self.path, f"{self.path}.1")
        new = self._open_locked()
        os.close(fd)
        return new

    async def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        await asyncio.to_thread(self._write, b"".join(orjson.dumps(r) + b"\n" for r in records))


def _append(fd: int, data: bytes, size: int) -> None:
    """Write all of `data` at the end of `fd` (at `size`); on failure cut the file back to `size`."""
    view = memoryview(data)
    try:
        while view:  # a regular file takes it all at once; a full disk may take part
            view = view[os.write(fd, view):]
    except OSError:
        os.ftruncate(fd, size)
        raise


class StreamSink:
    """Appends to the Redis Stream of a store that offers `append_records` (stores/redis.py)."""

    def __init__(self, store: Any) -> None:
        self._store = store

    async def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        await self._store.append_records(records)


def open_sink(store: Any, records_file: str, *, max_bytes: int = DEFAULT_RECORDS_MAX_BYTES,
              keep: int = DEFAULT_RECORDS_KEEP) -> RecordSink:
    """The Redis Stream of a Redis store, else the JSONL file (rotated past `max_bytes`, `keep` kept)."""
    if hasattr(store, "append_records"):
        return StreamSink(store)
    return JsonlSink(records_file, max_bytes, keep)


class TaskEnder:
    """Ends tasks (admin call or idle sweep) and appends each record exactly once.

    The store decides who ends a task (its end step is atomic), so replicas sweeping the same
    task never write two records. A sweep writes its records in one sink call: one write per
    task (a thread hop each) could not keep up with a busy proxy, and ledgers of tasks that
    should have ended piled up in memory.

    A per-call task can never see a second call (its id is drawn fresh for its one call and no
    client can name it), so it ends as that call finishes (`end_with_call`, before the call's span
    ends, which carries its summary), its record written with others a few tens of milliseconds
    later, instead of an idle timeout later: a busy proxy otherwise kept a minute of such tasks'
    ledgers alive, and the garbage collector's full passes walked all of them (docs/performance.md).
    """

    def __init__(self, store: Any, sink: RecordSink, idle_timeout_s: float,
                 wall_ms: Any = None) -> None:
        self.store = store
        self.sink = sink
        self.idle_ms = int(idle_timeout_s * 1000)
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self.sink_failures = 0  # records not written (the sink failed, or too many waited on it)
        self.on_lost: Callable[[int], object] | None = None  # told how many each time (a metric)
        # called with each ended task's record (task summary span, task metrics); failsafe
        self.listeners: list[Callable[[dict[str, Any]], object]] = []
        self._unwritten: list[dict[str, Any]] = []  # records of per-call tasks, for the next batch
        self._flush: asyncio.Task[None] | None = None  # writes them, one batch at a time
        self._writing = False  # a batch is being written (shutdown waits for it rather than cut it)
        self._dropping = False  # records were lost since the last write that went through

    async def end_with_call(self, task_id: str) -> dict[str, Any] | None:
        """`task_id`'s one call finished: end it now (its listeners run now, so the call's span can
        carry the summary); its record is written with the next batch. None if it had no ledger."""
        record = await self._end(task_id, None, END_CALL, None)
        if record is not None:
            self._unwritten.append(record)
            if len(self._unwritten) > MAX_WAITING_RECORDS:  # the sink is stalled: bounded, and said
                lost = len(self._unwritten) - MAX_WAITING_RECORDS
                del self._unwritten[:lost]
                self._lost(lost)
                if not self._dropping:
                    self._dropping = True
                    log.warning("task records are waiting on a slow sink; the oldest past %d are not written",
                                MAX_WAITING_RECORDS)
            if self._flush is None:
                self._flush = asyncio.get_running_loop().create_task(self._write_later())
        return record

    async def _write_later(self) -> None:
        """Write the waiting records a delay after the first, one batch at a time: records ending
        while a write is slow wait for the next (never a write each, piling up on a stalled sink)."""
        try:
            while self._unwritten:
                await asyncio.sleep(CALL_END_DELAY_S)
                self._writing = True
                try:
                    await self._write_waiting()
                finally:
                    self._writing = False
        finally:
            self._flush = None

    async def _write_waiting(self) -> None:
        batch, self._unwritten = self._unwritten, []
        if await self._write(batch):
            self._dropping = False

    async def end(self, task_id: str, outcome: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """End `task_id` now (admin call); its record, or None if it had already ended."""
        record = await self._end(task_id, outcome, END_EXPLICIT, None)
        if record is None:
            return None
        return record if await self._write([record]) else {**record, "record_written": False}

    async def sweep(self) -> int:
        """End every task idle for longer than the idle timeout; returns how many ended."""
        cutoff = self._wall_ms() - self.idle_ms
        records: list[dict[str, Any]] = []
        failed = 0
        error = ""
        turn = time.perf_counter()
        for task_id in await self.store.idle_tasks(cutoff):
            if time.perf_counter() - turn > _SWEEP_YIELD_S:
                # Ending a task (its record, summary span and metrics) takes ~0.1-0.3 ms, and a sweep
                # after a burst ends thousands: calls waiting on the loop go first (bench/tail_probe.py)
                await asyncio.sleep(0)
                turn = time.perf_counter()
            try:
                record = await self._end(task_id, None, END_IDLE, cutoff)
            except Exception as exc:  # noqa: BLE001 - a task on a failed Cluster node must not keep the
                failed += 1           # others from ending; it is ended on a later sweep
                error = type(exc).__name__
                continue
            if record is not None:
                records.append(record)
        if failed:
            log.warning("%d idle task(s) not ended (%s); retried on the next sweep", failed, error)
        await self._write(records)
        return len(records)

    async def shutdown(self) -> tuple[int, int]:
        """The process is stopping, its calls done: end what only it holds, as (ended, handed over).

        Idle tasks end as a sweep would end them. With a store other replicas share, the rest are
        handed over (their sweeps end them once idle: a task may go on at another replica);
        with the memory store every live task ends now, `end_reason: shutdown`, since nothing
        else could ever end it."""
        if self._flush is not None:  # the records of per-call tasks that ended with their call
            if not self._writing:  # waiting out the delay: no need; a write in flight is let finish
                self._flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flush
        await self._write_waiting()
        ended = await self.sweep()
        handed = await self.store.hand_over()
        if handed:
            return ended, handed
        records: list[dict[str, Any]] = []
        for task_id in self.store.local_tasks():
            record = await self._end(task_id, None, END_SHUTDOWN, None)
            if record is not None:
                records.append(record)
        await self._write(records)
        return ended + len(records), 0

    async def _end(self, task_id: str, outcome: Mapping[str, Any] | None, reason: str,
                   idle_before_ms: int | None) -> dict[str, Any] | None:
        ledger = await self.store.end_task(task_id, idle_before_ms)
        if ledger is None:
            return None
        ended = ledger.last_ms if reason in (END_IDLE, END_CALL) else self._wall_ms()
        record = task_record(ledger, ended_ms=ended, end_reason=reason, outcome=outcome)
        for listener in self.listeners:
            try:
                listener(record)
            except Exception:
                log.exception("task end listener failed for %r", task_id)
        return record

    async def _write(self, records: list[dict[str, Any]]) -> bool:
        """Append `records`; False (logged, counted) when the sink failed: the tasks ended either way."""
        if not records:  # a sweep that ended nothing writes nothing
            return True
        try:
            await self.sink.append(records)
        except Exception as exc:  # noqa: BLE001 - say the records were lost, never raise into a sweep
            self._lost(len(records))
            log.warning("%d task record(s) not written (%s: %s)", len(records), type(exc).__name__, redact(str(exc)))
            return False
        return True

    def _lost(self, count: int) -> None:
        self.sink_failures += count
        if self.on_lost is not None:
            try:
                self.on_lost(count)
            except Exception:
                log.exception("counting lost task records failed")

    async def record_outcome(self, task_id: str, correct: bool) -> dict[str, Any]:
        """Append a verdict on a task (`{"kind": "outcome", ...}`); `ragtoll report` applies a task's
        last verdict to its record, whether it came before or after the task ended."""
        entry = {"kind": "outcome", "task_id": task_id, "outcome": {"correct": correct},
                 "at": _iso(self._wall_ms())}
        await self.sink.append([entry])
        return entry
