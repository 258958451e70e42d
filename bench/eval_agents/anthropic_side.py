"""The context eval against a Claude-style provider: the scripted model behind the Anthropic
Messages API with explicit prompt caching (provider.AnthropicPromptCache), and one agent loop over
the `anthropic` SDK for every style.

The facade turns a Messages request into the chat transcript the scripted policies read
(policies.decide) and the policy's action back into a Messages response; its usage reports what
the cache read and wrote. The agent is the styles' plain loop (agents.run) spoken in Messages:
the demo-agent styles (corroborator, fatal, passes) run it with the demo agent's system prompt
and no prefetch search. Pure translation; no ragtoll import beyond the demo's tools.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import orjson
from ragtoll.proxy.tools.demo import agent as demo_agent
from ragtoll.proxy.tools.demo.tools import SPECS
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:  # the SDK is imported where it runs: the demo extra, which the budget eval needs, has none
    import anthropic
from starlette.routing import Route

from . import policies, provider
from .agents import STYLE_AGENTS, LoggedTools, Result

MODEL = "claude-sonnet-4-5"
TOOLS = [{"name": s["function"]["name"], "description": s["function"].get("description", ""),
          "input_schema": s["function"]["parameters"]} for s in SPECS]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict) and b.get("type") == "text")


def to_chat(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages request as the OpenAI-style transcript the scripted policies read."""
    out: list[dict[str, Any]] = [{"role": "system", "content": _text(body.get("system"))}]
    for m in body.get("messages") or []:
        content = m.get("content")
        if m.get("role") == "assistant":
            calls = [{"id": b["id"], "type": "function",
                      "function": {"name": b["name"], "arguments": orjson.dumps(b.get("input") or {}).decode()}}
                     for b in content if isinstance(b, dict) and b.get("type") == "tool_use"] \
                if isinstance(content, list) else []
            out.append({"role": "assistant", "content": _text(content) or None, **({"tool_calls": calls} if calls else {})})
            continue
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            for b in content:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _text(b.get("content"))})
            continue
        out.append({"role": "user", "content": _text(content)})
    return out


def llm_app(cache: provider.AnthropicPromptCache, ledger: provider.Ledger, preamble_tokens: int) -> Starlette:
    ids = itertools.count(1)

    async def messages(request: Request) -> Response:
        body = orjson.loads(await request.body())
        final = not body.get("tools") or (body.get("tool_choice") or {}).get("type") == "none"
        action = policies.decide(to_chat(body), final=final)
        n = next(ids)
        if action.answer is not None:
            content: list[dict[str, Any]] = [{"type": "text", "text": action.answer}]
            stop = "end_turn"
        else:
            content = [{"type": "tool_use", "id": f"toolu_{n}", "name": action.tool, "input": action.arguments}]
            stop = "tool_use"
        fresh, read, written = cache(body)
        task = provider.task_of({k.lower(): v for k, v in request.headers.items()})
        ledger.calls[task] += 1
        ledger.uncached[task] += fresh
        ledger.cached[task] += read
        ledger.written[task] += written
        ledger.preamble[task] += preamble_tokens
        return JSONResponse({
            "id": f"msg_{n}", "type": "message", "role": "assistant", "model": MODEL, "content": content,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": fresh, "cache_read_input_tokens": read, "cache_creation_input_tokens": written,
                      "output_tokens": 20}})

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


def run(style: str, client: anthropic.Anthropic, tools: LoggedTools, question: str, preamble: str) -> Result:
    """The style's loop (agents.run) over the Messages API."""
    import anthropic

    spec = STYLE_AGENTS[style]
    system = preamble + (demo_agent.SYSTEM if spec.demo_agent else spec.system)
    max_turns = 10 if spec.demo_agent else spec.max_turns
    messages: list[Any] = [{"role": "user", "content": question}]
    result = Result(answer=None)
    for turn in range(1, max_turns + 1):
        result.turns = turn
        try:
            resp = client.messages.create(model=MODEL, max_tokens=1024, system=system, messages=messages,
                                          tools=TOOLS, extra_headers=tools.headers)  # type: ignore[arg-type]
        except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
            result.stopped = f"LLM call failed: {exc}"
            return result
        uses = [b for b in resp.content if b.type == "tool_use"]
        if not uses:
            result.answer = "".join(b.text for b in resp.content if b.type == "text")
            return result
        messages.append({"role": "assistant", "content": [
            {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input} for b in uses]})
        results = []
        for b in uses:
            out = tools.call(b.name, orjson.dumps(b.input).decode())
            if "error" in out:
                result.tool_errors.append(str(out["error"]))
                if spec.fatal_tool_errors:
                    result.stopped = f"tool error (fatal for this agent): {out['error']}"
                    return result
            results.append({"type": "tool_result", "tool_use_id": b.id, "content": orjson.dumps(out).decode()})
        messages.append({"role": "user", "content": results})
    result.stopped = f"agent hit its own limit of {max_turns} turns"
    try:
        resp = client.messages.create(model=MODEL, max_tokens=1024, system=system, messages=messages, tools=TOOLS,
                                      tool_choice={"type": "none"}, extra_headers=tools.headers)  # type: ignore[arg-type]
        result.answer = "".join(b.text for b in resp.content if b.type == "text")
    except (anthropic.APIStatusError, anthropic.APIConnectionError) as exc:
        result.stopped += f"; the final call failed too: {exc}"
    return result
