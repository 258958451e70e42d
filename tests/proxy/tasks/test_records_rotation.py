"""Task records cannot fill a disk: the JSONL sink rotates by size, loses and splits no line, and
`ragtoll report` reads the rotated set back in order.

Real files, the real sweeper (TaskEnder over the memory store), real processes sharing one file,
and a real file-size limit (RLIMIT_FSIZE) standing in for a full disk.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from conftest import ProxyFactory, Upstream
from ragtoll.proxy import config
from ragtoll.proxy.core import budget as bm
from ragtoll.proxy.core.budget import Charge
from ragtoll.proxy.errors import ConfigError
from ragtoll.proxy.stores.base import TaskMeta
from ragtoll.proxy.stores.memory import MemoryStore
from ragtoll.proxy.tasks.records import JsonlSink, TaskEnder
from ragtoll.proxy.tools import report


def record(i: int, pad: int = 60) -> dict[str, Any]:
    return {"task_id": f"t{i:05d}", "pad": "x" * pad}


def files(base: Path) -> dict[str, bytes]:
    """name -> content of the base file and every file rotated from it."""
    return {p.name: p.read_bytes() for p in sorted(base.parent.glob(base.name + "*"))}


def task_ids(data: bytes) -> list[str]:
    return [orjson.loads(line)["task_id"] for line in data.splitlines()]


async def test_rotates_past_max_bytes_keeping_whole_lines_and_the_newest_files(tmp_path: Path) -> None:
    base = tmp_path / "tasks.jsonl"
    sink = JsonlSink(str(base), max_bytes=1000, keep=2)
    for i in range(100):  # ~85 bytes a line: about 11 lines a file, 9 rotations
        await sink.append([record(i)])
    got = files(base)
    assert sorted(got) == ["tasks.jsonl", "tasks.jsonl.1", "tasks.jsonl.2"]
    assert all(0 < len(data) <= 1000 and data.endswith(b"\n") for data in got.values())
    # oldest first, the kept files hold the newest records without a gap; only whole files were dropped
    kept = task_ids(got["tasks.jsonl.2"]) + task_ids(got["tasks.jsonl.1"]) + task_ids(got["tasks.jsonl"])
    assert kept == [f"t{i:05d}" for i in range(100 - len(kept), 100)]
    assert [r["task_id"] for r in report.read_jsonl(str(base))] == kept
    # a full file is rotated away before it would overflow, not after
    assert len(got["tasks.jsonl.1"]) + len(orjson.dumps(record(0))) + 1 > 1000


async def test_a_sweep_batch_larger_than_a_file_is_split_between_lines(tmp_path: Path) -> None:
    """The sweeper writes every ended task in one batch (one sink call); rotation may fall inside it."""
    base = tmp_path / "tasks.jsonl"
    writes: list[int] = []

    class CountingSink(JsonlSink):
        def _write(self, data: bytes) -> None:
            writes.append(data.count(b"\n"))
            super()._write(data)

    store = MemoryStore()
    ender = TaskEnder(store, CountingSink(str(base), max_bytes=64 * 1024, keep=5), idle_timeout_s=1.0,
                      wall_ms=lambda: 50_000)
    meta = TaskMeta("p", "", "openai", "header", "ab" * 16)
    for i in range(300):
        d = await store.reserve(f"t{i:05d}", meta, {}, Charge(steps=1), 10_000 + i)
        await store.settle(f"t{i:05d}", d.reservation, bm.Actual(), 10_000 + i)
    assert await ender.sweep() == 300
    assert writes == [300]  # still one write per sweep
    got = files(base)
    assert len(got) >= 3, "300 records of ~500 bytes should fill more than two 64 KiB files"
    assert all(len(data) <= 64 * 1024 and data.endswith(b"\n") for data in got.values())
    records = report.read_jsonl(str(base))
    assert [r["task_id"] for r in records] == [f"t{i:05d}" for i in range(300)]
    assert all(r["end_reason"] == "idle" for r in records)


async def test_a_line_longer_than_max_bytes_gets_a_file_of_its_own(tmp_path: Path) -> None:
    base = tmp_path / "tasks.jsonl"
    sink = JsonlSink(str(base), max_bytes=500, keep=3)
    await sink.append([record(0)])
    await sink.append([record(1, pad=2000), record(2)])
    got = files(base)
    assert task_ids(got["tasks.jsonl.2"]) == ["t00000"]
    assert task_ids(got["tasks.jsonl.1"]) == ["t00001"] and len(got["tasks.jsonl.1"]) > 2000
    assert task_ids(got["tasks.jsonl"]) == ["t00002"]


async def test_concurrent_appends_in_one_process_stay_whole(tmp_path: Path) -> None:
    base = tmp_path / "tasks.jsonl"
    sink = JsonlSink(str(base), max_bytes=4096, keep=100)
    await asyncio.gather(*(sink.append([record(i), record(i + 10_000)]) for i in range(400)))
    got = files(base)
    assert len(got) > 10
    ids = [i for data in got.values() for i in task_ids(data)]  # every line parses
    assert sorted(ids) == sorted([f"t{i:05d}" for i in range(400)] + [f"t{i + 10_000:05d}" for i in range(400)])
    assert all(len(data) <= 4096 for data in got.values())


WRITER = """
import asyncio, sys
from ragtoll.proxy.tasks.records import JsonlSink
sink = JsonlSink(sys.argv[1], max_bytes=1024, keep=200)
async def main():
    for i in range(300):
        await sink.append([{"task_id": f"{sys.argv[2]}-{i}", "pad": "y" * 40}])
