"""One call as the stages see it: the typed `Exchange`, a local `Reply`, and the `Stage` base.

Stages hand each other data only through the exchange's typed fields, never a loose dict. Below
the pipeline and every stage: it imports value types only, and those of other rooms for annotations.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..model import Call, Observation, TaskRef

if TYPE_CHECKING:  # value types of the rooms below; annotations only, so nothing loads at import
    from ..cache.evidence import Filing
    from ..config import Timeouts
    from ..core.budget import Ticket
    from ..errors import RagtollError
    from .body import RequestBody
    from .routing import Route


@dataclass(slots=True)
class Reply:
    """A local answer; the upstream is not called."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    content_type: bytes = b"application/json"


@dataclass(slots=True)
class CacheOutcome:
    """What the cache decided for this call: `hit`, `miss` or `bypass`, and a hit's tier."""

    result: str
    tier: str | None = None
    similarity: float | None = None


@dataclass(slots=True)
class Exchange:
    """Everything the stages share about one call.

    The one rule for local answers: a stage may *propose* a reply (`proposal`: the cache's hit);
    the stages after it see the proposal and may charge it (the budget charges it as a call) or
    veto it (set it to None: the call goes upstream). A stage that *returns* a Reply from
    `on_request`, or raises a `Rejected`, answers at once and the stages after it do not run.
    """

    route: Route
    method: str
    target: str
    headers: dict[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    client: str
    started: float
    task: TaskRef | None = None
    call: Call = field(default_factory=lambda: Call(operation="other"))
    body: bytes | None = None
    request_body: RequestBody | None = None  # the client's body, read through this once
    observation: Observation = field(default_factory=Observation)
    span: Any = None  # the call span (opentelemetry Span)
    status: int | None = None
    error: RagtollError | None = None
    outcome: str = "ok"  # ok | rejected | upstream_error | client_disconnect | error
    timeouts: Timeouts | None = None
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    upstream_seconds: float = 0.0
    bytes_out: int = 0
    headers_sent: bool = False  # after this the status can no longer change
    complete: bool = False  # the response body reached its end (a stream cut by a budget included)
    body_error: Exception | None = None  # why a streamed request body failed (the upstream sees only a break)
    watcher: asyncio.Task[None] | None = None  # cancels the call when the client goes away
    # what the stages hand each other
    proposal: Reply | None = None  # a local answer proposed by an earlier stage (see above)
    cache: CacheOutcome | None = None  # the cache stage's decision (spans, metrics)
    filing: Filing | None = None  # a cache miss's evidence, filed in on_end
    ticket: Ticket | None = None  # the budget's reservation for this call
    degraded: str | None = None  # why the budget did not apply (store trouble, on_store_error: open)
    # a stage that cut the upstream timeout short (the budget's deadline): what to answer instead of
    # a retryable 504 when that timeout expires (None: the 504 stands)
    timeout_error: Callable[[], RagtollError | None] | None = None
    # set by an `on_chunk` that holds the chunk back: the forwarder awaits it before sending the
    # chunk, and sends instead the bytes it returns and ends the stream (None: send the chunk)
    gate: Callable[[], Awaitable[bytes | None]] | None = None


class Stage:
    """One concern of a call. Every phase is a no-op unless a stage overrides it; the pipeline
    calls `on_chunk` and `on_response` only on the stages that do.

    Guarantees the pipeline gives: every stage whose `on_request` ran gets exactly one `on_end`
    (success, error, refusal or client disconnect), in reverse order; `on_end` failures are
    recorded on the span and never fail the call.
    """

    async def on_request(self, ex: Exchange) -> Reply | None:
        """Before the upstream: return a Reply to answer now, or raise `Rejected` to refuse."""
        return None

    def on_chunk(self, ex: Exchange, chunk: bytes) -> bytes | None:
        """Each decoded response chunk; return bytes to end the stream with them instead of the rest,
        or set `ex.gate` to hold the chunk back until the gate's awaitable decides."""
        return None

    async def on_response(self, ex: Exchange) -> None:
        """A small retrieval answer was read whole, before its head is sent: may add response headers."""
        return

    async def on_end(self, ex: Exchange) -> None:
        """The call is over (answered, refused, failed or abandoned): bookkeeping."""
        return

    def on_task_end(self, task_id: str) -> None:
        """A task ended: drop what the stage keeps per task."""
        return
