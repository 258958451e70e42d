"""`on_exhausted: finish` end to end: the task's first call past a limit goes upstream once with tools
disabled, so the model answers from what it has; the call after it is refused as usual. Real openai
and anthropic SDKs, OpenAI chat and Responses and Anthropic Messages, streamed and not."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from support.fake_backends import FakeBackends
from support.servers import serve_in_thread

NOTE = "Budget reached: answer now from what you have."
TOOLS_OPENAI = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}]
TOOLS_RESPONSES = [{"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}}]
TOOLS_ANTHROPIC = [{"name": "search", "input_schema": {"type": "object", "properties": {}}}]


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[str, FakeBackends]]:
    app = FakeBackends()
    with serve_in_thread(app) as url:
        yield url, app


def profile(on_exhausted: str) -> dict[str, Any]:
    return {"default_profile": "p", "profiles": {"p": {"max_steps": 1, "on_exhausted": on_exhausted,
                                                       "finish_note": NOTE}}}


def chat(client: openai.OpenAI, stream: bool) -> Any:
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Who wrote the leave policy?"}],
        tools=TOOLS_OPENAI, stream=stream)  # type: ignore[call-overload]
    for _ in raw.parse() if stream else ():
        pass
    return raw


def responses(client: openai.OpenAI, stream: bool) -> Any:
    raw = client.responses.with_raw_response.create(model="gpt-4.1", input="Who wrote the leave policy?",
                                                    tools=TOOLS_RESPONSES, stream=stream)  # type: ignore[call-overload]
    for _ in raw.parse() if stream else ():
        pass
    return raw


def messages(client: anthropic.Anthropic, stream: bool) -> Any:
    raw = client.messages.with_raw_response.create(model="claude-sonnet-4-5", max_tokens=200, tools=TOOLS_ANTHROPIC,
                                                   messages=[{"role": "user", "content": "Who wrote it?"}],
                                                   stream=stream)  # type: ignore[call-overload]
    for _ in raw.parse() if stream else ():
        pass
    return raw


APIS: dict[str, tuple[str, str, Callable[..., Any]]] = {
    "chat": ("/openai/v1", "/v1/chat/completions", chat),
    "responses": ("/oai/v1", "/v1/responses", responses),
    "anthropic": ("/anthropic", "/v1/messages", messages),
}


def sent(upstream: Upstream, backends: FakeBackends, api: str) -> list[dict[str, Any]]:
    """The bodies the upstream received for `api`'s path."""
    path = APIS[api][1]
    reqs = upstream.app.state.requests if api == "chat" else backends.requests
    return [orjson.loads(r["body"]) for r in reqs if r["path"] == path]


def client_for(api: str, base: str, task_id: str) -> Any:
    headers = {"x-ragtoll-task-id": task_id}
    if api == "anthropic":
        return anthropic.Anthropic(base_url=f"{base}{APIS[api][0]}", api_key="k", max_retries=2,
                                   default_headers=headers)
    return openai.OpenAI(base_url=f"{base}{APIS[api][0]}", api_key="k", max_retries=2, default_headers=headers)


def wait_for_span(telemetry: Telemetry, attribute: str) -> Any:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        found = [s for s in telemetry.spans() if attribute in (s.attributes or {})]
        if found:
            return found[-1]
        time.sleep(0.01)
    raise AssertionError(f"no span with {attribute}")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", list(APIS))
def test_the_call_past_the_limit_answers_with_tools_disabled_once(
        api: str, stream: bool, proxy: ProxyFactory, upstream: Upstream, backends: tuple[str, FakeBackends],
        telemetry: Telemetry, admin_token: str) -> None:
    url, app = backends
    upstream.app.state.reset()
    app.requests.clear()
    ups = [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"},
           {"name": "oai", "kind": "llm", "api": "openai", "url": url, "prefix": "/oai"},
           {"name": "claude", "kind": "llm", "api": "anthropic", "url": url, "prefix": "/anthropic"}]
    call = APIS[api][2]
    with proxy(upstreams=ups, budgets=profile("finish")) as base:
        task_id = f"t-{uuid.uuid4().hex[:12]}"
        client = client_for(api, base, task_id)
        first = call(client, stream)
        finished = call(client, stream)  # max_steps 1: past the limit, answered with tools disabled
        with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)):
            call(client, stream)  # the next call is refused as usual, and not retried
        client.close()
        record = httpx.post(f"{base}/admin/tasks/{task_id}/end",
                            headers={"authorization": f"Bearer {admin_token}"}).json()
    assert record["finished_by_ragtoll"] == 1 and record["exhausted"] == "max_steps"
    assert "x-ragtoll-budget-finished" not in first.headers
    assert finished.headers["x-ragtoll-budget-finished"] == "max_steps"
    bodies = sent(upstream, app, api)
    assert len(bodies) == 2  # the refused third call never reached the upstream
    assert "tool_choice" not in bodies[0]
    assert bodies[1]["tool_choice"] in ("none", {"type": "none"})
    assert bodies[1]["tools"] == bodies[0]["tools"]  # kept: the transcript's tool calls refer to them
    assert NOTE in orjson.dumps(bodies[1]).decode()
    assert wait_for_span(telemetry, sc.BUDGET_FINISHED).attributes[sc.BUDGET_FINISHED] == "max_steps"


def test_reject_is_the_default_and_nothing_is_rewritten(proxy: ProxyFactory, upstream: Upstream) -> None:
    upstream.app.state.reset()
    ups = [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"}]
    with proxy(upstreams=ups, budgets={"default_profile": "p", "profiles": {"p": {"max_steps": 1}}}) as base:
        client = client_for("chat", base, f"t-{uuid.uuid4().hex[:12]}")
        chat(client, False)
        with pytest.raises(openai.APIStatusError):
            chat(client, False)
        client.close()
    assert len(sent(upstream, FakeBackends(), "chat")) == 1


def test_one_finish_per_task_even_when_calls_race(proxy: ProxyFactory, upstream: Upstream) -> None:
    """Eight calls past the limit at once: the store counts the refusals, exactly one is finished."""
    import concurrent.futures

    upstream.app.state.reset()
    ups = [{"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"}]
    t = f"t-{uuid.uuid4().hex[:12]}"
    with proxy(upstreams=ups, budgets=profile("finish")) as base:
        client = client_for("chat", base, t)
        chat(client, False)

        def one(_: int) -> int:
            try:
                chat(client, False)
                return 1
            except openai.APIStatusError:
                return 0

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answered = sum(pool.map(one, range(8)))
        client.close()
    assert answered == 1
    bodies = sent(upstream, FakeBackends(), "chat")
    assert len(bodies) == 2 and bodies[1]["tool_choice"] == "none"
