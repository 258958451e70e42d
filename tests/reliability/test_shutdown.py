"""SIGTERM with live tasks, against the real `ragtoll serve`: calls in flight finish, new ones are
refused, and every live task gets its record and its `ragtoll.task` span (memory store), or is
handed over to the replica that stays, which ends it once idle (Redis)."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from support.otlp import OtlpReceiver
from support.process import RagtollProcess
from support.servers import serve_in_thread

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}


@pytest.fixture
def otlp() -> Iterator[tuple[str, OtlpReceiver]]:
    receiver = OtlpReceiver()
    with serve_in_thread(receiver) as url:
        yield url, receiver


def _config(upstream: str, **extra: Any) -> dict[str, Any]:
    return {"upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream, "prefix": "/openai"}],
            "budgets": {"default_profile": "p", "profiles": {"p": {"max_steps": 100}}, **extra.pop("budgets", {})},
            "tasks": {"idle_timeout_s": 600}, **extra}


def _env(otlp_url: str) -> dict[str, str]:
    return {"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_url, "OTEL_METRICS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}


def _until(check: Callable[[], bool], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _refused(base: str) -> bool:
    try:
        httpx.get(f"{base}/healthz", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def _task_spans(receiver: OtlpReceiver) -> dict[str, dict[str, Any]]:
    with receiver.lock:
        return {s["attributes"]["ragtoll.task.id"]: s for s in receiver.spans if s["name"] == "ragtoll.task"}


@pytest.mark.slow
def test_sigterm_finishes_calls_in_flight_then_ends_every_live_task(
        upstream: Any, otlp: tuple[str, OtlpReceiver], tmp_path: Path) -> None:
    otlp_url, receiver = otlp
    records = tmp_path / "records.jsonl"
    rt = RagtollProcess(tmp_path, _config(upstream.url, budgets={"records_file": str(records)}), env=_env(otlp_url))
    rt.start()
    tasks = [f"live-{i}" for i in range(3)]
    with httpx.Client(timeout=30) as http:
        for t in tasks:
            assert http.post(f"{rt.base}/openai/v1/chat/completions", json=CHAT,
                             headers={"x-ragtoll-task-id": t}).status_code == 200
    slow: dict[str, Any] = {}

    def in_flight() -> None:  # a call still running when SIGTERM arrives
        with httpx.Client(timeout=30) as own:
            slow["r"] = own.post(f"{rt.base}/openai/v1/chat/completions", json=CHAT,
                                 headers={"x-ragtoll-task-id": "slow-task", "x-test-delay": "1.5"})

    caller = threading.Thread(target=in_flight)
    caller.start()
    _until(lambda: any(r["headers"].get("x-test-delay") == "1.5" for r in upstream.app.state.requests))
    assert rt.proc is not None
    rt.proc.send_signal(signal.SIGTERM)
    _until(lambda: _refused(rt.base))  # it stops accepting at once
    caller.join(30)
    assert rt.proc.wait(30) == 0
    rt.stop()
    assert slow["r"].status_code == 200  # the call in flight finished
    ended = {r["task_id"]: r for r in map(json.loads, records.read_text().splitlines()) if "task_id" in r}
    assert set(ended) == {*tasks, "slow-task"}
    assert {r["end_reason"] for r in ended.values()} == {"shutdown"}
    assert all(r["calls"] == 1 for r in ended.values())
    spans = _task_spans(receiver)  # exported before the process exited
    assert set(spans) == set(ended)


@pytest.mark.slow
def test_sigterm_with_redis_hands_live_tasks_to_the_replica_that_stays(
        upstream: Any, otlp: tuple[str, OtlpReceiver], redis_url: str, tmp_path: Path) -> None:
    otlp_url, receiver = otlp
    stream = f"records-{time.time_ns()}"
    cfg = _config(upstream.url, store=redis_url, budgets={"records_stream": stream},
                  tasks={"idle_timeout_s": 1})
    leaving = RagtollProcess(tmp_path, cfg, env=_env(otlp_url)).start()
    staying = RagtollProcess(tmp_path, cfg, env=_env(otlp_url)).start()
    try:
        tasks = [f"handed-{time.time_ns()}-{i}" for i in range(3)]
        with httpx.Client(timeout=30) as http:
            for t in tasks:
                assert http.post(f"{leaving.base}/openai/v1/chat/completions", json=CHAT,
                                 headers={"x-ragtoll-task-id": t}).status_code == 200
        assert leaving.proc is not None
        leaving.proc.send_signal(signal.SIGTERM)
        assert leaving.proc.wait(30) == 0
        client = redis.Redis.from_url(redis_url)

        def recorded() -> dict[str, dict[str, Any]]:
            out = {}
            for _, fields in client.xrange(stream):
                record = json.loads(next(iter(fields.values())))
                out[record["task_id"]] = record
            return out

        _until(lambda: set(tasks) <= set(recorded()), 20)  # the staying replica's sweep ended them
        assert {recorded()[t]["end_reason"] for t in tasks} == {"idle"}
        _until(lambda: set(tasks) <= set(_task_spans(receiver)), 20)
    finally:
        staying.stop()
        leaving.stop()


def test_a_draining_app_refuses_new_calls_and_is_not_ready(upstream: Any, tmp_path: Path) -> None:
    """Between SIGTERM and the end of the calls in flight, a call that still reaches ragtoll (on a
    connection the server had open) is refused with a 503 another replica may retry, and /readyz
    says draining, so a load balancer stops sending."""
    from ragtoll.proxy import config
    from ragtoll.proxy.app import build_app

    app = build_app(config.parse(_config(upstream.url, budgets={"records_file": str(tmp_path / "r.jsonl")})))
    with serve_in_thread(app) as base, httpx.Client(timeout=10) as http:
        assert http.get(f"{base}/readyz").status_code == 200
        app.drain()
        refused = http.post(f"{base}/openai/v1/chat/completions", json=CHAT)
        ready = http.get(f"{base}/readyz")
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    assert refused.headers["connection"] == "close"
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    assert upstream.app.state.calls["/v1/chat/completions"] == 0
