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

import httpx
import orjson
import pytest
from conftest import ProxyFactory, Telemetry
from ragtoll.instrumentation import semconv as sc
from support.admin import ADMIN_HEADERS, ledger
from support.faulty import (
    BUDGETS,
    CHAT,
    FaultyUpstream,
    host_port,
    new_task,
    raw_request,
    routes,
    slow_reader,
)
from support.poll import wait_steady, wait_until
from support.spans import call_span

pytestmark = pytest.mark.usefixtures("admin_token")


def hang_up(base: str, data: bytes) -> None:
    with socket.create_connection(host_port(base), timeout=5) as sock:
        sock.sendall(data)
        time.sleep(0.05)  # the client lingers a moment before it goes: part of the fault


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
            # the request is over when its span ends (still named by the request: the body never
            # arrived, so no call was parsed, and the span carries no task)
            assert wait_until(lambda: telemetry.by_name("POST /openai"))
            assert not [s for s in telemetry.spans() if s.attributes.get(sc.TASK_ID) == task]
            gone = http.get(f"{base}/admin/tasks/{task}", headers=ADMIN_HEADERS)
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
        assert wait_until(lambda: seen.peer_closed)  # the stalled upstream was hung up on, not left waiting
        span = call_span(telemetry, task)
        after = ledger(http, base, task)
    assert span.attributes[sc.OUTCOME] == "client_disconnect"
    assert after["in_flight"] == 0 and after["used"]["completion_tokens"] < CHAT["max_tokens"]


@pytest.mark.slow
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
        wait_until(lambda: ledger(http, base, task)["in_flight"] == 0)
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(30):
            one_round()
        assert wait_until(lambda: ledger(http, base, task)["in_flight"] == 0)
        after = len(os.listdir("/proc/self/fd"))
    assert after <= fds + 4  # this process holds proxy, upstream and clients: none kept the dead sockets


@pytest.mark.slow
def test_slow_reader_holds_the_upstream_back(proxy: ProxyFactory) -> None:
    with FaultyUpstream(big_bytes=96 * 1024 * 1024) as big:
        size = big.big_bytes
        with proxy(upstreams=routes(big.url, read_timeout=30)) as base:
            req = raw_request("GET", "/raw/blob", {"x-fault": "big", "connection": "close"})
            with slow_reader(base, req) as sock:
                assert wait_until(lambda: len(big.seen) > 0)
                seen = big.seen[-1]
                # the client reads nothing: buffers fill, then everything waits
                held = wait_steady(lambda: seen.bytes_sent, quiet=0.5)
                time.sleep(1.0)  # and keeps waiting while the client still reads nothing
                later = seen.bytes_sent
                got = 0
                while chunk := sock.recv(1 << 20):
                    got += len(chunk)
    # only kernel socket buffers (auto-tuned, some MB) hold data: the upstream is stopped, and
    # ragtoll did not read the 96 MB answer into memory on the slow client's behalf
    assert later - held < 1024 * 1024, f"upstream still writing to a client that reads nothing: {held} -> {later}"
    assert held < size // 3, f"upstream wrote {held} of {size} bytes to a client that read nothing"
    assert got > size and seen.bytes_sent >= size  # then all of it arrived once the client read
