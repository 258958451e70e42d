"""The evidence stage on exchanges without a server: `x-ragtoll-evidence` from what the budget
worked out (`ex.new_chunks`), and the context landfill counted across a task's calls."""

from __future__ import annotations

from typing import Any

import http_sfv
import pytest
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy.request.exchange import Exchange
from ragtoll.proxy.stages.evidence import EVIDENCE_HEADER, EvidenceStage
from support.exchanges import Exchanges, answer, results

PASSAGES = ["Refunds on annual plans are allowed within 30 days of purchase.",
            "Monthly plans renew automatically on the first day of the month.",
            "Enterprise contracts are refunded pro rata after the first quarter."]
ANSWER = {"results": [{"id": f"c{i}", "text": t, "score": round(0.9 - i / 10, 2)} for i, t in enumerate(PASSAGES)]}


def header(ex: Exchange) -> http_sfv.Dictionary | None:
    raw = next((v for k, v in ex.response_headers if k == EVIDENCE_HEADER), None)
    if raw is None:
        return None
    parsed = http_sfv.Dictionary()
    parsed.parse(raw)
    return parsed


def chat(*texts: str) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "max_tokens": 10,
            "messages": [{"role": "user", "content": "\n".join(texts)}]}


async def retrieve(stage: EvidenceStage, xs: Exchanges, task: str = "task-1", status: int = 200) -> None:
    ex = xs("docs", {"query": "refunds", "top_k": 3}, task=task)
    answer(ex, ANSWER, status=status)
    await stage.on_end(ex)


async def ask(stage: EvidenceStage, xs: Exchanges, *texts: str, task: str = "task-1") -> dict[str, Any]:
    ex = xs("openai", chat(*texts), task=task)
    answer(ex, {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 1}})
    await stage.on_end(ex)
    return dict(xs.finished(ex).attributes)


# --- x-ragtoll-evidence -------------------------------------------------------------------------------

async def test_header_describes_the_answer_with_the_budgets_new_chunk_count() -> None:
    xs = Exchanges()
    ex = xs("docs", {"query": "refunds", "top_k": 3})
    answer(ex, ANSWER)
    ex.new_chunks = 2
    await EvidenceStage().on_response(ex)
    parsed = header(ex)
    assert parsed is not None
    assert (parsed["n"].value, parsed["new"].value) == (3, 2)
    assert float(parsed["top"].value) == 0.9 and float(parsed["margin"].value) == 0.2


async def test_no_header_without_a_new_chunk_count_or_without_chunks() -> None:
    xs = Exchanges()
    unbudgeted = xs("docs", {"query": "refunds", "top_k": 3})
    answer(unbudgeted, ANSWER)
    await EvidenceStage().on_response(unbudgeted)  # no new-chunk count: the budget did not apply
    unparsed = xs("docs", {"query": "refunds", "top_k": 3})
    answer(unparsed, b"not json")
    unparsed.new_chunks = 0
    await EvidenceStage().on_response(unparsed)
    counted_later = xs("docs", {"query": "refunds", "top_k": 3})
    answer(counted_later, results(["a"]))
    counted_later.new_chunks = None
    await EvidenceStage().on_response(counted_later)
    assert [header(e) for e in (unbudgeted, unparsed, counted_later)] == [None, None, None]


# --- the context landfill -----------------------------------------------------------------------------

async def test_landfill_counts_evidence_and_what_an_earlier_prompt_already_sent() -> None:
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs)
    first = await ask(stage, xs, "Context:", f"[1] {PASSAGES[0]}", "When can I get a refund?")
    assert first[sc.EVIDENCE_PROMPT_TOKENS] > 0 and first[sc.EVIDENCE_DUPLICATE_TOKENS] == 0
    second = await ask(stage, xs, "Context:", f"[1] {PASSAGES[0]}", f"[2] {PASSAGES[1]}", "And monthly?")
    assert second[sc.EVIDENCE_DUPLICATE_TOKENS] == first[sc.EVIDENCE_PROMPT_TOKENS]  # passage 0, again
    assert second[sc.EVIDENCE_PROMPT_TOKENS] > first[sc.EVIDENCE_PROMPT_TOKENS]


async def test_a_prompt_with_no_retrieved_evidence_is_not_measured() -> None:
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs)
    attrs = await ask(stage, xs, "Write a haiku about autumn leaves falling on the river.")
    assert attrs[sc.EVIDENCE_PROMPT_TOKENS] == 0 and attrs[sc.EVIDENCE_DUPLICATE_TOKENS] == 0


async def test_evidence_is_per_task() -> None:
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs, task="a")
    attrs = await ask(stage, xs, PASSAGES[0], task="b")
    assert sc.EVIDENCE_PROMPT_TOKENS not in attrs  # task b retrieved nothing


@pytest.mark.parametrize("status", [206, 500])
async def test_only_a_200_retrieval_brings_evidence(status: int) -> None:
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs, status=status)
    assert sc.EVIDENCE_PROMPT_TOKENS not in await ask(stage, xs, PASSAGES[0])


