"""Tier 1 never stalls an agent: with no OTLP collector, the agent's exit waits at most the bound.

The agent runs as users run it, `opentelemetry-instrument python agent.py` in a subprocess, with
the SDK's own exporter timeout raised to 30 s (OTEL_EXPORTER_OTLP_TIMEOUT): without the bound its
exit would wait that long for a collector that accepts the connection and never answers, so the
subprocess `timeout=` below (which must not expire) tells a bounded exit from an unbounded one
without measuring anything. The collectors are a loopback port nothing listens on and a socket
that accepts and holds every connection.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from ragtoll.instrumentation import agent_exit

INSTRUMENT = str(Path(sys.executable).parent / "opentelemetry-instrument")
SDK_TIMEOUT_S = 30  # the exporter's own timeout in these runs: an unbounded exit waits this long
MUST_EXIT_WITHIN_S = 20  # the subprocess guard: far above the bound, far below the SDK's timeout
AGENT = """
import time
from opentelemetry import metrics, trace
metrics.get_meter("agent").create_counter("agent.work").add(1)
with trace.get_tracer("agent").start_as_current_span("work"):
    time.sleep(0.05)
print("agent done", flush=True)
"""


class BlackHole:
    """A collector that accepts connections and never answers (a stuck collector, a firewall's sink)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="black-hole", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.held.append(conn)

    def close(self) -> None:
        self.listener.close()
        self._thread.join(5)
        for conn in self.held:
            conn.close()


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    hole = BlackHole()
    try:
        yield hole
    finally:
        hole.close()


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def instrumented(script: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`script` under opentelemetry-instrument with `env` over this environment's, less its OTEL_ and
    RAGTOLL_ variables; it must exit within MUST_EXIT_WITHIN_S."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAGTOLL_"))}
    return subprocess.run(
        [INSTRUMENT, sys.executable, str(script)],
        env={**inherited, **env},
        capture_output=True,
        text=True,
        timeout=MUST_EXIT_WITHIN_S,
        check=False,
    )


def run_agent(tmp_path: Path, port: int, protocol: str, **extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    done = instrumented(
        script,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
        OTEL_EXPORTER_OTLP_TIMEOUT=str(SDK_TIMEOUT_S),
        OTEL_SERVICE_NAME="stalled-agent",
        RAGTOLL_TASK_ROOT="process",
        **extra,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "agent done"
    return done


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_agent_exits_within_the_bound_while_a_collector_holds_the_connection(
    tmp_path: Path, black_hole: BlackHole, protocol: str
) -> None:
    done = run_agent(tmp_path, black_hole.port, protocol)
    assert black_hole.held, "the exporter never reached the collector"  # it was held, not refused
    said = [line for line in done.stderr.splitlines() if line.startswith("ragtoll: telemetry not exported")]
    expected = (
        f"ragtoll: telemetry not exported within 500 ms at exit (no OTLP collector answering at "
        f"http://127.0.0.1:{black_hole.port}?); exiting without it (RAGTOLL_EXPORT_EXIT_TIMEOUT_MS=500)"
    )
    assert said == [expected], done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_agent_exits_within_the_bound_with_no_collector_listening(tmp_path: Path, protocol: str) -> None:
    done = run_agent(tmp_path, unused_port(), protocol, RAGTOLL_EXPORT_EXIT_TIMEOUT_MS="200")
    assert done.stderr.count("ragtoll: telemetry not exported within 200 ms at exit") == 1, done.stderr


class StuckProvider:
    """A provider whose shutdown hangs until released (as an exporter stuck in a send does)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def shutdown(self) -> None:
        self.release.wait(60)


def test_shutdown_within_names_the_provider_that_did_not_finish() -> None:
    stuck, finished = StuckProvider(), TracerProvider(shutdown_on_exit=False)
    try:
        assert agent_exit.shutdown_within(100, (stuck, finished, object())) == ["StuckProvider"]
    finally:
        stuck.release.set()


def test_exit_timeout_comes_from_env_and_a_bad_value_keeps_the_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert agent_exit.exit_timeout_ms({}) == agent_exit.DEFAULT_TIMEOUT_MS
    assert agent_exit.exit_timeout_ms({agent_exit.ENV_TIMEOUT: "1500"}) == 1500
    assert agent_exit.exit_timeout_ms({agent_exit.ENV_TIMEOUT: "soon"}) == agent_exit.DEFAULT_TIMEOUT_MS
    assert "RAGTOLL_EXPORT_EXIT_TIMEOUT_MS='soon' ignored" in caplog.text
    assert agent_exit.collector({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == "localhost:4317 (gRPC)"
    assert agent_exit.collector({}) == "http://localhost:4318"


@pytest.mark.slow
def test_an_agent_that_shut_its_providers_down_itself_hears_nothing_more(tmp_path: Path) -> None:
    script = tmp_path / "tidy.py"
    script.write_text(
        "from opentelemetry import metrics, trace\n"
        "metrics.get_meter_provider().shutdown()\n"
        "trace.get_tracer_provider().shutdown()\n"
        "print('agent done', flush=True)\n"
    )
    done = instrumented(script, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{unused_port()}",
                        OTEL_LOGS_EXPORTER="none")
    assert done.returncode == 0 and done.stdout.strip() == "agent done", done.stderr
    assert "shutdown can only be called once" not in done.stderr
    assert "ragtoll: telemetry not exported" not in done.stderr
