"""The README's `agent.py`, for the docs test: an unchanged agent with no OpenTelemetry code.

It asks its LLM twice through OPENAI_BASE_URL, as the openai SDK would, with httpx (a dependency
of ragtoll, so present wherever the README's install lines ran), and prints the task id ragtoll
answered in `x-ragtoll-task-id`.
"""

from __future__ import annotations

import os

import httpx

base = os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1")
with httpx.Client(timeout=30) as client:
    for question in ("What changed in the refund policy?", "Since when does it apply?"):
        r = client.post(f"{base}/chat/completions", headers={"authorization": "Bearer sk-test"},
                        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]})
        r.raise_for_status()
        print(r.headers.get("x-ragtoll-task-id"))