async def test_on_task_end_drops_the_tasks_evidence() -> None:
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs, task="a")
    await retrieve(stage, xs, task="b")
    stage.on_task_end("a")
    assert sc.EVIDENCE_PROMPT_TOKENS not in await ask(stage, xs, PASSAGES[0], task="a")
    assert (await ask(stage, xs, PASSAGES[0], task="b"))[sc.EVIDENCE_PROMPT_TOKENS] > 0  # the other task keeps its own


async def test_evidence_held_across_tasks_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the process-wide bound the least recently used task's evidence goes first; the count
    follows what is held, fingerprints and grounding words (and drops when a task ends)."""
    from ragtoll.proxy.stages import evidence

    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs, task="a")
    one = stage._total  # what one task's retrieval holds
    assert one > len(PASSAGES)  # the passages' fingerprints and the chunks' content words
    monkeypatch.setattr(evidence, "MAX_TOTAL_FINGERPRINTS", one)
    await retrieve(stage, xs, task="b")
    assert stage._total <= one
    assert sc.EVIDENCE_PROMPT_TOKENS not in await ask(stage, xs, PASSAGES[0], task="a")  # a went first
    assert (await ask(stage, xs, PASSAGES[0], task="b"))[sc.EVIDENCE_PROMPT_TOKENS] > 0
    stage.on_task_end("b")
    assert stage._total == 0


# --- groundedness ---------------------------------------------------------------------------------

async def reply(stage: EvidenceStage, xs: Exchanges, message: dict[str, Any], task: str = "task-1") -> dict[str, Any]:
    ex = xs("openai", chat("Can I get a refund on an annual plan?"), task=task)
    answer(ex, {"choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 50, "completion_tokens": 20}})
    await stage.on_end(ex)
    return dict(xs.finished(ex).attributes)


async def test_an_answer_is_graded_against_the_tasks_evidence_and_the_record_gets_the_last_one() -> None:
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs)
    attrs = await reply(stage, xs, {"content": "The moon orbits Jupiter every Tuesday afternoon."})
    assert (attrs[sc.EVIDENCE_GROUNDEDNESS], attrs[sc.EVIDENCE_CLAIMS]) == (0.0, 1)
    attrs = await reply(stage, xs, {"content": "Annual plans are refundable within 30 days of purchase [c0]. "
                                               "Monthly plans renew on the first day of the month."})
    assert attrs[sc.EVIDENCE_GROUNDEDNESS] == 1.0
    assert (attrs[sc.EVIDENCE_CLAIMS_SUPPORTED], attrs[sc.EVIDENCE_CITATIONS_RETRIEVED]) == (2, 1)
    await ask(stage, xs, PASSAGES[0], PASSAGES[0])  # a later prompt resends the evidence
    record: dict[str, Any] = {"task_id": "task-1"}
    stage.annotate(record)
    assert record["groundedness"] == 1.0  # the last answer's
    ev = record["evidence"]
    assert (ev["claims"], ev["claims_supported"], ev["citations"], ev["chunks_indexed"]) == (2, 2, 1, 3)
    assert ev["resent_tokens"] > 0 and ev["prompt_tokens"] == 2 * ev["resent_tokens"]  # the second copy resent


async def test_a_tool_call_is_a_step_not_an_answer_and_a_task_without_evidence_has_no_grade() -> None:
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs)
    call = {"content": "Refunds on annual plans are allowed within 30 days of purchase.",
            "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "retrieve", "arguments": "{}"}}]}
    assert sc.EVIDENCE_GROUNDEDNESS not in await reply(stage, xs, call)
    record: dict[str, Any] = {"task_id": "task-1"}
    stage.annotate(record)
    assert record["groundedness"] is None and record["evidence"]["claims"] is None
    assert sc.EVIDENCE_CLAIMS not in await reply(stage, xs, {"content": "Refunds take 30 days."}, task="other")
    untouched: dict[str, Any] = {"task_id": "other"}
    stage.annotate(untouched)
    assert untouched == {"task_id": "other"}  # it retrieved nothing: no evidence, no grade


async def test_each_calls_counts_go_on_the_exchange_and_the_ledgers_sums_win_in_the_record() -> None:
    """Each LLM call's evidence and resent tokens go on the exchange (`tallies`, which the budget
    settles into the task's ledger). At the task's end the ledger's sums, which `task_record` put
    in the record (every replica's calls), win over this process's; the rest is this process's."""
    xs, stage = Exchanges(), EvidenceStage()
    await retrieve(stage, xs)
    calls = [xs("openai", chat(PASSAGES[0]), task="task-1") for _ in range(2)]
    for ex in calls:
        answer(ex, {"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 1}})
        await stage.on_end(ex)
    first, second = (ex.tallies for ex in calls)
    assert first.prompt_tokens == second.prompt_tokens == second.resent_tokens > 0 and first.resent_tokens == 0
    whole: dict[str, Any] = {"task_id": "task-1", "evidence": {"prompt_tokens": 1000, "resent_tokens": 400}}
    stage.annotate(whole)
    assert (whole["evidence"]["prompt_tokens"], whole["evidence"]["resent_tokens"]) == (1000, 400)
    assert whole["evidence"]["chunks_indexed"] == 3  # what only this replica holds
    own: dict[str, Any] = {"task_id": "task-1"}  # the ledger held none: this process's numbers
    stage.annotate(own)
    assert own["evidence"]["prompt_tokens"] == 2 * first.prompt_tokens
