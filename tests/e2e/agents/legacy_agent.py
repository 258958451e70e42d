"""A legacy RAG agent with no OpenTelemetry code: the openai SDK and requests, as users write them.

Run unchanged, plainly or under `opentelemetry-instrument`. Reads OPENAI_BASE_URL (the SDK does)
and DOCS_URL / TRUSTED_URL, and prints one JSON line per call: which call, and the task id
ragtoll answered in `x-ragtoll-task-id`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import openai
import requests

_lock = threading.Lock()
MESSAGES = [{"role": "user", "content": "What changed in the refund policy?"}]


def report(call: str, task_id: str | None) -> None:
    with _lock:  # whole lines, even from the pool threads
        sys.stdout.write(json.dumps({"call": call, "task": task_id}) + "\n")
        sys.stdout.flush()


def chat(client: openai.OpenAI, call: str) -> None:
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=MESSAGES)
    raw.parse()
    report(call, raw.headers.get("x-ragtoll-task-id"))


async def chat_async() -> None:
    client = openai.AsyncOpenAI()
    raw = await client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=MESSAGES)
    report("chat async", raw.headers.get("x-ragtoll-task-id"))
    await client.close()


def main() -> None:
    client = openai.OpenAI()
    chat(client, "chat")
    hits = requests.post(f"{os.environ['DOCS_URL']}/search", json={"query": "refund policy", "top_k": 2},
                         timeout=10)
    report("search", hits.headers.get("x-ragtoll-task-id"))
    with ThreadPoolExecutor(max_workers=2) as pool:  # contextvars do not follow into these threads
        list(pool.map(lambda i: chat(client, f"chat thread {i}"), range(2)))
    asyncio.run(chat_async())
    echo = requests.get(f"{os.environ['TRUSTED_URL']}/echo", timeout=10)
    report("echo", echo.headers.get("x-ragtoll-task-id"))


if __name__ == "__main__":
    main()
