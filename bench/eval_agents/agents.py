"""The agents under test: plain tool-calling loops over the `openai` SDK, one per style.

Each knows nothing about ragtoll but the base URL and the task/identity headers it sends. The
SDK client keeps its defaults (`max_retries=2`), so a rejection the SDK would retry shows up as
retries. Tools (`retrieve`, `rerank`) are HTTP calls through ragtoll (the demo's `Tools`), logged
here so the harness can tell which chunks each search brought.

| style | loop | on a tool error | turn limit |
|---|---|---|---|
| lean | the model asks for every search | hands it to the model | 10 |
| corroborator | the demo's agent (`ragtoll.proxy.tools.demo.agent.run`): searches with the question before the first model call | hands it to the model | 30 |
| runaway, multihop, hopeless | the model asks for every search | hands it to the model | 15 |
| fatal | the model asks for every search, the demo's (corroborating) model | **ends the task, no answer** | 10 |
| passes | the same as fatal | hands it to the model | 10 |

Every loop ends the task without an answer when an LLM call fails (an SDK exception: a budget
refusal, after the SDK's own retries if it makes any). At its turn limit a loop makes one last
call with `tool_choice="none"`, so the model answers from what it has (LangChain's
`early_stopping_method="generate"`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import openai
import orjson
from ragtoll.proxy.tools.demo import agent as demo_agent
from ragtoll.proxy.tools.demo.tools import SPECS, Tools

from .policies import SYSTEMS

_SPECS = cast(Any, SPECS)


@dataclass(frozen=True)
class Style:
    system: str
    max_turns: int
    fatal_tool_errors: bool = False
    demo_agent: bool = False  # run ragtoll.proxy.tools.demo.agent.run as it is


STYLE_AGENTS: dict[str, Style] = {
    "lean": Style(SYSTEMS["lean"], 10),
    "corroborator": Style(demo_agent.SYSTEM, demo_agent.MAX_TURNS, demo_agent=True),
    "runaway": Style(SYSTEMS["runaway"], 15),
    "multihop": Style(SYSTEMS["multihop"], 15),
    "hopeless": Style(SYSTEMS["hopeless"], 15),
    "fatal": Style(demo_agent.SYSTEM, 10, fatal_tool_errors=True),
    "passes": Style(demo_agent.SYSTEM, 10),
}


@dataclass(frozen=True)
class ToolCall:
    name: str  # retrieve | rerank
    query: str
    ids: tuple[str, ...]  # chunk ids returned (ranked ids, for rerank)
    error: str | None


class LoggedTools(Tools):
    """The demo's tools, with a log of every call in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[ToolCall] = []

    def retrieve(self, query: str, top_k: int) -> dict[str, Any]:
        out = super().retrieve(query, top_k)
        ids = tuple(c["id"] for c in out.get("chunks") or [])
        self.log.append(ToolCall("retrieve", query, ids, out.get("error")))
        return out

    def rerank(self, query: str, ids: list[str], top_n: int) -> dict[str, Any]:
        out = super().rerank(query, ids, top_n)
        ranked = tuple(c["id"] for c in out.get("ranked") or [])
        self.log.append(ToolCall("rerank", query, ranked, out.get("error")))
        return out


@dataclass
class Result:
    answer: str | None
    stopped: str | None = None  # why the loop ended without an answer, or hit its own limit
    turns: int = 0
    tool_errors: list[str] = field(default_factory=list)


def _llm_error(exc: Exception) -> str:
    if isinstance(exc, openai.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error", body) if isinstance(body, dict) else {}
        message = error.get("message") if isinstance(error, dict) else None
        return f"HTTP {exc.status_code}: {message or exc.message}"
    return f"LLM unreachable: {exc}"


def run(style: str, llm: openai.OpenAI, tools: LoggedTools, question: str, preamble: str = "") -> Result:
    """One task; `preamble` goes at the start of the system prompt (the context eval's fixed
    instructions, provider.PREAMBLE; the scripted model reads past it)."""
    spec = STYLE_AGENTS[style]
    if spec.demo_agent:
        r = demo_agent.run(llm, tools, question, system=preamble + demo_agent.SYSTEM)
        return Result(r.answer, r.stopped, r.turns, r.tool_errors)
    messages: list[Any] = [{"role": "system", "content": preamble + spec.system},
                           {"role": "user", "content": question}]
    result = Result(answer=None)
    for turn in range(1, spec.max_turns + 1):
        result.turns = turn
        try:
            resp = llm.chat.completions.create(
                model="gpt-4o", messages=messages, tools=_SPECS, extra_headers=tools.headers
            )
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            result.stopped = _llm_error(exc)
            return result
        msg = resp.choices[0].message
        if not msg.tool_calls:
            result.answer = msg.content or ""
            return result
        calls = [c for c in msg.tool_calls if c.type == "function"]
        messages.append(
            {
                "role": "assistant",
                "content": msg.content,
                "tool_calls": [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name, "arguments": c.function.arguments}}
                    for c in calls
                ],
            }
        )
        for c in calls:
            out = tools.call(c.function.name, c.function.arguments)
            if "error" in out:
                result.tool_errors.append(str(out["error"]))
                if spec.fatal_tool_errors:
                    result.stopped = f"tool error (fatal for this agent): {out['error']}"
                    return result
            messages.append({"role": "tool", "tool_call_id": c.id, "content": orjson.dumps(out).decode()})
    result.stopped = f"agent hit its own limit of {spec.max_turns} turns"
    try:
        resp = llm.chat.completions.create(
            model="gpt-4o", messages=messages, tools=_SPECS, tool_choice="none", extra_headers=tools.headers
        )
        result.answer = resp.choices[0].message.content or ""
    except (openai.APIStatusError, openai.APIConnectionError) as exc:
        result.stopped += f"; the final call failed too: {_llm_error(exc)}"
    return result
