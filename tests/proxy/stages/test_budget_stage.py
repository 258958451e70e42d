"""The budget stage on exchanges without a server: admit and refuse, the charge of a proposed local
answer, the remaining header, the stream cut, the settle, and what a failing store does."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from typing import Any

import http_sfv
import orjson
import pytest
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.core.budget import Actual, Charge, Ledger, Reservation
from ragtoll.proxy.core.hold import Grant
from ragtoll.proxy.errors import BudgetExceeded, StoreUnavailable
from ragtoll.proxy.request.exchange import Exchange, Reply
from ragtoll.proxy.stages.budget import REMAINING_HEADER, BudgetStage, breaker_for
from ragtoll.proxy.stores.base import Decision, TaskMeta
from ragtoll.proxy.stores.breaker import STORE_RETRY_MS
from ragtoll.proxy.stores.memory import MemoryStore
from support.exchanges import CHAT, Exchanges, answer


def budgets(**limits: Any) -> dict[str, Any]:
    return {"default_profile": "p", "profiles": {"p": limits}}


def header(ex: Exchange, name: bytes) -> bytes | None:
    return next((v for k, v in ex.response_headers if k == name), None)


def remaining(ex: Exchange) -> http_sfv.Dictionary:
    raw = header(ex, REMAINING_HEADER)
    assert raw is not None
    parsed = http_sfv.Dictionary()
    parsed.parse(raw)
    return parsed


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


class CountingStore:
    """A budget store (the Store protocol) over a MemoryStore that fails on demand: `fail` names the
    failure domains whose reserves raise, `hang` those whose reserves never answer, `late` those
    whose reserves answer only after `late_s` (a paused Redis working through its backlog: the
    reserve lands even when its caller stopped waiting), `fail_settle` makes settles raise (that
    many times; True: every time). Tasks are in domain "a" or "b" by their first letter."""

    def __init__(self, inner: MemoryStore, fail: set[str] | None = None, hang: set[str] | None = None,
                 late: set[str] | None = None, late_s: float = 0.2) -> None:
        self.inner = inner
        self.fail = fail or set()
        self.hang = hang or set()
        self.late = late or set()
        self.late_s = late_s
        self.fail_settle: bool | int = False
        self.hang_settle = False  # settles never answer
        self.reserves: Counter[str] = Counter()
        self.settles = 0
        self.cancels = 0
        self.late_cancels = False  # cancels answer late too (after a late reserve landed)
        self.landed: list[asyncio.Task[Decision]] = []

    def failure_domain(self, task_id: str) -> str:
        return task_id[:1]

    async def reserve(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge, now_ms: int,
                      shadow: bool = False, *, reservation_id: str = "", expires_ms: int = 0) -> Decision:
        domain = self.failure_domain(task_id)
        self.reserves[domain] += 1
        if domain in self.hang:
            await asyncio.sleep(3600)  # a blackholed Redis: connected, never answering
        if domain in self.fail:
            raise ConnectionError(f"store node {domain} is down")

        async def run() -> Decision:
            if domain in self.late:
                await asyncio.sleep(self.late_s)
            return await self.inner.reserve(task_id, meta, limits, charge, now_ms, shadow,
                                            reservation_id=reservation_id, expires_ms=expires_ms)

        landing = asyncio.ensure_future(run())
        self.landed.append(landing)
        return await asyncio.shield(landing)  # the caller may stop waiting; the store goes on

    async def extend(self, task_id: str, reservation_id: str, tokens: int, cost_nusd: int,
                     limits: Mapping[str, int], now_ms: int, expires_ms: int = 0) -> Grant:
        return await self.inner.extend(task_id, reservation_id, tokens, cost_nusd, limits, now_ms, expires_ms)

    async def cancel(self, task_id: str, reservation_id: str, now_ms: int) -> bool:
        self.cancels += 1

        async def run() -> bool:
            if self.late_cancels:
                await asyncio.sleep(self.late_s * 1.5)
            return await self.inner.cancel(task_id, reservation_id, now_ms)

        return await asyncio.shield(asyncio.ensure_future(run()))

    async def settle(self, task_id: str, reservation: Reservation, actual: Actual, now_ms: int) -> Ledger | None:
        self.settles += 1
        if self.fail_settle:
            if not isinstance(self.fail_settle, bool):
                self.fail_settle -= 1
            raise ConnectionError("gone mid-call")
        if self.hang_settle:
            await asyncio.sleep(3600)
        return await self.inner.settle(task_id, reservation, actual, now_ms)

    async def get_task(self, task_id: str) -> Ledger | None:
        return await self.inner.get_task(task_id)

    async def end_task(self, task_id: str, idle_before_ms: int | None = None) -> Ledger | None:
        return await self.inner.end_task(task_id, idle_before_ms)

    async def idle_tasks(self, idle_before_ms: int) -> list[str]:
        return await self.inner.idle_tasks(idle_before_ms)

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


# --- admit, refuse, charge ------------------------------------------------------------------------

async def test_admits_within_the_limit_and_refuses_past_it_naming_the_limit() -> None:
    xs = Exchanges(budgets=budgets(max_steps=1))
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    first = xs()
    assert await stage.on_request(first) is None
    assert first.admission is not None and first.admission.admitted
    second = xs()
    with pytest.raises(BudgetExceeded) as refused:
        await stage.on_request(second)
    err = refused.value
    assert err.status == 402 and err.code == "budget_exceeded"
    assert "max_steps limit 1, used 1" in err.message and "'task-1'" in err.message
    assert second.admission is not None and not second.admission.admitted
    span = xs.finished(second)
    assert span.attributes[sc.BUDGET_EXCEEDED] is True
    assert span.attributes[sc.BUDGET_EXCEEDED_DIMENSION] == "max_steps"
    assert [e.attributes["dimension"] for e in span.events if e.name == sc.EVENT_EXCEEDED] == ["max_steps"]


async def test_another_task_is_not_refused_by_a_spent_one() -> None:
    xs = Exchanges(budgets=budgets(max_steps=1))
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    await stage.on_request(xs(task="a"))
    assert await stage.on_request(xs(task="b")) is None


async def test_a_proposed_local_answer_is_charged_as_a_call_not_a_step() -> None:
    xs = Exchanges(budgets=budgets(max_steps=1, max_calls=5))
    store = MemoryStore()
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs()
    ex.proposal = Reply(200, b"{}")
    assert await stage.on_request(ex) is None
    assert ex.proposal is not None  # charged, not vetoed
    assert ex.admission is not None and ex.admission.charge == Charge(calls=1, cache_hit=True)
    answer(ex, b"{}")
    await stage.on_end(ex)
    ledger = await store.get_task("task-1")
    assert ledger is not None
    assert (ledger.used("calls"), ledger.used("steps"), ledger.used("cache_hits")) == (1, 0, 1)
    assert ledger.used("context_tokens") == 0 and ledger.used("cost_nusd") == 0  # nothing upstream: no cost
    assert await stage.on_request(xs()) is None  # the step it did not take is still there


async def test_remaining_header_counts_this_calls_steps_but_not_its_reservation() -> None:
    xs = Exchanges(budgets=budgets(max_steps=3, max_completion_tokens=100))
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    ex = xs(body={**CHAT, "max_tokens": 30})
    await stage.on_request(ex)
    left = remaining(ex)
    assert left["max_steps"].value == 2
    # the call's 30 output tokens are reserved (admission counts them), but not spent: the header
    # shows settled use, so it does not rise when the reservation settles lower
    assert left["max_completion_tokens"].value == 100


async def test_remaining_header_on_a_refusal_says_nothing_is_left() -> None:
    xs = Exchanges(budgets=budgets(max_steps=1))
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    await stage.on_request(xs())
    ex = xs()
    with pytest.raises(BudgetExceeded):
        await stage.on_request(ex)
    assert remaining(ex)["max_steps"].value == 0


# --- the stream cut --------------------------------------------------------------------------------

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'


async def chunk(stage: BudgetStage, ex: Exchange, data: bytes) -> bytes | None:
    """One chunk as the forwarder hands it on: through `on_chunk`, then the gate it may set."""
    cut = stage.on_chunk(ex, data)
    if cut is None and ex.gate is not None:
        gate, ex.gate = ex.gate, None
        cut = await gate()
    return cut


async def test_stream_cut_finishes_the_event_the_client_is_in() -> None:
    xs = Exchanges(budgets=budgets(max_completion_tokens=2))
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    ex = xs(body={**CHAT, "stream": True, "max_tokens": 50})
    assert await stage.on_request(ex) is None
    ex.observation.output_tokens_seen = 1
    assert await chunk(stage, ex, EVENT + EVENT[:10]) is None  # this chunk ends mid-event
    ex.observation.output_tokens_seen = 3
    cut = await chunk(stage, ex, EVENT[10:] + EVENT)
    assert cut is not None and cut.startswith(EVENT[10:])  # the open event is completed first
    events = [e for e in cut[len(EVENT[10:]):].split(b"\n\n") if e]
    assert orjson.loads(events[0][6:])["choices"][0]["finish_reason"] == "length"
    assert events[1] == b"data: [DONE]"
    assert await chunk(stage, ex, EVENT) is None  # cut once


async def test_stream_cut_on_an_event_boundary_adds_only_the_end_and_is_on_the_span() -> None:
    xs = Exchanges(budgets=budgets(max_completion_tokens=2))
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    ex = xs(body={**CHAT, "stream": True, "max_tokens": 50})
    await stage.on_request(ex)
    ex.observation.output_tokens_seen = 2
    assert await chunk(stage, ex, EVENT) is None  # at the allowance: not past it
    ex.observation.output_tokens_seen = 3
    cut = await chunk(stage, ex, EVENT)
    assert cut is not None and cut.startswith(b"data: ") and cut.endswith(b"data: [DONE]\n\n")
    assert EVENT not in cut  # the chunk that crossed the limit is not sent
    span = xs.finished(ex)
    assert span.attributes[sc.BUDGET_STREAM_CUT] == "max_completion_tokens"
    cut_events = [e for e in span.events if e.name == sc.EVENT_EXCEEDED]
    assert [(e.attributes["stream_cut"], e.attributes["output_tokens_seen"]) for e in cut_events] == [(True, 3)]


async def test_a_stream_extends_its_own_reservation_and_holds_output_back_until_granted() -> None:
    xs = Exchanges(budgets=budgets(max_completion_tokens=600))
    store = MemoryStore()
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs(body={**CHAT, "stream": True, "max_tokens": 50})
    await stage.on_request(ex)
    ex.observation.output_tokens_seen = 60  # past the 50 tokens it holds
    assert stage.on_chunk(ex, EVENT) is None and ex.gate is not None  # held back: neither sent nor cut
    gate, ex.gate = ex.gate, None
    assert await gate() is None  # granted: now it may go
    ledger = await store.get_task("task-1")
    assert ledger is not None and ledger.used("completion_tokens") == 50 + 256 + 10  # a chunk beyond what it needs
    ex.observation.output_tokens_seen = 700  # more than the task has left: what is left, then nothing
    cut = await chunk(stage, ex, EVENT)
    assert cut is not None and cut.endswith(b"data: [DONE]\n\n")
    ledger = await store.get_task("task-1")
    assert ledger is not None and ledger.used("completion_tokens") == 600  # never past the limit
    assert ex.stream_state is not None and ex.stream_state.extensions == 2
    assert xs.finished(ex).attributes[sc.BUDGET_STREAM_CUT] == "max_completion_tokens"


async def test_shadow_mode_records_the_cut_and_never_cuts() -> None:
    xs = Exchanges(budgets={"mode": "shadow", **budgets(max_completion_tokens=2)})
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    ex = xs(body={**CHAT, "stream": True, "max_tokens": 50})
    await stage.on_request(ex)
    ex.observation.output_tokens_seen = 10
    assert await chunk(stage, ex, EVENT) is None  # shadow never holds a chunk back
    assert ex.stream_state is not None and ex.stream_state.extending is not None
    await asyncio.wait({ex.stream_state.extending})  # the task has nothing left to extend with
    assert await chunk(stage, ex, EVENT) is None
    assert xs.finished(ex).attributes[sc.BUDGET_WOULD_REJECT] == "max_completion_tokens"


# --- the settle ------------------------------------------------------------------------------------

async def test_settle_replaces_the_reservation_with_the_usage_the_upstream_reported() -> None:
    xs = Exchanges(budgets=budgets(max_completion_tokens=1000, max_context_tokens=10_000))
    store = MemoryStore()
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs(body={**CHAT, "max_tokens": 500})
    await stage.on_request(ex)
    reserved = await store.get_task("task-1")
    assert reserved is not None and reserved.used("completion_tokens") == 500
    answer(ex, {"model": "gpt-4o-mini", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                     "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
    await stage.on_end(ex)
    ledger = await store.get_task("task-1")
    assert ledger is not None
    assert (ledger.used("completion_tokens"), ledger.used("context_tokens"), ledger.used("inflight")) == (3, 12, 0)
    span = xs.finished(ex)
    assert span.attributes[sc.budget_used("max_completion_tokens")] == 3
    assert span.attributes[sc.budget_limit("max_completion_tokens")] == 1000
    # remaining would be limit - used (997): the span leaves it out (budget_span.py)
    assert sc.budget_remaining("max_completion_tokens") not in span.attributes
    assert span.attributes[sc.COST_USD] > 0  # gpt-4o-mini has a price


async def test_the_span_keeps_remaining_only_where_it_is_not_limit_minus_used() -> None:
    """The per-call prompt ceiling (every call may use all of it) and tokens held by a call in flight
    (remaining is the settled figure, as the header gives it) keep `remaining`; the rest leave it out."""
    xs = Exchanges(budgets=budgets(max_completion_tokens=1000, max_prompt_tokens=5000, max_steps=1))
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, MemoryStore()), hmac_key=None)
    in_flight = xs(body={**CHAT, "max_tokens": 600})
    assert await stage.on_request(in_flight) is None  # holds 600 completion tokens, not settled
    refused = xs(body={**CHAT, "max_tokens": 100})
    with pytest.raises(BudgetExceeded):  # max_steps
        await stage.on_request(refused)
    attrs = xs.finished(refused).attributes
    assert attrs[sc.budget_used("max_completion_tokens")] == 600  # the reservation in flight
    assert attrs[sc.budget_remaining("max_completion_tokens")] == 1000  # nothing settled yet
    assert attrs[sc.budget_used("max_steps")] == 1 and sc.budget_remaining("max_steps") not in attrs
    answer(in_flight, {"model": "gpt-4o-mini", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                                            "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})
    await stage.on_end(in_flight)
    settled = xs.finished(in_flight).attributes
    assert settled[sc.budget_used("max_prompt_tokens")] > 0 and settled[sc.budget_remaining("max_prompt_tokens")] == 5000
    assert settled[sc.budget_used("max_completion_tokens")] == 3
    assert sc.budget_remaining("max_completion_tokens") not in settled


async def test_an_error_answer_settles_to_nothing_produced() -> None:
    xs = Exchanges(budgets=budgets(max_completion_tokens=1000))
    store = MemoryStore()
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs(body={**CHAT, "max_tokens": 500})
    await stage.on_request(ex)
    answer(ex, {"error": {"message": "overloaded"}}, status=503)
    await stage.on_end(ex)
    ledger = await store.get_task("task-1")
    assert ledger is not None and ledger.used("completion_tokens") == 0 and ledger.used("steps") == 1


async def test_a_refused_call_is_not_settled() -> None:
    xs = Exchanges(budgets=budgets(max_steps=1))
    store = CountingStore(MemoryStore())
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    await stage.on_request(xs())
    ex = xs()
    with pytest.raises(BudgetExceeded):
        await stage.on_request(ex)
    await stage.on_end(ex)
    assert store.settles == 0


# --- store failures --------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["raise", "hang"])
async def test_open_a_failing_store_forwards_the_call_marked_degraded(fault: str) -> None:
    xs = Exchanges(budgets=budgets(max_steps=1), on_store_error="open", store_timeout_ms=50)
    store = CountingStore(MemoryStore(), **{"fail" if fault == "raise" else "hang": {"a"}})
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs(task="a1")
    assert await asyncio.wait_for(stage.on_request(ex), 5) is None
    assert ex.degraded is not None and ex.admission is None
    assert header(ex, REMAINING_HEADER) is None  # no budget applied: none claimed
    span = xs.finished(ex)
    assert span.attributes[sc.DEGRADED] is True
    degraded = [e.attributes for e in span.events if e.name == sc.EVENT_DEGRADED]
    assert len(degraded) == 1 and degraded[0]["on_store_error"] == "open"
    expected = "ConnectionError" if fault == "raise" else "TimeoutError"
    assert expected in str(degraded[0]["reason"])


@pytest.mark.parametrize("fault", ["raise", "hang"])
async def test_closed_a_failing_store_refuses_with_503(fault: str) -> None:
    xs = Exchanges(on_store_error="closed", store_timeout_ms=50, store="redis://user:secret@127.0.0.1:1/0")
    store = CountingStore(MemoryStore(), **{"fail" if fault == "raise" else "hang": {"a"}})
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    with pytest.raises(StoreUnavailable) as refused:
        await asyncio.wait_for(stage.on_request(xs(task="a1")), 5)
    assert refused.value.status == 503 and refused.value.code == "store_unavailable"
    assert "secret" not in refused.value.message and "secret" not in orjson.dumps(refused.value.details).decode()


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_a_hanging_store_never_hangs_the_call(mode: str) -> None:
    xs = Exchanges(on_store_error=mode, store_timeout_ms=50)
    store = CountingStore(MemoryStore(), hang={"a"})
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    for _ in range(2):
        ex = xs(task="a1")
        if mode == "open":
            assert await asyncio.wait_for(stage.on_request(ex), 5) is None
            assert ex.degraded is not None
        else:
            with pytest.raises(StoreUnavailable):
                await asyncio.wait_for(stage.on_request(ex), 5)
    assert store.reserves["a"] == 1  # the second call did not wait on the store again


async def test_the_breaker_skips_only_the_failed_domain_and_retries_it_later() -> None:
    xs = Exchanges(on_store_error="open", store_timeout_ms=50)
    clock = Clock()
    store = CountingStore(MemoryStore(), fail={"a"})
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store, clock), hmac_key=None, wall_ms=clock)
    await stage.on_request(xs(task="a1"))
    assert store.reserves == Counter({"a": 1})
    skipped = xs(task="a2")  # another task of the failed domain: not tried
    await stage.on_request(skipped)
    assert skipped.degraded is not None and "not retried yet" in skipped.degraded
    healthy = xs(task="b1")  # another domain: reserved as usual
    await stage.on_request(healthy)
    assert healthy.degraded is None and healthy.admission is not None and healthy.admission.admitted
    assert store.reserves == Counter({"a": 1, "b": 1})
    clock.ms += STORE_RETRY_MS
    store.fail.clear()
    back = xs(task="a2")
    await stage.on_request(back)
    assert back.degraded is None and store.reserves["a"] == 2


async def test_a_failed_settle_is_recorded_and_does_not_raise() -> None:
    xs = Exchanges()
    store = CountingStore(MemoryStore())
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs()
    await stage.on_request(ex)
    answer(ex, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    store.fail_settle = True
    await stage.on_end(ex)
    span = xs.finished(ex)
    assert span.attributes[sc.DEGRADED] is True
    assert [e.attributes["reason"] for e in span.events if e.name == sc.EVENT_DEGRADED] == \
        ["settle failed: ConnectionError"]


async def reserved_and_answered() -> tuple[Exchanges, CountingStore, BudgetStage, Exchange]:
    """A chat call that reserved 500 of its task's 1,000 completion tokens and was answered; its
    settle (`on_end`) is the test's to run."""
    xs = Exchanges(budgets=budgets(max_completion_tokens=1000))
    store = CountingStore(MemoryStore())
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs(body={**CHAT, "max_tokens": 500})
    await stage.on_request(ex)
    answer(ex, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    return xs, store, stage, ex


async def test_a_failed_settle_leaves_the_reservations_record_on_the_span_before_its_failure() -> None:
    """The settle writes the reservation's record with its own values in one write; when the store
    fails, the reserve-time values stand and the failure's event comes after the charge."""
    xs, store, stage, ex = await reserved_and_answered()
    store.fail_settle = True
    await stage.on_end(ex)
    span = xs.finished(ex)
    assert span.attributes[sc.budget_limit("max_completion_tokens")] == 1000
    assert span.attributes[sc.budget_used("max_completion_tokens")] == 500  # reserved, never settled
    assert sc.COST_USD not in span.attributes
    assert [e.name for e in span.events] == [sc.EVENT_CHARGE, sc.EVENT_DEGRADED]


async def test_a_settle_cancelled_while_the_store_answers_still_writes_the_reservations_record() -> None:
    xs, store, stage, ex = await reserved_and_answered()
    store.hang_settle = True
    ending = asyncio.ensure_future(stage.on_end(ex))
    while store.settles == 0:
        await asyncio.sleep(0)
    ending.cancel()
    with pytest.raises(asyncio.CancelledError):
        await ending
    span = xs.finished(ex)
    assert span.attributes[sc.budget_used("max_completion_tokens")] == 500
    assert [e.name for e in span.events] == [sc.EVENT_CHARGE]


@pytest.mark.parametrize("mode", ["open", "closed"])
@pytest.mark.parametrize("first", ["cancel", "reserve"])
async def test_a_reserve_that_lands_after_its_timeout_is_cancelled(mode: str, first: str) -> None:
    """A paused store works through its backlog: the reserve the call stopped waiting for still
    runs, before or after the cancel that follows it. The call was not admitted (503, or forwarded
    unbudgeted), so nothing stays charged or in flight."""
    xs = Exchanges(budgets=budgets(max_steps=100), on_store_error=mode, store_timeout_ms=50)
    inner = MemoryStore()
    store = CountingStore(inner, late={"a"}, late_s=0.2)
    store.late_cancels = first == "reserve"
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs(task="a1")
    if mode == "closed":
        with pytest.raises(StoreUnavailable):
            await stage.on_request(ex)
    else:
        assert await stage.on_request(ex) is None and ex.degraded is not None
    await asyncio.gather(*store.landed)
    # the store admitted it after the caller gave up, unless the cancel came first
    assert (await store.landed[0]).admitted == (first == "reserve")
    for _ in range(100):  # the cancel is retried in the background until the store takes it
        ledger = await inner.get_task("a1")
        if ledger is None or (ledger.used("steps"), ledger.used("inflight")) == (0, 0):
            break
        await asyncio.sleep(0.02)
    if first == "cancel":
        assert ledger is None  # the task never started
    else:
        assert ledger is not None and (ledger.used("steps"), ledger.used("calls"), ledger.used("inflight")) == (0, 0, 0)
    assert store.cancels >= 1


@pytest.mark.slow
async def test_a_failed_settle_is_retried_until_the_store_takes_it() -> None:
    xs = Exchanges()
    inner = MemoryStore()
    store = CountingStore(inner)
    stage = BudgetStage(xs.settings, breaker_for(xs.settings, store), hmac_key=None)
    ex = xs()
    await stage.on_request(ex)
    answer(ex, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    store.fail_settle = 2
    await stage.on_end(ex)
    for _ in range(100):
        ledger = await inner.get_task("task-1")
        if ledger is not None and ledger.used("inflight") == 0:
            break
        await asyncio.sleep(0.02)
    assert ledger is not None and ledger.used("inflight") == 0 and ledger.used("completion_tokens") == 1
    assert store.settles == 3
