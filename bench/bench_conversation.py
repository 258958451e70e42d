"""Conversation identity's cost per call (issue 31): the fingerprint of an untracked LLM call and
the match of a search against the pending tool calls, beside what every LLM call already pays (the
adapter's parse and prompt count) and the floor (orjson reading the body), in the same run.

    python bench/bench_conversation.py [--quick]

Target: the fingerprint well under 0.1 ms per call on a 4 KB prompt with tools. The store round
trips (one before an untracked call, one to three after an answer) are the budget store's kind
and are measured by bench_budgets.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit

import orjson
from ragtoll.proxy.adapters.openai import OpenAIAdapter
from ragtoll.proxy.config import UpstreamConfig
from ragtoll.proxy.core import conversation as cv

UPSTREAM = UpstreamConfig(name="openai", kind="llm", url="http://127.0.0.1:1", api="openai")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} the handbook corpus by query",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
            },
        },
    }
    for name in ("retrieve", "rerank", "lookup")
]


def body(target: int = 4096) -> bytes:
    """A chat request of an agent loop a few turns in: system, question, tool calls and results."""
    messages = [
        {"role": "system", "content": "You answer questions about the handbook. " * 6},
        {"role": "user", "content": "What is the refund window for orders shipped abroad?"},
    ]
    i = 0
    while len(orjson.dumps({"model": "gpt-4o", "messages": messages, "tools": TOOLS})) < target:
        call_id = f"call_{i:04d}abcdef"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": "retrieve",
                            "arguments": orjson.dumps({"query": f"refund abroad {i}"}).decode(),
                        },
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": f"chunk {i}: refunds for orders shipped abroad take 30 days. " * 3,
            }
        )
        i += 1
    return orjson.dumps({"model": "gpt-4o", "messages": messages, "tools": TOOLS})


def per_call_us(fn: object, number: int, repeat: int) -> float:
    times = timeit.repeat(fn, number=number, repeat=repeat)  # type: ignore[arg-type]
    return statistics.median(times) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_conversation", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    number, repeat = (200, 3) if args.quick else (2000, 7)
    adapter = OpenAIAdapter(UPSTREAM)
    raw = body()
    pending = [
        cv.Pending(
            f"conv-{n}",
            tuple(cv.argument_texts(orjson.dumps({"query": f"q {n} refund abroad", "top_k": 5}).decode())),
            f"k{n}",
        )
        for n in range(64)
    ]
    rows = {
        "orjson.loads (floor)": per_call_us(lambda: orjson.loads(raw), number, repeat),
        "adapter parse + prompt count (every LLM call)": per_call_us(
            lambda: adapter.parse_request("POST", "/v1/chat/completions", {}, raw), number, repeat
        ),
        "conversation fingerprint (thread_of)": per_call_us(
            lambda: cv.thread_of("chat", raw, "caller"), number, repeat
        ),
        "search match, 64 pending conversations": per_call_us(
            lambda: cv.match_pending("q 0 refund abroad", pending, ()), number, repeat
        ),
    }
    sys.stdout.write(
        f"request body: {len(raw)} bytes, {len(orjson.loads(raw)['messages'])} messages, {len(TOOLS)} tools\n"
    )
    for name, us in rows.items():
        sys.stdout.write(f"{name:48s} {us:8.1f} us/call\n")
    fp = rows["conversation fingerprint (thread_of)"]
    sys.stdout.write(f"target: fingerprint < 100 us: {'pass' if fp < 100 else 'FAIL'}\n")
    return 0 if fp < 100 else 1


if __name__ == "__main__":
    sys.exit(main())
