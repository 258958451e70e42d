"""One call as the stages see it: the typed `Exchange`, a local `Reply`, the `Stage` base and the
`Contract` each stage declares (which exchange fields it reads and writes, per phase).

Stages hand each other data only through the exchange's typed fields, never a loose dict, and
keep no per-call state anywhere else. `check_contracts` proves a stage list's order serves every
read (the pipeline runs it at start-up), so a reordered list fails loudly, not silently.
Below the pipeline and every stage: it imports value types only, and those of other rooms for
annotations.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ..core.tally import Tallies
from ..model import Call, Observation, TaskRef

if TYPE_CHECKING:  # value types of the rooms below; annotations only, so nothing loads at import
    from ..cache.evidence import Filing
    from ..config import Timeouts
    from ..core.budget import Admission, Settlement
    from ..core.hold import StreamState
    from ..errors import RagtollError
    from .body import RequestBody
    from .caller import Caller
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

    # set by the pipeline before any stage runs (PIPELINE_FIELDS)
    route: Route
    method: str
    target: str
    headers: dict[str, str]
    raw_headers: list[tuple[bytes, bytes]]
    client: str
    started: float
    task: TaskRef | None = None
    caller: Caller | None = None  # who is calling, resolved once (request/caller.py)
    call: Call = field(default_factory=lambda: Call(operation="other"))
    body: bytes | None = None
    request_body: RequestBody | None = None  # the client's body, read through this once
    span: Any = None  # the call span (opentelemetry Span)
    timeouts: Timeouts | None = None
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # every stage may append
    # an untracked LLM call's conversation (core/conversation.Thread; request/conversation.py), else None
    thread: Any = None
    oversized_query: int = 0  # the length of a query past server.max_query_chars (then call.query is None)
    # set by the pipeline and the forwarder as the answer arrives (RESPONSE_FIELDS)
    observation: Observation = field(default_factory=Observation)
    status: int | None = None
    error: RagtollError | None = None
    outcome: str = "ok"  # ok | rejected | upstream_error | client_disconnect | error
    upstream_seconds: float = 0.0
    bytes_out: int = 0
    headers_sent: bool = False  # after this the status can no longer change
    complete: bool = False  # the response body reached its end (a stream cut by a budget included)
    body_error: Exception | None = None  # why a streamed request body failed (the upstream sees only a break)
    # a retrieval answer read whole, decoded, before `on_response`; a stage there may replace it
    # (the forwarder then sends the replacement, plain, with its own content-length)
    response_body: bytes | None = None
    watcher: asyncio.Task[None] | None = None  # cancels the call when the client goes away
    # what the stages hand each other (each stage's `contract` says which it reads and writes)
    proposal: Reply | None = None  # a local answer proposed by an earlier stage (see above)
    cache: CacheOutcome | None = None  # the cache stage's decision (spans, metrics)
    filing: Filing | None = None  # a cache miss's evidence, filed in on_end
    charged_principal: str | None = None  # the principal whose rolling cost this call's spend joins
    admission: Admission | None = None  # the budget's decision and reservation for this call
    stream_state: StreamState | None = None  # an admitted stream's hold, extensions and cut
    budget_record: Callable[..., None] | None = None  # the reservation's span record, written once
    new_chunks: int | None = None  # a retrieval read whole: how many of its chunks are new to the task
    budget_left: dict[str, float] | None = None  # what the task had left when this call was admitted (budget)
    settlement: Settlement | None = None  # what the task's ledger was finally charged for this call
    # the call's additions to its task's context-economy numbers (context and evidence stages);
    # the budget settles them into the task's ledger with the call
    tallies: Tallies = field(default_factory=Tallies)
    degraded: str | None = None  # why the budget did not apply (store trouble, on_store_error: open)
    # an admission while the store's answer was unknown: `local` (the local ledger bounded it) or
    # `none` (nothing did); metrics count it (ragtoll.budget.degraded_admissions)
    degraded_bound: str | None = None
    # a stage that cut the upstream timeout short (the budget's deadline): what to answer instead of
    # a retryable 504 when that timeout expires (None: the 504 stands)
    timeout_error: Callable[[], RagtollError | None] | None = None
    # set by an `on_chunk` that holds the chunk back: the forwarder awaits it before sending the
    # chunk, and sends instead the bytes it returns and ends the stream (None: send the chunk)
    gate: Callable[[], Awaitable[bytes | None]] | None = None


# Fields the pipeline sets before the first stage's `on_request`, and those it and the forwarder
# set as the answer arrives (readable from `on_chunk`/`on_response` on).
PIPELINE_FIELDS = frozenset({"route", "method", "target", "headers", "raw_headers", "client", "started", "task",
                             "caller", "call", "body", "request_body", "span", "timeouts", "response_headers", "thread",
                             "oversized_query"})
RESPONSE_FIELDS = frozenset({"observation", "status", "error", "outcome", "upstream_seconds", "bytes_out",
                             "headers_sent", "complete", "body_error", "watcher", "response_body"})
FIELDS = frozenset(f.name for f in dataclasses.fields(Exchange))


@dataclass(frozen=True, slots=True)
class Contract:
    """The exchange fields a stage reads and writes, by phase: `request` (`on_request`, in list
    order), `response` (`on_chunk` and `on_response`, in list order, after every `on_request`),
    `end` (`on_end`, in reverse list order). A field is written where it is assigned or, for a
    mutable value on the exchange, changed; `response_headers` may be appended to by any stage."""

    reads: frozenset[str] = frozenset()
    writes: frozenset[str] = frozenset()
    response_reads: frozenset[str] = frozenset()
    response_writes: frozenset[str] = frozenset()
    end_reads: frozenset[str] = frozenset()
    end_writes: frozenset[str] = frozenset()

    def fields(self) -> frozenset[str]:
        return (self.reads | self.writes | self.response_reads | self.response_writes | self.end_reads
                | self.end_writes)


def contract(*, reads: str = "", writes: str = "", response_reads: str = "", response_writes: str = "",
             end_reads: str = "", end_writes: str = "") -> Contract:
    """A Contract from space-separated field names (`contract(reads="task call", writes="admission")`)."""
    return Contract(*(frozenset(names.split()) for names in (reads, writes, response_reads, response_writes,
                                                              end_reads, end_writes)))


class ContractError(RuntimeError):
    """A stage list whose order cannot serve a stage's reads, or a contract naming no exchange field."""


