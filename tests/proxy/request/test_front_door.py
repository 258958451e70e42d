"""The front door under attack, on real sockets against the real `ragtoll serve`.

Each attack runs while a prober opens a new connection to `/healthz` every 50 ms: every probe must
be answered, within a generous bound (the benchmark has the real timings). The limits come from
`server:` (header_timeout_s, body_timeout_s, max_connections, max_inspect_bytes, max_event_bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from support.hostile import BOMB_INFLATED, STREAM_BYTES, HostileUpstream, gzip_bomb, normal_stream
from support.poll import wait_until
from support.process import RagtollProcess
from support.servers import serve_in_thread

TOKEN = "front-door-token"
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
PROBE_BOUND_S = 1.0  # generous: docs/performance.md has the measured times
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    gzip_bomb(), normal_stream()  # made before any clock starts
    with serve_in_thread(HostileUpstream()) as url:
        yield url


@pytest.fixture(scope="module")
def front(hostile: str, upstream: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RagtollProcess]:
    tmp = tmp_path_factory.mktemp("front")
    config = {
        "server": {"header_timeout_s": HEADER_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S},
        "tasks": {"untracked": "per-call"},
        "budgets": {"default_profile": "p", "profiles": {"p": {"max_steps": 1000, "max_completion_tokens": 10**7}},
                    "records_file": str(tmp / "records.jsonl")},
        "identity": {"mode": "header"},
        "upstreams": [
            {"name": "openai", "kind": "llm", "api": "openai", "url": hostile, "prefix": "/openai"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": hostile, "prefix": "/docs"},
            {"name": "echo", "kind": "other", "api": "passthrough", "url": upstream.url, "prefix": "/echo"},
        ],
    }
    with RagtollProcess(tmp, config, env={"RAGTOLL_ADMIN_TOKEN": TOKEN}) as rt:
        yield rt


class Prober:
    """GET /healthz on a new connection every 50 ms, in a thread; every answer's time is kept."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.times: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    data = b""
                    while chunk := s.recv(4096):
                        data += chunk
                if not data.startswith(b"HTTP/1.1 200"):
                    self.failures.append(data[:60].decode("latin-1"))
                self.times.append(time.perf_counter() - t0)
            except OSError as exc:
                self.failures.append(repr(exc))
            self._stop.wait(0.05)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self.failures, f"/healthz failed during the attack: {self.failures[:3]}"
        assert self.times, "no probe completed"
        assert max(self.times) < PROBE_BOUND_S, f"/healthz took {max(self.times):.3f} s at worst"


async def _read_until_closed(reader: asyncio.StreamReader) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionError):
        while chunk := await reader.read(65536):
            data += chunk
    return data


@pytest.mark.slow
async def test_connections_trickling_header_bytes_are_closed_at_the_header_timeout(front: RagtollProcess) -> None:
    async def trickle() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        t0 = time.monotonic()
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        try:
            while time.monotonic() - t0 < HEADER_TIMEOUT_S + 20:
                writer.write(b"x")  # one header byte at a time, never the blank line
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.3):
                        if await reader.read(1) == b"":
                            return time.monotonic() - t0
        except ConnectionError:
            return time.monotonic() - t0
        finally:
            writer.close()
        return float("inf")

    with Prober(front.port):
        closed_after = await asyncio.gather(*(trickle() for _ in range(300)))
    # closed at the timeout, not never (inf); the slack is for a loaded machine, where these 300
    # clients and the server share 2 cores (it once missed +3 s while other suites ran)
    assert max(closed_after) < HEADER_TIMEOUT_S + 8, sorted(closed_after)[-5:]


@pytest.mark.slow
async def test_a_body_slower_than_the_body_timeout_gets_408(front: RagtollProcess) -> None:
    async def slow_body(path: str) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", front.port)
        body = orjson.dumps(CHAT)
        writer.write(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (path.encode(), len(body)) + body[:5])
        answer = b""
        with contextlib.suppress(ConnectionError):
            for byte in body[5:40]:  # one byte every 0.3 s, until the answer comes
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.3):
                        answer = await reader.read(65536)
                if answer:
                    break
                writer.write(bytes([byte]))
                await writer.drain()
            async with asyncio.timeout(10):
                while b"\r\n\r\n" not in answer or not answer.endswith(b"}}"):
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    answer += chunk
                assert b"connection: close" in answer.lower()  # the body was not read to its end
                assert await _read_until_closed(reader) == b""  # and ragtoll closes the connection
        writer.close()
        return answer

    with Prober(front.port):
        read_whole, streamed = await asyncio.gather(slow_body("/openai/v1/chat/completions"), slow_body("/echo/x"))
    for answer in (read_whole, streamed):
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"request_timeout"' in answer


