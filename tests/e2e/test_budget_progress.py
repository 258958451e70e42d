"""Progress-aware stall limits end to end: a runaway that rewords one question gets back the same top
results with a different tail each time. "Any chunk new" called every such retrieval progress, so
`max_stalled_retrievals` never fired; the progress verdict (core/progress.py) stops it within the
limit, while a genuinely new hop of the same task stays fruitful."""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from conftest import ProxyFactory, Telemetry
from ragtoll.instrumentation import semconv as sc
from support.asgi import read_body, serve_lifespan
from support.servers import serve_in_thread

TOPICS = {"leave": ["leave-policy", "leave-forms", "leave-approval"],
          "expense": ["expense-limits", "expense-receipts", "expense-approver"],
          "travel": ["travel-booking", "travel-class", "travel-approval"]}


async def search_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Top 3: the topic's chunks, always the same; then 2 tail chunks that differ per wording."""
    if scope["type"] == "lifespan":
        return await serve_lifespan(receive, send)
    body = await read_body(receive)
    query = str(orjson.loads(body or b"{}").get("query", ""))
    topic = next((t for t in TOPICS if t in query.lower()), "leave")
    tail = [f"tail-{zlib.crc32(query.encode()):08x}-{i}" for i in range(2)]
    ids = TOPICS[topic] + tail
    results = [{"id": cid, "text": f"text of {cid.replace('-', ' ')}", "score": round(0.9 - 0.1 * i, 2)}
               for i, cid in enumerate(ids)]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": orjson.dumps({"results": results})})


@pytest.fixture(scope="module")
def search_url() -> Iterator[str]:
    with serve_in_thread(search_app) as url:
        yield url


REWORDINGS = ["what is the parental leave policy", "parental leave policy details",
              "explain the leave policy for parents", "leave policy for new parents please",
              "tell me the parental leave policy again", "what does the parental leave policy say"]


def run(base: str, queries: list[str]) -> list[int]:
    t = f"t-{uuid.uuid4().hex[:12]}"
    with httpx.Client(timeout=10) as http:
        return [http.post(f"{base}/docs/search", json={"query": q, "top_k": 5},
                          headers={"x-ragtoll-task-id": t}).status_code for q in queries]


def ups(url: str) -> list[dict[str, Any]]:
    return [{"name": "docs", "kind": "retrieval", "api": "json", "url": url, "prefix": "/docs"}]


def test_a_rewording_runaway_is_stopped_within_the_stall_limit(proxy: ProxyFactory, search_url: str,
                                                               telemetry: Telemetry) -> None:
    budgets = {"default_profile": "p", "profiles": {"p": {"max_stalled_retrievals": 2}}}
    with proxy(upstreams=ups(search_url), budgets=budgets, cache={"enabled": False}) as base:
        statuses = run(base, REWORDINGS)
    # the first finds the topic; two reworded repeats are fruitless; the fourth is refused
    assert statuses == [200, 200, 200, 429, 429, 429]
    deadline = time.monotonic() + 5
    verdicts: list[tuple[Any, Any]] = []
    while time.monotonic() < deadline and len(verdicts) < 3:
        spans = sorted((s for s in telemetry.spans() if sc.PROGRESS_PREFIX + "reason" in (s.attributes or {})),
                       key=lambda s: s.start_time)
        verdicts = [(s.attributes[sc.PROGRESS_PREFIX + "fruitful"], s.attributes[sc.PROGRESS_PREFIX + "reason"])
                    for s in spans]
        time.sleep(0.02)
    assert verdicts[-3:][0] == (True, "new_top_results")
    assert [fruitful for fruitful, _ in verdicts[-3:]] == [True, False, False]
    assert verdicts[-2][1] == "reworded_query_top_results_seen"  # shares most content words with the first


def test_a_new_hop_is_progress_and_resets_the_stall(proxy: ProxyFactory, search_url: str) -> None:
    budgets = {"default_profile": "p", "profiles": {"p": {"max_stalled_retrievals": 2, "max_fruitless_retrievals": 3}}}
    queries = [REWORDINGS[0], REWORDINGS[1], "who approves expense reports", REWORDINGS[2], "expense receipts rules",
               REWORDINGS[3]]
    with proxy(upstreams=ups(search_url), budgets=budgets, cache={"enabled": False}) as base:
        statuses = run(base, queries)
    # fruitful, fruitless, fruitful (new hop), fruitless, fruitless (stall 2), then the total refuses (3)
    assert statuses == [200, 200, 200, 200, 200, 429]


def escalating(small: dict[str, Any]) -> dict[str, Any]:
    return {"default_profile": "small", "profiles": {"small": {**small, "escalate_to": "large"},
                                                     "large": {"max_retrieval_calls": 6, "max_steps": 20}}}


def test_a_task_still_making_progress_climbs_to_the_larger_profile_once(proxy: ProxyFactory, search_url: str,
                                                                          telemetry: Telemetry) -> None:
    # each hop asks for what the previous one found (its words are the question's or its evidence's)
    hops = [REWORDINGS[0], "expense approval forms", "travel approval receipts"]
    with proxy(upstreams=ups(search_url), budgets=escalating({"max_retrieval_calls": 2}),
               cache={"enabled": False}) as base:
        statuses = run(base, hops + [f"{REWORDINGS[1]} {i}" for i in range(5)])
    # three hops, each new at the top and each evidence for the question: the third climbs to `large`
    # (6 retrievals) instead of a refusal; three fruitless rewordings follow, then large's own count
    # refuses (never a 2nd climb)
    assert statuses == [200, 200, 200, 200, 200, 200, 429, 429]
    deadline = time.monotonic() + 5
    notes: list[str] = []
    while time.monotonic() < deadline and not notes:
        notes = [n for s in telemetry.spans() for n in (s.attributes or {}).get(sc.BUDGET_NOTES, ())
                 if "escalated from 'small' to 'large'" in n]
        time.sleep(0.02)
    assert notes


def test_new_questions_are_not_progress_and_do_not_climb(proxy: ProxyFactory, search_url: str) -> None:
    """The same new top results, but each hop asks an unrelated question: novelty, not evidence for
    the task's question, so the task is refused where it is."""
    hops = [REWORDINGS[0], "who approves expense reports", "travel booking rules"]
    with proxy(upstreams=ups(search_url), budgets=escalating({"max_retrieval_calls": 2}),
               cache={"enabled": False}) as base:
        statuses = run(base, hops)
    assert statuses == [200, 200, 429]


def test_a_stuck_task_does_not_climb(proxy: ProxyFactory, search_url: str) -> None:
    with proxy(upstreams=ups(search_url), budgets=escalating({"max_retrieval_calls": 2}),
               cache={"enabled": False}) as base:
        statuses = run(base, REWORDINGS[:4])
    assert statuses == [200, 200, 429, 429]  # its second retrieval was fruitless: refused in `small`
