"""Upstream faults over real sockets: reset before headers and mid-stream, stall mid-stream, garbage
instead of HTTP, broken chunked framing, a 10 MB answer, a dribbled body, a refused connection.

For each: the client gets the documented outcome (a JSON 502/504 before headers; a cut-short body
after them, never a fake end), the call span records it, and the task's reservation is settled
(GET /admin/tasks/{id}: nothing left in flight, no output tokens still reserved).
"""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import ProxyFactory, Telemetry
from ragtoll.instrumentation import semconv as sc
from support.admin import ledger
from support.faulty import BUDGETS, CHAT, FaultyUpstream, new_task, routes
from support.servers import free_port
from support.spans import call_span

pytestmark = pytest.mark.usefixtures("admin_token")


@pytest.mark.parametrize(("fault", "status", "code"), [
    ("reset-before-headers", 502, "upstream_unavailable"),
    ("garbage", 502, "upstream_unavailable"),
    ("no-headers", 504, "upstream_timeout"),
])
@pytest.mark.slow
def test_failure_before_headers_is_a_json_error_and_releases_the_reservation(
        proxy: ProxyFactory, faulty: FaultyUpstream, telemetry: Telemetry, fault: str, status: int, code: str) -> None:
    task = new_task()
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
        r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT,
                      headers={"x-ragtoll-task-id": task, "x-fault": fault})
        after = ledger(http, base, task)
    assert r.status_code == status
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == code and r.json()["error"]["upstream"] == "openai"
    span = call_span(telemetry, task)
    assert span.attributes[sc.ERROR_TYPE] == code
    assert span.attributes[sc.OUTCOME] == "upstream_error"
    # the step was taken, but nothing was produced: no output tokens stay reserved
    assert after["in_flight"] == 0
    assert after["used"]["steps"] == 1 and after["used"]["completion_tokens"] == 0


def test_refused_connection_releases_the_reservation(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    task = new_task()
    dead = f"http://127.0.0.1:{free_port()}"
    with proxy(upstreams=routes(dead), budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
        r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT, headers={"x-ragtoll-task-id": task})
        after = ledger(http, base, task)
    assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unavailable"
    assert call_span(telemetry, task).attributes[sc.ERROR_TYPE] == "upstream_unavailable"
    assert after["in_flight"] == 0 and after["used"]["completion_tokens"] == 0


@pytest.mark.parametrize(("fault", "code"), [
    ("reset-mid-stream", "upstream_unavailable"),
    ("stall-mid-stream", "upstream_timeout"),
    ("garbage-mid-body", "upstream_unavailable"),
])
@pytest.mark.slow
def test_failure_mid_stream_cuts_the_body_short_and_settles(
        proxy: ProxyFactory, faulty: FaultyUpstream, telemetry: Telemetry, fault: str, code: str) -> None:
    task = new_task()
    received = b""
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
        t0 = time.monotonic()
        with pytest.raises(httpx.RemoteProtocolError), http.stream(
                "POST", f"{base}/openai/v1/chat/completions", json={**CHAT, "stream": True},
                headers={"x-ragtoll-task-id": task, "x-fault": fault}) as resp:
            assert resp.status_code == 200  # headers were already sent when the upstream failed
            for chunk in resp.iter_raw():
                received += chunk
        elapsed = time.monotonic() - t0
        after = ledger(http, base, task)
    assert received.startswith(b"data: ")
    assert b"[DONE]" not in received and b"finish_reason\":\"stop" not in received  # no fake end
    assert elapsed < 5  # the stall is bounded by the 0.5 s read timeout, not waited out
    span = call_span(telemetry, task)
    assert span.attributes[sc.OUTCOME] == "upstream_error"
    assert span.attributes[sc.ERROR_TYPE] == code
    assert span.attributes[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    # settled on what streamed: the 50 reserved output tokens are replaced by the few seen
    assert after["in_flight"] == 0
    assert after["used"]["completion_tokens"] < CHAT["max_tokens"]
    if fault == "stall-mid-stream":
        assert faulty.last().peer_closed  # ragtoll hung up on the stalled upstream


@pytest.mark.slow
def test_ten_megabyte_answer_arrives_whole_and_is_recorded(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                            telemetry: Telemetry) -> None:
    tasks = {"raw": new_task(), "openai": new_task()}
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base, httpx.Client(timeout=30) as http:
        raw = http.get(f"{base}/raw/blob", headers={"x-ragtoll-task-id": tasks["raw"], "x-fault": "big"})
        llm = http.post(f"{base}/openai/v1/chat/completions", json=CHAT,
                        headers={"x-ragtoll-task-id": tasks["openai"], "x-fault": "big"})
        after = ledger(http, base, tasks["openai"])
    for r in (raw, llm):
        assert r.status_code == 200 and len(r.content) == faulty.big_bytes
        assert set(r.content) == {ord("x")}
    assert call_span(telemetry, tasks["raw"]).attributes[sc.BYTES_OUT] == faulty.big_bytes
    span = call_span(telemetry, tasks["openai"])
    assert span.attributes[sc.OUTCOME] == "ok"
    assert "max_inspect_bytes" in span.attributes[sc.RESPONSE_UNREAD]  # too large to read: recorded, passed on
    assert after["in_flight"] == 0


@pytest.mark.slow
def test_dribbled_body_arrives_whole(proxy: ProxyFactory, faulty: FaultyUpstream, telemetry: Telemetry) -> None:
    task = new_task()
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
        r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT,
                      headers={"x-ragtoll-task-id": task, "x-fault": "slow-body"})
        after = ledger(http, base, task)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    assert call_span(telemetry, task).attributes[sc.OUTCOME] == "ok"
    assert after["in_flight"] == 0 and after["used"]["completion_tokens"] == 1  # settled on the real usage
