"""A small sequential RAG loop with no OpenTelemetry code (the docs' trace picture is drawn from
its run): retrieve, answer, retrieve again, answer again. Reads OPENAI_BASE_URL and DOCS_URL."""

from __future__ import annotations

import os

import openai
import requests


def main() -> None:
    client = openai.OpenAI()
    question = "What changed in the refund policy?"
    for query in ("refund policy changes", "refund policy 2024 exceptions"):
        hits = requests.post(f"{os.environ['DOCS_URL']}/search", json={"query": query, "top_k": 3},
                             timeout=10)
        context = "\n".join(r["text"] for r in hits.json()["results"])
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "system", "content": context}, {"role": "user", "content": question}],
        )


if __name__ == "__main__":
    main()
