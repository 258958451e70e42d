"""Client faults over real sockets: gone before the body, mid-upload, mid-stream; a slow reader.

The upstream exchange is cancelled (the faulty upstream sees its connection closed), the task's
reservation is settled (nothing left in flight), no file descriptors leak over many such
clients, and a client that does not read holds the upstream back (backpressure) instead of
ragtoll buffering the answer.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from conftest import ProxyFactory, Telemetry
from ragtoll.instrumentation import semconv as sc
from support.faulty import FaultyUpstream, host_port, raw_request, slow_reader
from test_upstream_faults import BUDGETS, CHAT, call_span, ledger, new_task, routes

TOKEN = "reliability-admin-token"


@pytest.fixture(autouse=True)
def _admin_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTOLL_ADMIN_TOKEN", TOKEN)


@pytest.fixture(scope="module")
def faulty() -> Iterator[FaultyUpstream]:
    with FaultyUpstream() as up:
        yield up


def hang_up(base: str, data: bytes) -> None:
    with socket.create_connection(host_port(base), timeout=5) as sock:
        sock.sendall(data)
        time.sleep(0.05)


def wait_for(predicate: object, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("route", ["/openai/v1/chat/completions", "/raw/upload"])
@pytest.mark.parametrize("sent", [0, 4000])
def test_client_gone_before_or_during_upload(proxy: ProxyFactory, faulty: FaultyUpstream, telemetry: Telemetry,
                                             route: str, sent: int) -> None:
    task = new_task()
    body = orjson.dumps(CHAT) + b" " * 10_000
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
        before = len(faulty.seen)
        hang_up(base, raw_request("POST", route, {"x-ragtoll-task-id": task, "content-type": "application/json"},
                                  body[:sent], content_length=len(body)))
        if route.startswith("/raw"):
            # a pass-through body streams: the call started and must end as a disconnect
            assert call_span(telemetry, task).attributes[sc.OUTCOME] == "client_disconnect"
            assert ledger(http, base, task)["in_flight"] == 0
        else:
            time.sleep(0.3)  # a read body never started the call: no span, no task
            assert not [s for s in telemetry.spans() if s.attributes.get(sc.TASK_ID) == task]
            gone = http.get(f"{base}/admin/tasks/{task}", headers={"authorization": f"Bearer {TOKEN}"})
            assert gone.status_code == 404
        ok = http.post(f"{base}/openai/v1/chat/completions", json=CHAT)  # the proxy carries on
    assert ok.status_code == 200
    # nothing reached the upstream complete: the half-sent request is not replayed as a whole one
    assert all(len(s.body) < len(body) for s in faulty.seen[before:])


def test_client_gone_mid_stream_closes_upstream_and_settles(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                            telemetry: Telemetry) -> None:
    task = new_task()
    with proxy(upstreams=routes(faulty.url, read_timeout=30), budgets=BUDGETS) as base, \
            httpx.Client(timeout=10) as http:
        with http.stream("POST", f"{base}/openai/v1/chat/completions", json={**CHAT, "stream": True},
                         headers={"x-ragtoll-task-id": task, "x-fault": "stall-mid-stream"}) as resp:
            assert next(resp.iter_raw()).startswith(b"data: ")
        seen = faulty.last()
        assert wait_for(lambda: seen.peer_closed)  # the stalled upstream was hung up on, not left waiting
        span = call_span(telemetry, task)
        after = ledger(http, base, task)
    assert span.attributes[sc.OUTCOME] == "client_disconnect"
    assert after["in_flight"] == 0 and after["used"]["completion_tokens"] < CHAT["max_tokens"]


def test_many_vanishing_clients_leak_no_descriptors_or_reservations(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                                    telemetry: Telemetry) -> None:
    task = new_task()
    body = orjson.dumps({**CHAT, "stream": True})
    headers = {"x-ragtoll-task-id": task, "content-type": "application/json", "x-fault": "stall-mid-stream"}

    def one_round() -> None:
        hang_up(base, raw_request("POST", "/openai/v1/chat/completions", headers, body[:10], len(body)))
        hang_up(base, raw_request("POST", "/raw/upload", headers, b"x" * 100, 5000))
        with socket.create_connection(host_port(base), timeout=5) as sock:  # gone mid-stream
            sock.sendall(raw_request("POST", "/openai/v1/chat/completions", headers, body))
            sock.recv(100)

    budgets = {"default_profile": "p", "profiles": {"p": {"max_steps": 1000}}}
    with proxy(upstreams=routes(faulty.url, read_timeout=30), budgets=budgets) as base, \
            httpx.Client(timeout=10) as http:
        for _ in range(5):  # warm-up: pools and lazily opened files settle
            one_round()
        wait_for(lambda: ledger(http, base, task)["in_flight"] == 0)
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(30):
            one_round()
        assert wait_for(lambda: ledger(http, base, task)["in_flight"] == 0)
        after = len(os.listdir("/proc/self/fd"))
    assert after <= fds + 4  # this process holds proxy, upstream and clients: none kept the dead sockets


def test_slow_reader_holds_the_upstream_back(proxy: ProxyFactory) -> None:
    with FaultyUpstream(big_bytes=96 * 1024 * 1024) as big:
        size = big.big_bytes
        with proxy(upstreams=routes(big.url, read_timeout=30)) as base:
            req = raw_request("GET", "/raw/blob", {"x-fault": "big", "connection": "close"})
            with slow_reader(base, req) as sock:
                assert wait_for(lambda: len(big.seen) > 0)
                seen = big.seen[-1]
                time.sleep(1.5)  # the client reads nothing: buffers fill, then everything waits
                held = seen.bytes_sent
                time.sleep(1.0)
                later = seen.bytes_sent
                got = 0
                while chunk := sock.recv(1 << 20):
                    got += len(chunk)
    # only kernel socket buffers (auto-tuned, some MB) hold data: the upstream is stopped, and
    # ragtoll did not read the 96 MB answer into memory on the slow client's behalf
    assert later - held < 1024 * 1024, f"upstream still writing to a client that reads nothing: {held} -> {later}"
    assert held < size // 3, f"upstream wrote {held} of {size} bytes to a client that read nothing"
    assert got > size and seen.bytes_sent >= size  # then all of it arrived once the client read
