"""A small closed-loop load for the reliability tests: N tasks, each calling chat in a loop on its
own connection, while the test injects a fault on a schedule. Every answer is kept (status, task,
whether it carried a budget header, how long it took) for the assertions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
CHAT_PATH = "/openai/v1/chat/completions"
SEARCH_PATH = "/docs/search"  # a `json` retrieval route: the evidence cache serves its repeats


@dataclass(frozen=True)
class Answer:
    task: str
    status: int  # 0: the request itself failed (connection error)
    budgeted: bool  # carried x-ragtoll-budget-remaining: the store answered
    seconds: float
    code: str = ""


def run_load(base: str, tasks: list[str], seconds: float, schedule: list[tuple[float, Callable[[], None]]],
             search: bool = False) -> list[Answer]:
    """Call chat (and, with `search`, every other call a retrieval from 4 repeating queries) for
    every task in a loop for `seconds`; run each `(at_s, action)` in a thread at its time
    (actions block: killing and starting processes)."""
    answers: list[Answer] = []

    async def worker(task: str, deadline: float) -> None:
        async with httpx.AsyncClient(timeout=15) as http:
            i = 0
            while time.monotonic() < deadline:
                i += 1
                t0 = time.monotonic()
                path, doc = (SEARCH_PATH, {"query": f"refund window {i % 4}", "top_k": 3}) \
                    if search and i % 2 else (CHAT_PATH, CHAT)
                try:
                    r = await http.post(base + path, json=doc, headers={"x-ragtoll-task-id": task})
                except httpx.HTTPError:
                    answers.append(Answer(task, 0, False, time.monotonic() - t0))
                    continue
                code = ""
                if r.status_code >= 400 and r.headers.get("content-type") == "application/json":
                    code = str(r.json().get("error", {}).get("code", ""))
                answers.append(Answer(task, r.status_code, "x-ragtoll-budget-remaining" in r.headers,
                                      time.monotonic() - t0, code))
                await asyncio.sleep(0.005)

    def faults(start: float) -> None:
        for at, action in schedule:
            time.sleep(max(0.0, start + at - time.monotonic()))
            action()

    async def main() -> None:
        start = time.monotonic()
        thread = threading.Thread(target=faults, args=(start,), daemon=True)
        thread.start()
        await asyncio.gather(*[worker(t, start + seconds) for t in tasks])
        await asyncio.to_thread(thread.join, 30)

    asyncio.run(main())
    return answers