def test_trailers_of_a_chunked_request_never_become_headers(front: RagtollProcess, upstream: Any) -> None:
    with socket.create_connection(("127.0.0.1", front.port), timeout=10) as s:
        s.sendall(b"POST /echo/echo/trailers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                  b"x-auth-subject: alice\r\nx-auth-groups: public\r\n\r\n"
                  b"5\r\nhello\r\n0\r\nx-auth-groups: hr\r\nx-smuggled: yes\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    seen = upstream.app.state.requests[-1]
    assert seen["body"] == b"hello"
    assert seen["headers"]["x-auth-groups"] == "public"  # the head's value, not the trailer's
    assert "x-smuggled" not in seen["headers"]


@pytest.mark.slow
def test_a_gzip_bomb_on_a_buffered_route_is_passed_on_unread(front: RagtollProcess) -> None:
    peak_before = front.status("VmHWM")
    with Prober(front.port):
        r = httpx.post(f"{front.base}/docs/search", json={"query": "refunds"}, headers={"x-hostile": "bomb"},
                       timeout=30)
    assert r.status_code == 200
    assert r.headers["content-encoding"] == "gzip"
    assert len(r.content) == len(gzip_bomb()) or len(r.content) == BOMB_INFLATED  # raw, or inflated by httpx
    assert "x-ragtoll-evidence" not in r.headers  # not read, so not described
    grown_mb = (front.status("VmHWM") - peak_before) / 1024
    assert grown_mb < 100, f"peak RSS grew by {grown_mb:.0f} MB for a {BOMB_INFLATED >> 20} MB bomb"


def test_a_gzip_bomb_in_a_stream_is_passed_on_unread(front: RagtollProcess) -> None:
    peak_before = front.status("VmHWM")
    received = 0
    with Prober(front.port), httpx.stream("POST", f"{front.base}/openai/v1/chat/completions",
                                          json={**CHAT, "stream": True}, headers={"x-hostile": "bomb"},
                                          timeout=30) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            received += len(chunk)
    assert received == len(gzip_bomb())
    grown_mb = (front.status("VmHWM") - peak_before) / 1024
    assert grown_mb < 100, f"peak RSS grew by {grown_mb:.0f} MB for a {BOMB_INFLATED >> 20} MB bomb"


def test_an_sse_event_that_never_ends_passes_without_stalling_the_proxy(front: RagtollProcess) -> None:
    cpu_before = front.cpu_seconds()
    received = 0
    with Prober(front.port), httpx.stream("POST", f"{front.base}/openai/v1/chat/completions",
                                          json={**CHAT, "stream": True}, headers={"x-hostile": "endless"},
                                          timeout=60) as r:
        for chunk in r.iter_raw():
            received += len(chunk)
    assert received == len(b"data: ") + STREAM_BYTES
    cpu = front.cpu_seconds() - cpu_before
    assert cpu < 5, f"ragtoll spent {cpu:.1f} s of CPU on a 20 MB event (quadratic scanning)"


@pytest.mark.slow
def test_a_20_mb_normal_stream_passes_whole_and_is_read(front: RagtollProcess) -> None:
    body, events = normal_stream()
    task = "front-normal-stream"
    cpu_before = front.cpu_seconds()
    with Prober(front.port), httpx.stream("POST", f"{front.base}/openai/v1/chat/completions",
                                          json={**CHAT, "stream": True},
                                          headers={"x-hostile": "normal", "x-ragtoll-task-id": task},
                                          timeout=60) as r:
        received = b"".join(r.iter_raw())
    assert received == body
    cpu = front.cpu_seconds() - cpu_before
    assert cpu < 5, f"ragtoll spent {cpu:.1f} s of CPU on a 20 MB stream (the kept output re-summed per event)"
    ledger = httpx.get(f"{front.base}/admin/tasks/{task}", headers={"authorization": f"Bearer {TOKEN}"}).json()
    assert ledger["used"]["completion_tokens"] == events  # the stream's own usage event was read


@pytest.mark.slow
def test_a_connection_past_max_connections_waits_for_a_free_one(upstream: Any, tmp_path: Path) -> None:
    config = {"server": {"max_connections": 3}, "tasks": {"untracked": "per-call"},
              "budgets": {"records_file": str(tmp_path / "r.jsonl")},
              "upstreams": [{"name": "echo", "kind": "other", "api": "passthrough", "url": upstream.url,
                             "prefix": "/echo"}]}
    done: dict[str, float] = {}

    def call(name: str, path: str, headers: dict[str, str]) -> None:
        r = httpx.get(f"{rt.base}{path}", headers=headers, timeout=30)
        assert r.status_code == 200
        done[name] = time.monotonic()

    with RagtollProcess(tmp_path, config) as rt:
        slow = [threading.Thread(target=call, args=(f"slow{i}", "/echo/slow", {"x-test-delay": "1.5"}))
                for i in range(3)]
        for t in slow:
            t.start()
        assert wait_until(lambda: upstream.app.state.calls["/slow"] == 3)  # the three connections are taken
        call("healthz", "/healthz", {})
        for t in slow:
            t.join()
    assert done["healthz"] >= min(done[f"slow{i}"] for i in range(3)), done
