"""One model call through one agent framework, run as its own process (tests/e2e/test_framework_refusals.py).

    python framework_calls.py FRAMEWORK BASE_URL

Each framework is used as its docs show, at its default settings (retries included), against
ragtoll at BASE_URL (routes /openai and /anthropic). Prints one JSON line: the error the framework
raised (its type and message), or the answer. A process of its own: async frameworks run their
own event loop, and nothing they leave open reaches the test run's warnings.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

import orjson

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no export to a hosted tracing service
KEY = "sk-framework-test"
MODEL = "gpt-4o-mini"
CLAUDE = "claude-sonnet-4-5"


def _openai(base: str) -> Any:
    import openai

    with openai.OpenAI(base_url=f"{base}/openai/v1", api_key=KEY) as client:
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])


def _openai_responses(base: str) -> Any:
    import openai

    with openai.OpenAI(base_url=f"{base}/openai/v1", api_key=KEY) as client:
        return client.responses.create(model=MODEL, input="hi")


def _anthropic(base: str) -> Any:
    import anthropic

    with anthropic.Anthropic(base_url=f"{base}/anthropic", api_key=KEY) as client:
        return client.messages.create(
            model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )


def _langchain_openai(base: str) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=f"{base}/openai/v1", api_key=KEY).invoke("hi").content  # type: ignore[arg-type]


def _langchain_anthropic(base: str) -> Any:
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(model=CLAUDE, base_url=f"{base}/anthropic", api_key=KEY).invoke("hi").content  # type: ignore[call-arg,arg-type]


def _llama_index_openai(base: str) -> Any:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai import OpenAI

    llm = OpenAI(model=MODEL, api_base=f"{base}/openai/v1", api_key=KEY)
    return str(llm.chat([ChatMessage(role="user", content="hi")]))


def _llama_index_agent(base: str) -> Any:
    """An agent workflow (FunctionAgent) with one tool, as llama-index's docs build one."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.llms.openai import OpenAI

    def search(query: str) -> str:
        """Search the handbook."""
        return "nothing found"

    agent = FunctionAgent(
        tools=[search],
        llm=OpenAI(model=MODEL, api_base=f"{base}/openai/v1", api_key=KEY),
        system_prompt="Answer from the handbook.",
    )

    async def run() -> str:
        return str(await agent.run(user_msg="What is the refund window?"))

    return asyncio.run(run())


def _openai_agents(base: str, responses: bool) -> Any:
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner

    async def run() -> str:
        async with openai.AsyncOpenAI(base_url=f"{base}/openai/v1", api_key=KEY) as client:
            model = (OpenAIResponsesModel if responses else OpenAIChatCompletionsModel)(
                model=MODEL, openai_client=client
            )
            agent = Agent(name="helper", instructions="Answer briefly.", model=model)
            return str((await Runner.run(agent, "hi")).final_output)

    return asyncio.run(run())


FRAMEWORKS: dict[str, Callable[[str], Any]] = {
    "openai": _openai,
    "openai-responses": _openai_responses,
    "anthropic": _anthropic,
    "langchain-openai": _langchain_openai,
    "langchain-anthropic": _langchain_anthropic,
    "llama-index-openai": _llama_index_openai,
    "llama-index-agent": _llama_index_agent,
    "openai-agents-chat": lambda base: _openai_agents(base, responses=False),
    "openai-agents-responses": lambda base: _openai_agents(base, responses=True),
}


def main() -> None:
    name, base = sys.argv[1], sys.argv[2]
    try:
        answer = FRAMEWORKS[name](base)
        out = {"answer": str(answer)[:500]}
    except Exception as exc:  # noqa: BLE001 - what the framework raised is the result
        out = {"error_type": f"{type(exc).__module__}.{type(exc).__qualname__}", "message": str(exc)[:2000]}
    sys.stdout.write(orjson.dumps(out).decode() + "\n")


if __name__ == "__main__":
    main()