asyncio.run(main())
"""


@pytest.mark.slow
def test_processes_sharing_one_file_rotate_it_without_losing_a_line(tmp_path: Path) -> None:
    # Each process has its own lock; the flock on the file keeps their rotations from colliding
    # (two rotations at once would shift a file twice and drop records early).
    base = tmp_path / "tasks.jsonl"
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(base), f"w{n}"]) for n in range(4)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0, 0, 0]
    got = files(base)
    assert len(got) > 10
    ids = [i for data in got.values() for i in task_ids(data)]
    assert sorted(ids) == sorted(f"w{n}-{i}" for n in range(4) for i in range(300))
    # each writer's own records stay in order across the files, oldest file first
    ordered = [r["task_id"] for r in report.read_jsonl(str(base))]
    for n in range(4):
        assert [i for i in ordered if i.startswith(f"w{n}-")] == [f"w{n}-{i}" for i in range(300)]


FULL_DISK = """
import asyncio, resource, signal, sys
from ragtoll.proxy.tasks.records import JsonlSink
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit write() fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))
sink = JsonlSink(sys.argv[1], max_bytes=1 << 20, keep=3)
asyncio.run(sink.append([{"task_id": "t00000", "pad": "z" * 1000}]))
try:
    asyncio.run(sink.append([{"task_id": f"t{i:05d}", "pad": "z" * 1000} for i in (1, 2, 3)]))
except OSError as exc:
    print(exc.errno)
"""


def test_a_write_the_disk_cannot_hold_leaves_no_partial_line(tmp_path: Path) -> None:
    base = tmp_path / "tasks.jsonl"
    out = subprocess.run([sys.executable, "-c", FULL_DISK, str(base)], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "27"  # EFBIG: the second batch did not fit under the 3000-byte limit
    # the first write (1025 bytes) stays; the batch that failed part-way is cut back to it
    assert task_ids(base.read_bytes()) == ["t00000"]
    assert base.read_bytes().endswith(b"\n")


def test_report_reads_rotated_files_oldest_first_and_names_a_bad_line(tmp_path: Path) -> None:
    base = tmp_path / "tasks.jsonl"
    for name, ids in (("tasks.jsonl.10", [0]), ("tasks.jsonl.2", [1]), ("tasks.jsonl.1", [2, 3]),
                      ("tasks.jsonl", [4])):
        (tmp_path / name).write_bytes(b"".join(orjson.dumps(record(i)) + b"\n" for i in ids))
    (tmp_path / "tasks.jsonl.bak").write_bytes(b"not records\n")  # not a rotated file: ignored
    assert [r["task_id"] for r in report.read_jsonl(str(base))] == [f"t{i:05d}" for i in range(5)]
    (tmp_path / "tasks.jsonl.2").write_bytes(b"{broken\n")
    with pytest.raises(report.ReportError, match=r"tasks\.jsonl\.2:1: not JSON"):
        report.read_jsonl(str(base))


def test_records_size_keys_default_and_are_validated() -> None:
    b = config.parse({}).budgets
    assert (b.records_max_bytes, b.records_keep) == (16 * 1024 * 1024, 3)
    b = config.load({"RAGTOLL_BUDGETS__RECORDS_MAX_BYTES": "1048576", "RAGTOLL_BUDGETS__RECORDS_KEEP": "5"}).budgets
    assert (b.records_max_bytes, b.records_keep) == (1048576, 5)
    for raw, message in [
        ({"records_max_bytes": 1000},
         "Config 'budgets.records_max_bytes' has value 1000. Expected at least 65536 bytes (64 KiB)"),
        ({"records_max_bytes": "16MiB"}, "Config 'budgets.records_max_bytes' has value '16MiB'. Expected an integer."),
        ({"records_keep": 0}, "Config 'budgets.records_keep' has value 0. Expected a number of rotated files from 1 to 100"),
        ({"records_keep": 101}, "Config 'budgets.records_keep' has value 101."),
    ]:
        with pytest.raises(ConfigError) as caught:
            config.parse({"budgets": raw})
        assert message in str(caught.value)


@pytest.mark.slow
def test_the_app_rotates_its_records_file_as_configured(proxy: ProxyFactory, upstream: Upstream,
                                                        tmp_path: Path) -> None:
    base = tmp_path / "records.jsonl"
    budgets = {"records_file": str(base), "records_max_bytes": 65536, "records_keep": 2}
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    with proxy(budgets=budgets, tasks={"idle_timeout_s": 0.2}) as url, httpx.Client() as http:
        for i in range(200):  # ~510-byte records: more than one 64 KiB file
            r = http.post(f"{url}/openai/v1/chat/completions", json=body, headers={"x-ragtoll-task-id": f"t{i:05d}"})
            assert r.status_code == 200
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(report.read_jsonl(str(base)) if base.exists() else []) < 200:
            time.sleep(0.1)
    assert (tmp_path / "records.jsonl.1").exists()
    assert all(len(data) <= 65536 for data in files(base).values())
    assert sorted(r["task_id"] for r in report.read_jsonl(str(base))) == [f"t{i:05d}" for i in range(200)]
