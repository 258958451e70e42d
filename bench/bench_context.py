"""What the context rewrites cost per call on a ~4 KB body (proxy/core/context.py), next to
reading the same body once with orjson in the same run (the floor any body rewrite pays).

    python bench/bench_context.py [--n 20000]

Cases: an OpenAI chat body with a system prompt and tool results, one of whose chunks repeats
(evidence once + prompt_cache_key: the body is re-serialised); the same with no repeat (nothing
changes but the key); an Anthropic body (breakpoints + evidence once); a gpt-5.6 body with the
budget note (prompt_cache_breakpoints + evidence once + the note). Also the adaptive-depth and
weak-first-pass decisions over 10 scores. Prints microseconds per call (best of 5 rounds).
"""

from __future__ import annotations

import argparse
import copy
import os
import timeit
from collections.abc import Callable
from typing import Any

import orjson
from ragtoll.proxy.core import context

CHUNKS = [f"Chunk {i}: " + "Refunds on annual plans are allowed within thirty days of purchase. " * 10 for i in range(4)]


def _tool(ids: list[int]) -> str:
    return orjson.dumps({"chunks": [{"id": f"c{i}", "text": CHUNKS[i], "score": 0.9 - i / 10} for i in ids]}).decode()


def openai_body(repeat: bool) -> bytes:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are Northwind Cloud's support assistant. " * 8},
        {"role": "user", "content": "Can I get a refund on an annual plan?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "retrieve", "arguments": '{"query":"refunds"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": _tool([0, 1])},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "b", "type": "function", "function": {"name": "retrieve", "arguments": '{"query":"refund"}'}}]},
        {"role": "tool", "tool_call_id": "b", "content": _tool([1, 2] if repeat else [2, 3])},
    ]
    return orjson.dumps({"model": "gpt-4o", "messages": messages})


def anthropic_body() -> bytes:
    doc = orjson.loads(openai_body(True))
    return orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": doc["messages"][0]["content"],
                         "messages": [{"role": "user", "content": "Can I get a refund?"},
                                      {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "r", "input": {}}]},
                                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": _tool([0, 1])}]},
                                      {"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "r", "input": {}}]},
                                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": _tool([1, 2])}]}]})


def rewrite_openai(body: bytes) -> bytes:
    """What the context stage does to an OpenAI body (stages/context.py ContextStage.rewrite)."""
    doc = orjson.loads(body)
    rw = context.Rewrite()
    context.openai_evidence_once(doc, rw, 200)
    context.set_cache_key(doc, context.cache_key("task", task_id="t", caller_id="c", system=context.openai_system(doc)))
    return orjson.dumps(doc)


def rewrite_anthropic(body: bytes) -> bytes:
    doc = orjson.loads(body)
    rw = context.Rewrite()
    context.anthropic_evidence_once(doc, rw, 200)
    context.add_breakpoints(doc, doc["model"], min_tokens=256)
    return orjson.dumps(doc)


NOTE = context.budget_note({"max_steps": 4, "max_retrieval_calls": 3, "max_cost_usd": 0.012}) or ""


def rewrite_note(body: bytes) -> bytes:
    """gpt-5.6 with the budget note: evidence once, both breakpoints, the note (stages/context.py)."""
    doc = orjson.loads(body)
    doc["model"] = "gpt-5.6"
    rw = context.Rewrite()
    context.openai_evidence_once(doc, rw, 200)
    context.add_openai_breakpoints(doc, min_tokens=64)
    context.mark_conversation_end(doc)
    context.append_note(doc, "openai", NOTE)
    return orjson.dumps(doc)


def best_us(fn: Callable[[], object], n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    n = ap.parse_args().n
    repeat, plain, claude = openai_body(True), openai_body(False), anthropic_body()
    scores = [0.91, 0.88, 0.86, 0.52, 0.5, 0.49, 0.31, 0.3, 0.2, 0.1]
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}; "
          f"{n} calls x best of 5")
    for name, body, fn in (("openai, a chunk repeated", repeat, rewrite_openai),
                           ("openai, nothing repeated", plain, rewrite_openai),
                           ("anthropic, breakpoints + a repeat", claude, rewrite_anthropic),
                           ("gpt-5.6, breakpoints + note + repeat", repeat, rewrite_note)):
        assert fn(copy.copy(body)) != body
        read = best_us(lambda b=body: orjson.loads(b), n)
        full = best_us(lambda b=body, f=fn: f(b), n)
        print(f"{name:<36} {len(body):>5} B  rewrite {full:6.1f} us   (orjson.loads alone {read:5.1f} us)")
    print(f"{'adaptive depth, 10 scores':<36} {'':>7}  decide  {best_us(lambda: context.depth(scores, gap=0.25, floor=0.0), n):6.1f} us")
    print(f"{'weak first pass, 10 scores':<36} {'':>7}  decide  {best_us(lambda: context.weak(scores, floor=5.0, margin=0.05), n):6.1f} us")


if __name__ == "__main__":
    main()
