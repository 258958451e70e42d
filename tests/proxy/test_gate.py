"""One client address cannot lock the front door with idle connections (issue 30, item 5).

On real sockets against the real `ragtoll serve` with its default front door (max_connections 1024,
header_timeout_s 10): an attacker on 127.0.0.2 holds 1,100 sockets that never send a byte,
reopening each as soon as it is closed, while a legitimate client on 127.0.0.1 asks for /healthz.
Before the gate the attacker held every slot and /healthz waited for the header timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from ragtoll.proxy.config import ConfigError, ServerConfig
from ragtoll.proxy.gate import share_of
from support.process import RagtollProcess

ATTACKER = "127.0.0.2"  # all of 127.0.0.0/8 is loopback on Linux: a second client address
IDLE_SOCKETS = 1100
PROBES = 8
PROBE_TIMEOUT_S = 5.0  # under the default header timeout (10 s): a probe that waited for it fails


@pytest.fixture
def many_files() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * IDLE_SOCKETS if hard == resource.RLIM_INFINITY else min(hard, 4 * IDLE_SOCKETS)
    if want < 2 * IDLE_SOCKETS:
        pytest.fail(f"the hard open-files limit ({hard}) is too low for {IDLE_SOCKETS} attacking sockets")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _config(tmp: Path, upstream: Any, server: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "server": server or {},
        "tasks": {"untracked": "per-call"},
        "budgets": {"records_file": str(tmp / "records.jsonl")},
        "upstreams": [
            {"name": "echo", "kind": "other", "api": "passthrough", "url": upstream.url, "prefix": "/echo"}
        ],
    }


class IdleAttacker:
    """`count` sockets from `ATTACKER` that send nothing, each reopened as soon as it is closed."""

    def __init__(self, port: int, count: int) -> None:
        self.port = port
        self.count = count
        self.opened = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _hold(self) -> None:
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(ATTACKER, 0)
                )
            except OSError:
                await asyncio.sleep(0.05)
                continue
            self.opened += 1
            try:
                with contextlib.suppress(OSError):
                    await reader.read(1)  # until the server closes it
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

    async def __aenter__(self) -> Self:
        self._tasks = [asyncio.create_task(self._hold()) for _ in range(self.count)]
        while self.opened < self.count:  # every socket connected once before the probes start
            await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _healthz(port: int) -> bool:
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                return (await reader.read()).startswith(b"HTTP/1.1 200")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (TimeoutError, OSError):
        return False


@pytest.mark.slow
async def test_healthz_answers_every_probe_while_one_address_holds_a_thousand_idle_sockets(
    many_files: None, upstream: Any, tmp_path: Path
) -> None:
    with RagtollProcess(tmp_path, _config(tmp_path, upstream)) as rt:
        async with IdleAttacker(rt.port, IDLE_SOCKETS):
            answered = [await _healthz(rt.port) for _ in range(PROBES)]
    assert answered == [True] * PROBES, f"/healthz answered {sum(answered)} of {PROBES} probes"


@pytest.mark.slow
async def test_requests_in_flight_are_never_cut_and_idle_ones_past_the_share_are(
    many_files: None, upstream: Any, tmp_path: Path
) -> None:
    """Share 2: eight slow calls from one address all finish; of that address's 20 idle sockets
    at most 2 stay open."""
    with RagtollProcess(tmp_path, _config(tmp_path, upstream, {"max_connections_per_address": 2})) as rt:
        async with httpx.AsyncClient(base_url=rt.base, timeout=30) as client:
            slow = [
                asyncio.create_task(client.get("/echo/slow", headers={"x-test-delay": "1.5"}))
                for _ in range(8)
            ]
            idle = [
                await asyncio.open_connection("127.0.0.1", rt.port, local_addr=(ATTACKER, 0))
                for _ in range(20)
            ]
            eofs = [asyncio.create_task(reader.read(1)) for reader, _ in idle]
            try:
                # a liveness bound under the header timeout (10 s), which would close them all
                await asyncio.wait(eofs, timeout=5, return_when=asyncio.ALL_COMPLETED)
                closed = sum(1 for t in eofs if t.done() and not t.exception() and t.result() == b"")
                assert closed >= len(idle) - 2, f"{closed} of {len(idle)} idle sockets closed"
                answers = await asyncio.gather(*slow)
            finally:
                for task in eofs:
                    task.cancel()
                await asyncio.gather(*eofs, return_exceptions=True)
                for _, writer in idle:
                    writer.close()
    assert [r.status_code for r in answers] == [200] * 8


def test_the_share_defaults_to_a_quarter_and_a_bad_one_names_the_field() -> None:
    assert share_of(1024, None) == 256
    assert share_of(3, None) == 1
    assert share_of(1024, 10) == 10
    for bad in (0, 2000):
        with pytest.raises(ConfigError, match=r"server\.max_connections_per_address"):
            ServerConfig(max_connections_per_address=bad).validate("server")
