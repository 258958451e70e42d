"""A small closed-loop load for the fault tests: workers, each calling chat in a loop on its own
connection for one task, while the test injects a fault. Every answer is kept (status, task,
whether it carried a budget header, how long it took) for the assertions.

`run_load` runs for a fixed time with faults on a schedule; `background_load` runs in a thread
until the test is done with it (its faults are the test's own steps: a process killed, restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
CHAT_PATH = "/openai/v1/chat/completions"
SEARCH_PATH = "/docs/search"  # a `json` retrieval route: the evidence cache serves its repeats


def store_answered(headers: httpx.Headers) -> bool:
    """The call's budget was the store's: it carries the budget header, and was not decided on the
    replica's local ledger while the store was away (`x-ragtoll-budget-degraded: local`)."""
    return "x-ragtoll-budget-remaining" in headers and "x-ragtoll-budget-degraded" not in headers


@dataclass(frozen=True)
class Answer:
    task: str
    status: int  # 0: the request itself failed (connection error)
    budgeted: bool  # carried x-ragtoll-budget-remaining, not decided on the local ledger: the store answered
    seconds: float
    code: str = ""


async def _worker(base: str, task: str, going: Callable[[], bool], answers: list[Answer], search: bool) -> None:
    """Calls until `going()` is false; with `search`, every other call is a retrieval from 4
    repeating queries."""
    async with httpx.AsyncClient(timeout=15) as http:
        i = 0
        while going():
            i += 1
            t0 = time.monotonic()
            path, doc = (SEARCH_PATH, {"query": f"refund window {i % 4}", "top_k": 3}) \
                if search and i % 2 else (CHAT_PATH, CHAT)
            try:
                r = await http.post(base + path, json=doc, headers={"x-ragtoll-task-id": task})
            except httpx.HTTPError:
                answers.append(Answer(task, 0, False, time.monotonic() - t0))
                await asyncio.sleep(0.02)  # the proxy is gone (killed, restarting): do not spin
                continue
            code = ""
            if r.status_code >= 400 and r.headers.get("content-type") == "application/json":
                code = str(r.json().get("error", {}).get("code", ""))
            answers.append(Answer(task, r.status_code, store_answered(r.headers),
                                  time.monotonic() - t0, code))
            await asyncio.sleep(0.005)


def run_load(base: str, tasks: list[str], seconds: float, schedule: list[tuple[float, Callable[[], None]]],
             search: bool = False) -> list[Answer]:
    """One worker per task for `seconds`; run each `(at_s, action)` in a thread at its time
    (actions block: killing and starting processes)."""
    answers: list[Answer] = []

    def faults(start: float) -> None:
        for at, action in schedule:
            time.sleep(max(0.0, start + at - time.monotonic()))  # the fault's time is the scenario
            action()

    async def main() -> None:
        start = time.monotonic()
        thread = threading.Thread(target=faults, args=(start,), daemon=True)
        thread.start()
        deadline = start + seconds
        await asyncio.gather(*[_worker(base, t, lambda: time.monotonic() < deadline, answers, search)
                               for t in tasks])
        await asyncio.to_thread(thread.join, 30)

    asyncio.run(main())
    return answers


@contextlib.contextmanager
def background_load(base: str, tasks: list[str]) -> Iterator[list[Answer]]:
    """One worker per entry of `tasks` in a thread of its own; yields the answers as they come and
    stops (each worker finishing its call in flight) when the block ends."""
    answers: list[Answer] = []
    stop = threading.Event()

    async def main() -> None:
        await asyncio.gather(*[_worker(base, t, lambda: not stop.is_set(), answers, False) for t in tasks])

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    try:
        yield answers
    finally:
        stop.set()
        thread.join(30)
