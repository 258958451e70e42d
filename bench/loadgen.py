"""A small keep-alive HTTP/1.1 client for benchmarks: raw asyncio streams, no client library in
the measurement. Handles content-length and chunked responses; reports first-byte and total times."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass


@dataclass
class Timing:
    status: int
    first_byte_s: float  # request(): the status line; stream_first_byte(): the first event
    total_s: float
    head_s: float = 0.0  # stream_first_byte(): the status line (the first byte of the response)


class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> Timing:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}",
                "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        payload = ("\r\n".join(head) + "\r\n\r\n").encode() + body
        t0, status_line = await self._send(payload)
        t_first = time.perf_counter() - t0
        status = int(status_line.split(b" ", 2)[1])
        length, chunked = None, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            k = k.strip().lower()
            if k == "content-length":
                length = int(v)
            elif k == "transfer-encoding" and "chunked" in v.lower():
                chunked = True
        if chunked:
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        elif length:
            await self.reader.readexactly(length)
        return Timing(status, t_first, time.perf_counter() - t0)

    async def stream_first_byte(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Timing:
        """For SSE: time to the first body chunk (first event), then drain."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(body)}",
                "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        t0, status_line = await self._send(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status = int(status_line.split(b" ", 2)[1])
        t_head = time.perf_counter() - t0
        while (await self.reader.readline()) not in (b"\r\n", b""):
            pass
        first = None
        while True:
            size = int((await self.reader.readline()).split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)
            if first is None and size > 0 and b"data:" in data:
                first = time.perf_counter() - t0
            if size == 0:
                break
        return Timing(status, first or 0.0, time.perf_counter() - t0, t_head)

    async def _send(self, payload: bytes) -> tuple[float, bytes]:
        """Send a request; (its start time, the status line). A keep-alive connection the server
        closed while idle (uvicorn after 5 s, as on a loaded machine) is opened again and the
        request sent once more, timed from the second send."""
        assert self.reader is not None and self.writer is not None
        t0 = time.perf_counter()
        try:
            self.writer.write(payload)
            line = await self.reader.readline()
        except ConnectionError:
            line = b""
        if not line:
            await self.close()
            await self.open()
            assert self.reader is not None and self.writer is not None
            t0 = time.perf_counter()
            self.writer.write(payload)
            line = await self.reader.readline()
        return t0, line

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
            self.writer = None


CALLS_PER_TASK = 8


_RUN = uuid.uuid4().hex[:8]


def task_headers(n: int, phase: str) -> dict[str, str]:
    """Calls n .. n+7 of a phase form one agent task (only ragtoll reads the header; others pass it on)."""
    return {"x-ragtoll-task-id": f"load-{_RUN}-{phase}-{n // CALLS_PER_TASK}"}


async def throughput(host: str, port: int, path: str, body: bytes, seconds: float, concurrency: int,
                     tasks: bool = True) -> tuple[int, int]:
    """Completed requests and non-2xx count in `seconds` with `concurrency` keep-alive connections
    (`tasks`: every 8 calls name one task; else no task header)."""
    deadline = time.perf_counter() + seconds
    done = 0
    errors = 0
    sent = itertools.count()

    async def worker() -> None:
        nonlocal done, errors
        c = Conn(host, port)
        try:
            while time.perf_counter() < deadline:
                t = await c.request("POST", path, body, task_headers(next(sent), f"t{port}") if tasks else None)
                done += 1
                if t.status >= 300:
                    errors += 1
        finally:
            await c.close()

    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return done, errors


async def count_requests(host: str, port: int, path: str, body: bytes, total: int, concurrency: int,
                         tasks: bool = True) -> int:
    """Send exactly `total` requests; returns the number of non-2xx answers."""
    remaining = total
    errors = 0

    async def worker() -> None:
        nonlocal remaining, errors
        c = Conn(host, port)
        try:
            while remaining > 0:
                remaining -= 1
                headers = task_headers(remaining, f"c{port}") if tasks else None
                if (await c.request("POST", path, body, headers)).status >= 300:
                    errors += 1
        finally:
            await c.close()

    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return errors
