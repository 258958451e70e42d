"""The demo agent: a plain tool-calling loop written against the `openai` SDK.

It knows nothing about ragtoll except the base URL and the task/identity headers it sends with
every call. A refused LLM call (budget) ends the task with that error as its stop reason; the
agent's own safety net is `max_turns`, as in common agent frameworks. Like many production RAG
agents it retrieves with the user's question before the first model call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import openai
import orjson

from .policy import LEAN
from .tools import SPECS, Tools

SYSTEM = (
    "You answer questions about Northwind Cloud using only the documents returned by your tools. "
    "Search with retrieve, order results with rerank, cite chunk ids, and say when you cannot find "
    "the answer."
)
LEAN_SYSTEM = f"{SYSTEM} {LEAN}"  # the lean agent: answers as soon as its evidence suffices
MAX_TURNS = 30
PREFETCH_TOP_K = 6
_SPECS = cast(Any, SPECS)  # the SDK wants its TypedDicts; these plain dicts have that shape


@dataclass
class AgentResult:
    answer: str | None
    stopped: str | None = None  # why the loop ended without an answer
    turns: int = 0
    tool_errors: list[str] = field(default_factory=list)


def run(
    llm: openai.OpenAI,
    tools: Tools,
    question: str,
    *,
    model: str = "gpt-4o",
    max_turns: int = MAX_TURNS,
    prefetch: bool = True,
    system: str = SYSTEM,
) -> AgentResult:
    """Answer `question`; with `prefetch`, the first search is the question itself, made before
    the first model call (so the task's first query, which ragtoll classifies, is the question)."""
    messages: list[Any] = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    result = AgentResult(answer=None)
    if prefetch:
        # retrieve-then-reason: search with the user's question before the first model call, and hand
        # the model the results as if it had asked (a forced first tool call)
        out = tools.retrieve(question, PREFETCH_TOP_K)
        if "error" in out:
            result.tool_errors.append(str(out["error"]))
        args = orjson.dumps({"query": question, "top_k": PREFETCH_TOP_K}).decode()
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_prefetch",
                        "type": "function",
                        "function": {"name": "retrieve", "arguments": args},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": "call_prefetch", "content": orjson.dumps(out).decode()}
        )
    for turn in range(1, max_turns + 1):
        result.turns = turn
        try:
            resp = llm.chat.completions.create(
                model=model, messages=messages, tools=_SPECS, extra_headers=tools.headers
            )
        except openai.APIStatusError as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            error = body.get("error", body) if isinstance(body, dict) else {}
            message = error.get("message") if isinstance(error, dict) else None
            result.stopped = f"HTTP {exc.status_code}: {message or exc.message}"
            return result
        except openai.APIConnectionError as exc:
            result.stopped = f"LLM unreachable: {exc}"
            return result
        msg = resp.choices[0].message
        if not msg.tool_calls:
            result.answer = msg.content or ""
            return result
        messages.append(
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in msg.tool_calls
                    if c.type == "function"
                ],
            }
        )
        for c in msg.tool_calls:
            if c.type != "function":
                continue
            out = tools.call(c.function.name, c.function.arguments)
            if "error" in out:
                result.tool_errors.append(str(out["error"]))
            messages.append({"role": "tool", "tool_call_id": c.id, "content": orjson.dumps(out).decode()})
    # out of turns: one last call that may not use tools, so the model answers with what it has
    # (LangChain's early_stopping_method="generate")
    result.stopped = f"agent hit its own limit of {max_turns} turns"
    try:
        resp = llm.chat.completions.create(
            model=model, messages=messages, tools=_SPECS, tool_choice="none", extra_headers=tools.headers
        )
        result.answer = resp.choices[0].message.content or ""
    except (openai.APIStatusError, openai.APIConnectionError) as exc:
        result.stopped += f"; the final call failed too: {exc}"
    return result
