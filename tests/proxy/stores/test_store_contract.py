"""The store contract, run unchanged against memory, a real Redis and a real 3-master Redis Cluster.

(Fixtures live here, not in a conftest.py: a second `conftest` module would shadow the top-level
one that other tests import from.)
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
from ragtoll.proxy.core import budget as bm
from ragtoll.proxy.core.budget import Actual, Charge
from ragtoll.proxy.core.hold import Grant
from ragtoll.proxy.core.tally import Tallies, ledger_context, ledger_evidence
from ragtoll.proxy.stores.base import SEEN_CHUNKS_CAP, Store, TaskMeta
from ragtoll.proxy.stores.memory import MemoryStore
from ragtoll.proxy.stores.redis import RedisStore

META = TaskMeta("bounded", "simple_fact", "openai")
LLM = Charge(steps=1, context_tokens=100, prompt_tokens=100, completion_reserve=50, cost_certain=1_000,
             cost_reserve=5_000)
T0 = 1_700_000_000_000
# The Cluster runs are slow as a group: the session's 3-master cluster takes 2 s to start, paid by
# whichever of them runs first (`-m "not slow"` keeps memory and one Redis server).
CLUSTER = pytest.param("cluster", marks=pytest.mark.slow)


@pytest.fixture(params=["memory", "redis", CLUSTER])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
        return
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "redis_cluster_url")
    s = RedisStore(url, timeout_s=2.0, ttl_s=3600)
    try:
        yield s
    finally:
        await s.aclose()


def tid() -> str:
    return f"task-{uuid.uuid4().hex}"


async def test_limit_of_n_admits_n_and_refusal_charges_nothing(store: Store) -> None:
    t = tid()
    limits = {"max_steps": 3}
    decisions = [await store.reserve(t, META, limits, LLM, T0 + i) for i in range(4)]
    assert [d.admitted for d in decisions] == [True, True, True, False]
    refused = decisions[3]
    assert refused.dimension == "max_steps"
    assert refused.ledger.used("steps") == 3 and refused.ledger.used("calls") == 3
    assert refused.ledger.rejections == {"max_steps": 1}
    assert refused.ledger.exhausted == "max_steps"
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("context_tokens") == 300 and ledger.profile == "bounded"
    assert ledger.cls == "simple_fact" and ledger.started_ms == T0


async def test_every_dimension_is_checked_in_the_same_step(store: Store) -> None:
    t = tid()
    limits = {"max_steps": 10, "max_calls": 2, "max_context_tokens": 1000}
    assert (await store.reserve(t, META, limits, LLM, T0)).admitted
    assert (await store.reserve(t, META, limits, Charge(retrieval_calls=1), T0)).admitted
    d = await store.reserve(t, META, limits, LLM, T0)
    assert (d.admitted, d.dimension) == (False, "max_calls")
    assert d.ledger.used("steps") == 1  # nothing of the refused call was added


async def test_unique_queries_dedup_per_task(store: Store) -> None:
    t = tid()
    limits = {"max_unique_queries": 2}

    def q(key: str) -> Charge:
        return Charge(retrieval_calls=1, query_key=key)

    results = [await store.reserve(t, META, limits, q(k), T0) for k in ("a", "b", "a", "c", "b")]
    assert [r.admitted for r in results] == [True, True, True, False, True]
    assert [r.reservation.new_query for r in results] == [True, True, False, False, False]
    assert results[-1].ledger.used("unique_queries") == 2 and results[-1].ledger.used("retrieval_calls") == 4
    other = await store.reserve(tid(), META, limits, q("c"), T0)  # another task has its own set
    assert other.admitted and other.reservation.new_query


async def test_settle_replaces_the_reservation_with_actual_use(store: Store) -> None:
    t = tid()
    limits = {"max_completion_tokens": 120, "max_cost_usd": 10**9}
    d = await store.reserve(t, META, limits, LLM, T0)
    assert d.ledger.used("completion_tokens") == 50 and d.ledger.used("cost_nusd") == 6_000
    after = await store.settle(t, d.reservation, Actual(context_tokens=90, completion_tokens=7, cost_nusd=1_500), T0 + 5)
    assert after is not None
    assert (after.used("context_tokens"), after.used("completion_tokens"), after.used("cost_nusd")) == (90, 7, 1_500)
    assert after.last_ms == T0 + 5 and after.used("inflight") == 0


async def test_cache_reads_and_writes_add_up_in_the_ledger_once_per_call(store: Store) -> None:
    """What the provider's prompt cache served and wrote, per call, kept with the task (so every
    replica's calls count and the record is whole); a settle retried after a lost reply adds nothing,
    and a chunk id list still lands after the two counts (settle.lua's arguments)."""
    t = tid()
    first = await store.reserve(t, META, {}, LLM, T0)
    second = await store.reserve(t, META, {}, LLM, T0 + 1)
    actual = Actual(context_tokens=2000, completion_tokens=10, cost_nusd=900, cached_input_tokens=1536,
                    cache_write_tokens=300)
    await store.settle(t, first.reservation, actual, T0 + 2)
    await store.settle(t, first.reservation, actual, T0 + 3)  # the retry
    await store.settle(t, second.reservation, Actual(context_tokens=2100, cached_input_tokens=1792), T0 + 4)
    search = await store.reserve(t, META, {}, Charge(retrieval_calls=1, query_key="q"), T0 + 5)
    after = await store.settle(t, search.reservation, Actual(chunk_ids=("c1", "c2")), T0 + 6)
    assert after is not None and after.chunks_seen == 2
    assert (after.used("context_tokens"), after.used("cached_input_tokens"), after.used("cache_write_tokens")) == (
        4100, 3328, 300)


async def test_context_economy_counts_add_up_in_the_ledger_once_per_call(store: Store) -> None:
    """A call's context-economy counts (core/tally.py) settle with it, so the record's `context`
    and `evidence` objects sum every replica's calls; a retried settle adds nothing, and a
    retrieval's counts and its chunk ids land together (settle.lua's ARGV 14, then the ids)."""
    t = tid()
    first = await store.reserve(t, META, {}, LLM, T0)
    second = await store.reserve(t, META, {}, LLM, T0 + 1)
    call = Tallies(cache_keys_set=1, chunks_referenced=2, evidence_chars_saved=900, prompt_tokens=120,
                   resent_tokens=80)
    actual = Actual(context_tokens=2000, cached_input_tokens=1536,
                    tallies=call.ledger_counts(llm_input_tokens=2000))
    await store.settle(t, first.reservation, actual, T0 + 2)
    await store.settle(t, first.reservation, actual, T0 + 3)  # the retry
    await store.settle(t, second.reservation, Actual(context_tokens=2100, tallies=Tallies(
        cache_keys_set=1, breakpoints_added=2, budget_notes=1).ledger_counts(llm_input_tokens=2100)), T0 + 4)
    search = await store.reserve(t, META, {}, Charge(retrieval_calls=1, query_key="q"), T0 + 5)
    after = await store.settle(t, search.reservation, Actual(chunk_ids=("c1", "c2", "c3"), tallies=Tallies(
        results_trimmed=4, searches_widened=1).ledger_counts()), T0 + 6)
    assert after is not None and after.chunks_seen == 3 and after.used("last_new") == 3
    ended = await store.end_task(t)
    assert ended is not None
    assert ledger_context(ended.counters) == {
        "llm_calls": 2, "input_tokens": 4100, "cached_input_tokens": 1536, "cache_write_tokens": 0,
        "cached_input_share": round(1536 / 4100, 4), "cache_keys_set": 2, "breakpoints_added": 2,
        "chunks_referenced": 2, "evidence_chars_saved": 900, "results_trimmed": 4, "searches_widened": 1,
        "budget_notes": 1}
    assert ledger_evidence(ended.counters) == {"prompt_tokens": 120, "resent_tokens": 80}


async def test_a_ledger_without_context_economy_counts_has_none(store: Store) -> None:
    """A task whose calls settled no such count (a store written before they were kept, or no LLM
    call and no rewrite) makes no `context` / `evidence` object: the ending replica's own stand."""
    t = tid()
    d = await store.reserve(t, META, {}, Charge(retrieval_calls=1, query_key="q"), T0)
    after = await store.settle(t, d.reservation, Actual(chunk_ids=("c1",)), T0 + 1)
    assert after is not None and ledger_context(after.counters) is None and ledger_evidence(after.counters) is None


async def test_held_counters_follow_what_reservations_in_flight_hold(store: Store) -> None:
    # x-ragtoll-budget-remaining shows settled use: the totals minus what reservations in flight
    # hold (budget.settled). Reserve and extend add to the held part; settle and cancel take it away.
    t = tid()
    limits = {"max_completion_tokens": 10_000, "max_cost_usd": 10**9}
    a = await store.reserve(t, META, limits, LLM, T0)
    b = await store.reserve(t, META, limits, LLM, T0)
    assert [b.ledger.used(held) for held in bm.HELD.values()] == [200, 100, 12_000]  # both, all in flight
    nothing = bm.settled(b.ledger)
    assert (nothing.used("context_tokens"), nothing.used("completion_tokens"), nothing.used("cost_nusd")) == (0, 0, 0)
    assert nothing.used("steps") == 2  # counts are not reservations
    await store.extend(t, b.reservation.id, 20, 2_000, limits, T0 + 1)
    after_a = await store.settle(t, a.reservation, Actual(context_tokens=90, completion_tokens=7, cost_nusd=1_500), T0 + 2)
    assert after_a is not None
    done = bm.settled(after_a)
    assert (done.used("context_tokens"), done.used("completion_tokens"), done.used("cost_nusd")) == (90, 7, 1_500)
    assert await store.cancel(t, b.reservation.id, T0 + 3)
    ledger = await store.get_task(t)
    assert ledger is not None
    assert [ledger.used(held) for held in bm.HELD.values()] == [0, 0, 0]
    assert bm.settled(ledger).used("cost_nusd") == ledger.used("cost_nusd") == 1_500


async def test_completion_and_cost_admit_until_used_up(store: Store) -> None:
    t = tid()
    limits = {"max_completion_tokens": 100}
    d = await store.reserve(t, META, limits, LLM, T0)
    await store.settle(t, d.reservation, Actual(completion_tokens=100), T0)
    d = await store.reserve(t, META, limits, LLM, T0)
    assert (d.admitted, d.dimension) == (False, "max_completion_tokens")
    t2 = tid()
    cost = {"max_cost_usd": round(0.002 * bm.NANO)}
    per_call = Charge(retrieval_calls=1, cost_certain=500_000)
    admitted = [(await store.reserve(t2, META, cost, per_call, T0)).admitted for _ in range(5)]
    assert admitted == [True, True, True, True, False]


async def test_deadline_runs_from_the_first_call(store: Store) -> None:
    t = tid()
    limits = {"max_latency_ms": 1000}
    assert (await store.reserve(t, META, limits, LLM, T0)).admitted
    assert (await store.reserve(t, META, limits, LLM, T0 + 999)).admitted
    d = await store.reserve(t, META, limits, Charge(calls=1, cache_hit=True), T0 + 1000)
    assert (d.admitted, d.dimension) == (False, "max_latency_ms")


async def test_stalled_retrievals_count_consecutive_calls_without_new_chunks(store: Store) -> None:
    t = tid()
    limits = {"max_stalled_retrievals": 2}
    r = Charge(retrieval_calls=1)

    async def retrieve(chunks: tuple[str, ...]) -> int:
        d = await store.reserve(t, META, limits, r, T0)
        assert d.admitted
        after = await store.settle(t, d.reservation, Actual(chunk_ids=chunks), T0)
        assert after is not None
        return after.used("stalled")

    assert await retrieve(("a", "b")) == 0
    assert await retrieve(("b", "a")) == 1
    assert await retrieve(()) == 2
    d = await store.reserve(t, META, limits, r, T0)
    assert (d.admitted, d.dimension) == (False, "max_stalled_retrievals")
    assert (await store.reserve(t, META, limits, LLM, T0)).admitted  # the agent may still answer
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.chunks_seen == 2


async def test_a_progress_verdict_decides_the_stall_and_counts_fruitless_retrievals(store: Store) -> None:
    """With a verdict (Actual.fruitful) new tail chunks no longer reset the stall: a reworded query
    that brings back a different tail is fruitless; the total refuses at max_fruitless_retrievals."""
    t = tid()
    limits = {"max_stalled_retrievals": 5, "max_fruitless_retrievals": 3}
    r = Charge(retrieval_calls=1)
    steps = ((("a", "b"), True, 0, 0), (("a", "c"), False, 1, 1), (("a", "d"), False, 2, 2),
             (("e", "a"), True, 0, 2), (("e", "f"), False, 1, 3))
    for chunks, fruitful, stalled, fruitless in steps:
        d = await store.reserve(t, META, limits, r, T0)
        assert d.admitted
        after = await store.settle(t, d.reservation, Actual(chunk_ids=chunks, fruitful=fruitful), T0)
        assert after is not None
        assert (after.used("stalled"), after.used("fruitless")) == (stalled, fruitless)
    d = await store.reserve(t, META, limits, r, T0)
    assert (d.admitted, d.dimension) == (False, "max_fruitless_retrievals")
    assert (await store.reserve(t, META, limits, LLM, T0)).admitted  # the agent may still answer


async def test_escalate_moves_a_task_once_and_undoes_the_refusal_that_asked(store: Store) -> None:
    t = tid()
    limits = {"max_retrieval_calls": 1}
    r = Charge(retrieval_calls=1)
    d = await store.reserve(t, META, limits, r, T0)
    await store.settle(t, d.reservation, Actual(chunk_ids=("a",), fruitful=True, evidence=True), T0)
    refused = await store.reserve(t, META, limits, r, T0)
    assert (refused.admitted, refused.ledger.exhausted) == (False, "max_retrieval_calls")
    assert not await store.escalate(t, "other", "large", "max_retrieval_calls")  # not its profile
    assert await store.escalate(t, META.profile, "large", "max_retrieval_calls")
    ledger = await store.get_task(t)
    assert ledger is not None and (ledger.profile, ledger.exhausted, ledger.rejections) == ("large", None, {})
    assert not await store.escalate(t, "large", "larger", "max_retrieval_calls")  # one climb per task
    large = TaskMeta("large")
    assert (await store.reserve(t, large, {"max_retrieval_calls": 3}, r, T0)).admitted
    assert not await store.escalate(tid(), META.profile, "large", "max_steps")  # no such task


async def test_only_evidence_for_the_question_lets_a_task_climb(store: Store) -> None:
    """Novelty is not progress: a task whose last retrieval was fruitful but not for its question
    (an agent asking a new question each time) stays where it is; one whose last was climbs."""
    limits = {"max_retrieval_calls": 2}
    r = Charge(retrieval_calls=1)
    novel, fruitless_last = tid(), tid()
    for i in range(2):
        d = await store.reserve(novel, META, limits, r, T0)
        await store.settle(novel, d.reservation, Actual(chunk_ids=(f"n{i}",), fruitful=True), T0)
    assert not (await store.reserve(novel, META, limits, r, T0)).admitted
    assert not await store.escalate(novel, META.profile, "large", "max_retrieval_calls")
    for i, (fruitful, evidence) in enumerate(((True, True), (False, False))):
        d = await store.reserve(fruitless_last, META, limits, r, T0)
        await store.settle(fruitless_last, d.reservation,
                           Actual(chunk_ids=(f"f{i}",), fruitful=fruitful, evidence=evidence), T0)
    assert not (await store.reserve(fruitless_last, META, limits, r, T0)).admitted
    assert not await store.escalate(fruitless_last, META.profile, "large", "max_retrieval_calls")
    ledger = await store.get_task(fruitless_last)
    assert ledger is not None and (ledger.used("evidence"), ledger.used("last_evidence")) == (1, 0)


async def test_an_llm_call_is_reserved_what_its_task_has_left_and_never_more(store: Store) -> None:
    """Worst-case admission: a call asking for more output than the task has left under its
    completion-token or cost limit is reserved what is left (whole tokens per answer); one that
    cannot get an output token per answer is refused."""
    t = tid()
    limits = {"max_completion_tokens": 120}
    big = Charge(steps=1, completion_reserve=100_000, cost_reserve=0, choices=4)
    d = await store.reserve(t, META, limits, big, T0)
    assert d.admitted and d.reservation.completion_tokens == 120  # 30 per answer
    d2 = await store.reserve(t, META, limits, Charge(steps=1, completion_reserve=50), T0)
    assert (d2.admitted, d2.dimension) == (False, "max_completion_tokens")
    await store.settle(t, d.reservation, Actual(completion_tokens=117), T0)
    odd = await store.reserve(t, META, limits, big, T0)  # 3 left: not one token for each of 4 answers
    assert (odd.admitted, odd.dimension) == (False, "max_completion_tokens")
    one = await store.reserve(t, META, limits, Charge(steps=1, completion_reserve=50), T0)
    assert one.admitted and one.reservation.completion_tokens == 3
    c = tid()
    cost = {"max_cost_usd": 1_000_000}  # 0.001 USD
    priced = Charge(steps=1, completion_reserve=10_000, cost_certain=100_000, cost_reserve=10_000_000, choices=2)
    d = await store.reserve(c, META, cost, priced, T0)  # 900_000 left at 1_000 per token: 900 tokens
    assert d.admitted and (d.reservation.completion_tokens, d.reservation.cost_nusd) == (900, 1_000_000)
    assert not (await store.reserve(c, META, cost, priced, T0)).admitted
    ledger = await store.get_task(c)
    assert ledger is not None and ledger.used("cost_nusd") == 1_000_000
    # a cancel undoes what was granted, not what was asked
    assert await store.cancel(c, d.reservation.id, T0)
    ledger = await store.get_task(c)
    assert ledger is not None and (ledger.used("cost_nusd"), ledger.used("completion_tokens")) == (0, 0)


async def test_concurrent_llm_calls_are_never_reserved_past_the_limit(store: Store) -> None:
    t = tid()
    limits = {"max_cost_usd": 5_000_000}
    ask = Charge(steps=1, completion_reserve=4_000, cost_certain=10_000, cost_reserve=4_000_000)
    decisions = await asyncio.gather(*[store.reserve(t, META, limits, ask, T0) for _ in range(16)])
    admitted = [d for d in decisions if d.admitted]
    assert sum(d.reservation.cost_nusd for d in admitted) <= 5_000_000
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("cost_nusd") <= 5_000_000


async def test_new_chunk_resets_the_stall(store: Store) -> None:
    t = tid()
    r = Charge(retrieval_calls=1)
    for chunks, expected in ((("a",), 0), (("a",), 1), (("a", "z"), 0)):
        d = await store.reserve(t, META, {}, r, T0)
        after = await store.settle(t, d.reservation, Actual(chunk_ids=chunks), T0)
        assert after is not None and after.used("stalled") == expected


async def test_a_retrieval_is_admitted_with_the_chunks_its_task_has_seen(store: Store) -> None:
    t = tid()
    r = Charge(retrieval_calls=1)
    first = await store.reserve(t, META, {}, r, T0)
    assert first.seen_chunks == frozenset()  # a new task has seen nothing
    await store.settle(t, first.reservation, Actual(chunk_ids=("a", "b", "é")), T0)
    second = await store.reserve(t, META, {}, r, T0)
    assert second.seen_chunks == {"a", "b", "é"}
    assert (await store.reserve(t, META, {}, LLM, T0)).seen_chunks is None  # not a retrieval
    assert (await store.reserve(t, META, {}, Charge(calls=1, cache_hit=True), T0)).seen_chunks is None
    many = tuple(f"c{i}" for i in range(SEEN_CHUNKS_CAP + 1))
    await store.settle(t, second.reservation, Actual(chunk_ids=many), T0)
    third = await store.reserve(t, META, {}, r, T0)
    assert third.admitted and third.seen_chunks is None  # past the cap: the settle counts novelty
    assert third.ledger.chunks_seen == SEEN_CHUNKS_CAP + 4


async def test_shadow_admits_and_records_what_it_would_refuse(store: Store) -> None:
    t = tid()
    limits = {"max_steps": 1}
    ds = [await store.reserve(t, META, limits, LLM, T0, shadow=True) for _ in range(3)]
    assert all(d.admitted for d in ds)
    assert [d.dimension for d in ds] == [None, "max_steps", "max_steps"]
    assert ds[-1].ledger.shadow_rejections == {"max_steps": 2}
    assert ds[-1].ledger.rejections == {} and ds[-1].ledger.exhausted is None
    assert ds[-1].ledger.used("steps") == 3


async def test_a_task_keeps_the_profile_of_its_first_call(store: Store) -> None:
    t = tid()
    assert (await store.reserve(t, META, {}, LLM, T0)).admitted
    d = await store.reserve(t, TaskMeta("wide"), {}, LLM, T0)
    assert d.profile_conflict == "bounded" and not d.admitted
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("steps") == 1


async def test_cache_hit_counts_a_call_and_a_hit_only(store: Store) -> None:
    t = tid()
    d = await store.reserve(t, META, {"max_retrieval_calls": 0}, Charge(calls=1, cache_hit=True), T0)
    assert d.admitted
    assert d.ledger.used("calls") == 1 and d.ledger.used("cache_hits") == 1 and d.ledger.used("retrieval_calls") == 0


async def test_end_task_returns_the_ledger_exactly_once(store: Store) -> None:
    t = tid()
    await store.reserve(t, META, {}, LLM, T0)
    results = await asyncio.gather(*[store.end_task(t) for _ in range(5)])
    ended = [r for r in results if r is not None]
    assert len(ended) == 1 and ended[0].used("steps") == 1 and ended[0].task_id == t
    assert await store.get_task(t) is None
    assert await store.settle(t, ended[0] and bm.Reservation(), Actual(), T0) is None
    # the next call of that id starts a fresh task
    d = await store.reserve(t, META, {"max_steps": 1}, LLM, T0 + 10)
    assert d.admitted and d.ledger.used("steps") == 1 and d.ledger.started_ms == T0 + 10


async def test_idle_end_spares_active_and_in_flight_tasks(store: Store) -> None:
    idle, busy, streaming = tid(), tid(), tid()
    for t in (idle, busy, streaming):
        d = await store.reserve(t, META, {}, LLM, T0)
        if t != streaming:
            await store.settle(t, d.reservation, Actual(), T0)
    await store.reserve(busy, META, {}, LLM, T0 + 5_000)
    cutoff = T0 + 1_000
    listed = await store.idle_tasks(cutoff)
    assert idle in listed and busy not in listed
    assert await store.end_task(busy, idle_before_ms=cutoff) is None
    assert await store.end_task(streaming, idle_before_ms=cutoff) is None  # a call is still in flight
    ended = await store.end_task(idle, idle_before_ms=cutoff)
    assert ended is not None and ended.task_id == idle
    assert await store.get_task(busy) is not None and await store.get_task(streaming) is not None


async def test_concurrent_reserves_never_overshoot_a_count(store: Store) -> None:
    t = tid()
    limits = {"max_steps": 50, "max_unique_queries": 7}
    decisions = await asyncio.gather(*[store.reserve(t, META, limits, LLM, T0) for _ in range(200)])
    assert sum(d.admitted for d in decisions) == 50
    queries = await asyncio.gather(*[
        store.reserve(t, META, limits, Charge(retrieval_calls=1, query_key=f"q{i % 20}"), T0) for i in range(100)])
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("unique_queries") == 7
    assert sum(1 for d in queries if d.reservation.new_query) == 7


async def test_odd_task_ids_stay_apart(store: Store) -> None:
    ids = ["a}b", "a{b", "x\nfoo", "ünïcødé", "*", "ragtoll:{t:x}:h", "a" * 128]
    for i, t in enumerate(ids):
        await store.reserve(t, META, {}, Charge(calls=1 + i), T0)
    for i, t in enumerate(ids):
        ledger = await store.get_task(t)
        assert ledger is not None and ledger.task_id == t and ledger.used("calls") == 1 + i
        await store.end_task(t)


async def test_ping(store: Store) -> None:
    await store.ping()


# --- reservations: extend, settle by id, cancel, expiry ----------------------------------------------

async def test_extend_grants_what_the_task_has_left_and_never_more(store: Store) -> None:
    t = tid()
    limits = {"max_completion_tokens": 300}
    d = await store.reserve(t, META, limits, LLM, T0)  # holds 50 output tokens
    assert d.reservation.id and d.reservation.expires_ms > T0
    assert await store.extend(t, d.reservation.id, 100, 1_000, limits, T0 + 1) == Grant(100, 1_000)
    assert await store.extend(t, d.reservation.id, 200, 2_000, limits, T0 + 2) == Grant(150, 1_500)  # what is left
    assert await store.extend(t, d.reservation.id, 10, 100, limits, T0 + 3) == Grant()
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("completion_tokens") == 300
    # settle replaces the reservation as the store holds it (50 + 100 + 150), whatever the caller saw
    after = await store.settle(t, d.reservation, Actual(context_tokens=100, completion_tokens=280, cost_nusd=9_000),
                               T0 + 4)
    assert after is not None and after.used("completion_tokens") == 280 and after.used("cost_nusd") == 9_000
    assert after.used("inflight") == 0
    t2 = tid()
    cost = {"max_cost_usd": 10_000}
    d = await store.reserve(t2, META, cost, LLM, T0)  # 1_000 certain + 5_000 reserved for output
    assert await store.extend(t2, d.reservation.id, 100, 2_000, cost, T0) == Grant(100, 2_000)
    assert await store.extend(t2, d.reservation.id, 300, 6_000, cost, T0) == Grant(100, 2_000)
    assert await store.extend(t2, d.reservation.id, 1, 20, cost, T0) == Grant()
    ledger = await store.get_task(t2)
    assert ledger is not None and ledger.used("cost_nusd") == 10_000 and ledger.used("completion_tokens") == 250


async def test_extend_of_a_reservation_no_longer_in_flight_grants_nothing(store: Store) -> None:
    t = tid()
    d = await store.reserve(t, META, {}, LLM, T0)
    await store.settle(t, d.reservation, Actual(completion_tokens=5), T0)
    assert await store.extend(t, d.reservation.id, 100, 1_000, {}, T0) == Grant()
    assert await store.extend(t, "no-such-reservation", 100, 1_000, {}, T0) == Grant()
    assert await store.extend(tid(), "no-such-task", 100, 1_000, {}, T0) == Grant()
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("completion_tokens") == 5


async def test_concurrent_extensions_never_pass_the_limit(store: Store) -> None:
    t = tid()
    limits = {"max_completion_tokens": 2_000, "max_cost_usd": 10**12}
    held = [(await store.reserve(t, META, limits, LLM, T0)).reservation for _ in range(10)]  # 500 held
    grants = await asyncio.gather(*[store.extend(t, held[i % 10].id, 64, 640, limits, T0) for i in range(200)])
    assert sum(g.tokens for g in grants) == 1_500
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("completion_tokens") == 2_000


async def test_settling_twice_changes_nothing(store: Store) -> None:
    t = tid()
    d = await store.reserve(t, META, {}, Charge(retrieval_calls=1, query_key="q"), T0)
    first = await store.settle(t, d.reservation, Actual(chunk_ids=("a",)), T0)
    again = await store.settle(t, d.reservation, Actual(chunk_ids=("a",)), T0 + 1)  # a retry after a lost reply
    assert first is not None and again is not None
    assert again.counters == first.counters and again.used("inflight") == 0 and again.used("stalled") == 0


async def test_cancel_undoes_a_reservation_and_makes_a_late_reserve_charge_nothing(store: Store) -> None:
    t = tid()
    await store.reserve(t, META, {}, LLM, T0)
    query = Charge(retrieval_calls=1, query_key="refunds", cost_certain=700)
    d = await store.reserve(t, META, {}, query, T0, reservation_id="r-lost")
    assert d.admitted and d.reservation.id == "r-lost" and d.reservation.new_query
    assert await store.cancel(t, "r-lost", T0 + 1)
    assert not await store.cancel(t, "r-lost", T0 + 2)  # idempotent
    ledger = await store.get_task(t)
    assert ledger is not None
    assert (ledger.used("calls"), ledger.used("retrieval_calls"), ledger.used("unique_queries")) == (1, 0, 0)
    assert ledger.used("cost_nusd") == LLM.cost and ledger.used("inflight") == 1
    again = await store.reserve(t, META, {}, query, T0 + 3)
    assert again.reservation.new_query  # the cancelled call's query was never the task's
    # the cancel overtakes its reserve (another connection): the reserve, when it comes, charges nothing
    assert not await store.cancel(t, "r-late", T0 + 4)
    late = await store.reserve(t, META, {}, LLM, T0 + 5, reservation_id="r-late")
    assert not late.admitted and late.dimension is None
    ledger = await store.get_task(t)
    assert ledger is not None and ledger.used("steps") == 1 and ledger.used("inflight") == 2
    t2 = tid()  # a task whose only call was cancelled first never starts
    await store.cancel(t2, "r-first", T0)
    assert not (await store.reserve(t2, META, {}, LLM, T0, reservation_id="r-first")).admitted
    assert await store.get_task(t2) is None


async def test_the_idle_sweep_ends_a_task_whose_reservations_expired(store: Store) -> None:
    lost, live = tid(), tid()
    await store.reserve(lost, META, {}, LLM, T0, expires_ms=T0 + 500)  # its replica died mid-call
    await store.reserve(live, META, {}, LLM, T0, expires_ms=T0 + 60_000)
    cutoff = T0 + 1_000
    assert await store.end_task(live, idle_before_ms=cutoff) is None
    ended = await store.end_task(lost, idle_before_ms=cutoff)
    assert ended is not None and ended.used("steps") == 1  # its charge stays: the call may have run


@pytest.mark.parametrize("kind", ["redis", CLUSTER])
async def test_a_sweep_appends_each_record_to_the_stream_once(kind: str, request: pytest.FixtureRequest) -> None:
    """A sweep's records reach the stream, each once, on one server and on a Cluster (the sink
    pipelines the batch; a Cluster pipeline must route it to the stream's node)."""
    from ragtoll.proxy.tasks.records import TaskEnder, open_sink

    url = request.getfixturevalue("redis_url" if kind == "redis" else "redis_cluster_url")
    stream = f"ragtoll:test-records:{uuid.uuid4().hex}"
    s = RedisStore(url, timeout_s=2.0, ttl_s=3600, records_stream=stream)
    try:
        ender = TaskEnder(s, open_sink(s, "unused.jsonl"), idle_timeout_s=1.0, wall_ms=lambda: T0 + 60_000)
        ids = [tid() for _ in range(40)]
        for i, t in enumerate(ids):
            d = await s.reserve(t, META, {}, LLM, T0 + i)
            await s.settle(t, d.reservation, Actual(), T0 + i)
        assert await ender.sweep() == 40
        entries = await s.client.xrange(stream)
        assert sorted(orjson.loads(e[1][b"record"])["task_id"] for e in entries) == sorted(ids)
        assert await ender.sweep() == 0 and len(await s.client.xrange(stream)) == 40
    finally:
        await s.client.delete(stream)
        await s.aclose()