def check_contracts(stages: Sequence[Stage]) -> None:
    """Raise ContractError when a stage reads a field before the stage that writes it has run.

    `on_request` runs in list order: a stage reads too early what only stages after it write (a
    field the pipeline set may be read before a later stage rewrites it: that reader wants the
    original). `on_chunk` / `on_response` follow every `on_request`, in list order. `on_end` runs in
    reverse: a stage reads too early what stages before it write there and none after it does. A
    field no stage writes keeps its default (None), which every reader handles: a stage that is
    switched off (the cache, principals) breaks no order."""
    for stage in stages:
        unknown = stage.contract.fields() - FIELDS
        if unknown:
            raise ContractError(f"{type(stage).__name__}.contract names no exchange field: {sorted(unknown)}")
    contracts = [s.contract for s in stages]
    request = frozenset().union(*(c.writes for c in contracts))
    for i, (stage, c) in enumerate(zip(stages, contracts, strict=True)):
        before, after = contracts[:i], contracts[i + 1:]
        _require(stage, "on_request", c.reads - PIPELINE_FIELDS, after, before, lambda x: x.writes)
        _require(stage, "on_chunk/on_response", c.response_reads - request - PIPELINE_FIELDS, after, before,
                 lambda x: x.response_writes)
        _require(stage, "on_end", c.end_reads, before, after, lambda x: x.end_writes)


def _require(stage: Stage, phase: str, reads: frozenset[str], later: Sequence[Contract], sooner: Sequence[Contract],
             writes: Callable[[Contract], frozenset[str]]) -> None:
    """`later` / `sooner`: the stages whose `phase` runs after / before this one's."""
    missing = (reads & frozenset().union(*map(writes, later))) - frozenset().union(*map(writes, sooner))
    if missing:
        raise ContractError(f"{type(stage).__name__}.{phase} reads {sorted(missing)}, which only stages that run "
                            "after it in that phase write: the stage list is out of order")


class Stage:
    """One concern of a call. Every phase is a no-op unless a stage overrides it; the pipeline
    calls `on_chunk` and `on_response` only on the stages that do. `contract` names the exchange
    fields each phase reads and writes (`check_contracts`).

    Guarantees the pipeline gives: every stage whose `on_request` ran gets exactly one `on_end`
    (success, error, refusal or client disconnect), in reverse order; `on_end` failures are
    recorded on the span and never fail the call.
    """

    contract: ClassVar[Contract] = Contract()

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
