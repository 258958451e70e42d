"""The agent's exit, bounded: the SDK's last export waits at most `RAGTOLL_EXPORT_EXIT_TIMEOUT_MS`.

Under `opentelemetry-instrument` the SDK flushes spans, metrics and logs when the agent exits, and
its OTLP exporters retry for up to OTEL_EXPORTER_OTLP_TIMEOUT (10 s) each: with no collector
listening (or one that accepts and never answers) a 2 s agent took 12 s and printed export
errors. Here, before the SDK's own exit handlers run, the providers are shut down against one
deadline (500 ms by default); past it the agent exits without what was not sent and says so in
one line. A collector that answers is not affected: its flush takes milliseconds.

The tracer and logger providers' `shutdown()` take no timeout, so they run on a daemon thread that
is waited for until the deadline (the SDK's own handler, run after this one, then finds them shut
down and returns at once); the meter provider's `shutdown(timeout_millis=)` bounds itself.
Imports nothing of the proxy.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import metrics, trace

ENV_TIMEOUT = "RAGTOLL_EXPORT_EXIT_TIMEOUT_MS"
DEFAULT_TIMEOUT_MS = 500
MAX_TIMEOUT_MS = 60_000

_log = logging.getLogger("ragtoll.agent")


def exit_timeout_ms(env: Mapping[str, str]) -> int:
    """RAGTOLL_EXPORT_EXIT_TIMEOUT_MS: 0..60000 (a bad value keeps the default, with a warning)."""
    raw = env.get(ENV_TIMEOUT, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_MS
    if raw.isdigit() and int(raw) <= MAX_TIMEOUT_MS:
        return int(raw)
    _log.warning(
        "ragtoll: %s=%r ignored: expected milliseconds between 0 and %d (default %d)",
        ENV_TIMEOUT,
        raw[:32],
        MAX_TIMEOUT_MS,
        DEFAULT_TIMEOUT_MS,
    )
    return DEFAULT_TIMEOUT_MS


def collector(env: Mapping[str, str]) -> str:
    """Where the SDK sends traces, as the OTLP variables say (for the one line printed on a timeout)."""
    specific = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if specific:
        return specific
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    return "localhost:4317 (gRPC)" if protocol == "grpc" else "http://localhost:4318"


def shutdown_within(timeout_ms: int, providers: tuple[Any, ...]) -> list[str]:
    """Shuts the providers down, waiting at most `timeout_ms` in all; the names of those that did not
    finish. Providers without a `shutdown` (the API's no-op and proxy providers) are skipped."""
    deadline = time.monotonic() + timeout_ms / 1000
    pending: list[tuple[str, threading.Thread]] = []
    for provider in providers:
        shutdown: Callable[..., Any] | None = getattr(provider, "shutdown", None)
        if shutdown is None:
            continue
        name = type(provider).__name__
        if "timeout_millis" in inspect.signature(shutdown).parameters:  # the meter provider's bounds itself
            pending.append((name, _start(shutdown, timeout_millis=timeout_ms)))
        else:
            pending.append((name, _start(shutdown)))
    late = []
    for name, thread in pending:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            late.append(name)
    return late


def _start(target: Callable[..., Any], **kwargs: Any) -> threading.Thread:
    def run() -> None:
        try:
            target(**kwargs)
        except Exception:  # noqa: BLE001 - an exporter's failure at exit is the SDK's to log
            _log.debug("telemetry shutdown failed at exit", exc_info=True)

    thread = threading.Thread(target=run, name="ragtoll-exit-export", daemon=True)
    thread.start()
    return thread


def bounded_exit(env: Mapping[str, str] | None = None) -> None:
    """The exit handler: shuts the global providers down within the bound; one line when it passed."""
    env = os.environ if env is None else env
    timeout_ms = exit_timeout_ms(env)
    from opentelemetry import _logs  # the Logs API lives in an underscored module (still unstable)

    providers = (trace.get_tracer_provider(), metrics.get_meter_provider(), _logs.get_logger_provider())
    # an agent that shut its providers down itself has nothing left to send; the meter provider
    # then logs that it was shut down twice, which says nothing to the user
    sdk_metrics = logging.getLogger("opentelemetry.sdk.metrics._internal")
    sdk_metrics.addFilter(_not_twice)
    try:
        late = shutdown_within(timeout_ms, providers)
    finally:
        sdk_metrics.removeFilter(_not_twice)
    if late:
        _log.warning(
            "ragtoll: telemetry not exported within %d ms at exit (no OTLP collector answering at %s?); "
            "exiting without it (%s=%d)",
            timeout_ms,
            collector(env),
            ENV_TIMEOUT,
            timeout_ms,
        )


def _not_twice(record: logging.LogRecord) -> bool:
    return record.getMessage() != "shutdown can only be called once"


def register() -> None:
    """Runs `bounded_exit` at exit, before the SDK's own handlers (atexit runs the last registered
    first, and the SDK registered its handlers when the distro configured it, before any hook)."""
    atexit.register(bounded_exit)
