"""server.py, ragtoll's HTTP protocol for uvicorn, on real loopback sockets: a response head and
the body written in the same event-loop turn arrive as one TCP segment (counted by the client's
kernel, TCP_INFO), and nothing written waits past its turn."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from ragtoll.proxy.server import http_protocol
from support.servers import serve_in_thread

BIG = b"b" * 300_000


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            await send({"type": message["type"] + ".complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path = scope["path"]
    if path == "/small":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})
    elif path == "/big":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(BIG)).encode())]})
        await send({"type": "http.response.body", "body": BIG})
    elif path == "/stream":  # the first event in the head's turn, the second 0.3 s later
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        await asyncio.sleep(0.3)
        await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/late-body":  # the head, then nothing for 0.3 s
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await asyncio.sleep(0.3)
        await send({"type": "http.response.body", "body": b"late"})


def data_segments_in(sock: socket.socket) -> int:
    """tcp_info.tcpi_data_segs_in: data-carrying segments this socket received (Linux >= 4.6)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("I", info, 152)[0])


@pytest.fixture(scope="module")
def held() -> Iterator[int]:
    with serve_in_thread(app, http=http_protocol()) as url:
        yield int(url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def plain() -> Iterator[int]:
    with serve_in_thread(app, http="httptools") as url:
        yield int(url.rsplit(":", 1)[1])


def exchange(port: int, path: str, until: bytes) -> tuple[bytes, int, list[float]]:
    """One GET on a fresh connection: the response, its data segments, and when each recv returned."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        before = data_segments_in(sock)
        start = time.monotonic()
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
        got, times = b"", []
        while not got.endswith(until):
            got += sock.recv(1 << 20)
            times.append(time.monotonic() - start)
        time.sleep(0.05)  # let any trailing segment land before counting
        return got, data_segments_in(sock) - before, times


def test_a_head_and_body_of_one_turn_arrive_in_one_segment(held: int, plain: int) -> None:
    got, segments, _ = exchange(held, "/small", b"hello")
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and segments == 1
    # uvicorn's own protocol writes them separately: two segments (what the held write saves)
    got, segments, _ = exchange(plain, "/small", b"hello")
    assert got.endswith(b"hello") and segments == 2


def test_a_streams_first_event_comes_with_its_head_and_the_next_is_not_held(held: int) -> None:
    got, segments, times = exchange(held, "/stream", b"0\r\n\r\n")
    assert got.index(b"200 OK") < got.index(b"data: one") < got.index(b"data: two")
    # the head and the first event: one segment, at once; the second event and the stream's end: one
    assert segments == 2 and times[0] < 0.2 and times[-1] >= 0.3


def test_a_head_whose_body_is_late_is_not_held_for_it(held: int) -> None:
    with socket.create_connection(("127.0.0.1", held)) as sock:
        sock.settimeout(5)
        start = time.monotonic()
        sock.sendall(b"GET /late-body HTTP/1.1\r\nhost: t\r\n\r\n")
        head = sock.recv(1 << 16)
        head_at = time.monotonic() - start
        rest = b""
        while not (head + rest).endswith(b"late"):
            rest += sock.recv(1 << 16)
    assert head.startswith(b"HTTP/1.1 200 OK") and b"late" not in head
    assert head_at < 0.2


def test_a_large_body_and_keep_alive_pass_intact(held: int) -> None:
    with socket.create_connection(("127.0.0.1", held)) as sock:
        sock.settimeout(5)
        for path, body in (("/big", BIG), ("/small", b"hello"), ("/big", BIG)):
            sock.sendall(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
            got = b""
            while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < len(body):
                got += sock.recv(1 << 20)
            assert got.partition(b"\r\n\r\n")[2] == body
