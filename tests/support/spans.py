"""Call spans as the fault tests look for them. A call span ends just after its response is
sent (the settle runs first), so these wait for it rather than read the exporter once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from typing import Any, Protocol

from ragtoll.instrumentation import semconv as sc

from .poll import wait_until


class Spans(Protocol):
    def spans(self) -> list[Any]: ...


def call_spans(telemetry: Spans, count: int, tasks: Collection[str] | None = None,
               timeout: float = 10.0) -> list[Any]:
    """The finished call spans (of `tasks`, or of any task), once there are `count` of them (or
    those there are at `timeout`)."""
    def found() -> list[Any]:
        return [s for s in telemetry.spans() if sc.TASK_ID in s.attributes and sc.OUTCOME in s.attributes
                and (tasks is None or s.attributes[sc.TASK_ID] in tasks)]

    wait_until(lambda: len(found()) >= count, timeout)
    return found()


def call_span(telemetry: Spans, task: str, timeout: float = 5.0) -> Any:
    """The task's latest finished call span."""
    spans = call_spans(telemetry, 1, {task}, timeout)
    if not spans:
        raise AssertionError(f"no call span for {task}")
    return spans[-1]


def reserve_failed(span: Any) -> bool:
    """The call's budget reserve failed: it went on (or was refused) by `on_store_error`."""
    return bool(span.attributes.get(sc.DEGRADED)) and any(
        e.name == sc.EVENT_DEGRADED and "on_store_error" in e.attributes for e in span.events)


def reserve_failures(telemetry: Spans) -> Counter[str]:
    """Per task: call spans whose reserve failed."""
    return Counter(s.attributes[sc.TASK_ID] for s in telemetry.spans() if reserve_failed(s))
