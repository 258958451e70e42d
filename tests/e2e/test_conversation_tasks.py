"""Legacy agents serving many users through one key, unchanged (issue 31): no trace context, no task
header, embedded defaults. Each conversation is its own task; a search joins the conversation
whose answer asked for it; guessed tasks never get count or cost refusals; runaways still stop."""

from __future__ import annotations

import concurrent.futures
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from conftest import Telemetry
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.tools.demo import services
from ragtoll.proxy.tools.demo.corpus import load_corpus
from ragtoll.proxy.tools.demo.policy import Action
from support.servers import serve_in_thread

SYSTEM = "You answer questions about the handbook. Search first."
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "retrieve",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


def _routes(llm: str, docs: str) -> list[dict[str, Any]]:
    """The stack's two routes: the model and the search, whose fields ragtoll reads."""
    fields = {"query": "query", "top_k": "top_k", "results": "results", "id": "id", "text": "text"}
    return [{"name": "llm", "kind": "llm", "api": "openai", "url": llm, "prefix": "/llm"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": docs, "prefix": "/docs", "fields": fields}]


def policy(messages: list[dict[str, Any]], final: bool = False) -> Action:
    """Search twice (the question, then the question and 'policy'), then answer; `loop:` questions
    never stop. The question is the user's message as the model sees it."""
    question = next(m["content"] for m in messages if m.get("role") == "user")
    searched = sum(1 for m in messages if m.get("role") == "tool")
    if final or (searched >= 2 and not question.startswith("loop:")):
        return Action(answer=f"answer to {question}")
    return Action(tool="retrieve", arguments={"query": question + (" policy" if searched else "")})


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    return "memory" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


@contextlib.contextmanager
def stack(
    telemetry: Telemetry, tmp_path: Any, store: str = "memory", replicas: int = 1, **raw: Any
) -> Iterator[Any]:
    llm_app = services.llm_app(policy)
    with serve_in_thread(llm_app) as llm, serve_in_thread(services.retrieval_app(load_corpus())) as docs:
        doc: dict[str, Any] = {
            "upstreams": _routes(llm, docs),
            "store": store,
            **raw,
        }
        doc["budgets"] = {"records_file": str(tmp_path / "records.jsonl"), **raw.get("budgets", {})}
        settings = config.parse(doc)
        app = build_app(
            settings, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
        )
        with serve_in_thread(app) as base:
            if replicas == 1:
                yield base, llm_app
                return
            other = build_app(
                settings, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
            )
            with serve_in_thread(other) as second:
                yield [base, second], llm_app


def run_agent(
    base: str, question: str, max_turns: int = 10, search_base: str | None = None
) -> tuple[str | None, list[int]]:
    """A plain tool-calling loop over the openai SDK (one shared key), its searches over httpx
    with no credential at all (through `search_base`, another replica, if given); returns the
    answer and the status of every search."""
    searches: list[int] = []
    search_base = search_base or base
    with (
        openai.OpenAI(base_url=f"{base}/llm/v1", api_key="sk-one-key-for-everyone") as llm,
        httpx.Client() as http,
    ):
        messages: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        for _ in range(max_turns):
            try:
                msg = (
                    llm.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
                    .choices[0]
                    .message
                )
            except openai.APIStatusError:
                return None, searches
            if not msg.tool_calls:
                return msg.content, searches
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.function.name, "arguments": c.function.arguments},
                        }
                        for c in msg.tool_calls
                    ],
                }
            )
            for c in msg.tool_calls:
                query = orjson.loads(c.function.arguments)["query"]
                # the app's gateway names the user's groups to the index (not to the model)
                r = http.post(
                    f"{search_base}/docs/search",
                    json={"query": query, "top_k": 3},
                    headers={"x-auth-groups": "public,staff"},
                )
                searches.append(r.status_code)
                messages.append({"role": "tool", "tool_call_id": c.id, "content": r.text[:500]})
    return None, searches


def calls(telemetry: Telemetry) -> list[Any]:
    return [
        s
        for s in telemetry.spans()
        if s.attributes and s.attributes.get(sc.GEN_AI_OPERATION_NAME) in ("chat", "retrieval")
    ]


@pytest.mark.slow
def test_concurrent_users_of_one_key_are_told_apart(telemetry: Telemetry, tmp_path: Any, store: str) -> None:
    questions = [f"What is the refund policy for order {i}? ({uuid.uuid4().hex[:6]})" for i in range(8)]
    questions += questions[:2]  # two users ask exactly what two others ask, at the same time
    with stack(telemetry, tmp_path, store) as (base, _llm), concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda q: run_agent(base, q), questions))
    assert all(answer is not None for answer, _ in results)
    spans = calls(telemetry)
    chats = [s for s in spans if s.attributes[sc.GEN_AI_OPERATION_NAME] == "chat"]
    tasks = {s.attributes[sc.TASK_ID] for s in chats}
    assert len(chats) == 30 and len(tasks) == 10  # 10 conversations of 3 calls, identical twins included
    assert {s.attributes[sc.TASK_SOURCE] for s in chats} == {"conversation"}
    for s in chats:  # each call's spans are in its conversation's trace
        assert s.attributes[sc.TASK_ID].startswith("conv-")
    by_task: dict[str, set[int]] = {}
    for s in chats:
        by_task.setdefault(s.attributes[sc.TASK_ID], set()).add(s.context.trace_id)
    assert all(len(traces) == 1 for traces in by_task.values())
    searches = [s for s in spans if s.attributes[sc.GEN_AI_OPERATION_NAME] == "retrieval"]
    assert len(searches) == 20
    for s in searches:
        assert s.attributes[sc.TASK_SOURCE] == "conversation-tool-match"
        assert s.attributes[sc.TASK_MATCH] == "exact" and s.attributes[sc.TASK_CONFIDENCE] == 1.0
    # a search joins the conversation that asked for it: two per task, twins included
    per_task: dict[str, int] = {}
    for s in searches:
        per_task[s.attributes[sc.TASK_ID]] = per_task.get(s.attributes[sc.TASK_ID], 0) + 1
    assert per_task == {t: 2 for t in tasks}


@pytest.mark.slow
def test_many_users_behind_one_key_are_never_locked_out(telemetry: Telemetry, tmp_path: Any) -> None:
    """Issue 31's first repro: 45 conversations from one client, embedded defaults: none refused
    (before: the 42nd on got 429 max_steps, as one `session` task)."""
    with stack(telemetry, tmp_path) as (base, llm_app):
        results = [run_agent(base, f"Question {i} from user {i}?") for i in range(45)]
    assert all(answer is not None for answer, _ in results)
    assert all(code == 200 for _, searches in results for code in searches)
    assert llm_app.state.served["chat"] == 45 * 3


@pytest.mark.slow
def test_a_runaway_conversation_is_still_stopped(telemetry: Telemetry, tmp_path: Any) -> None:
    """A conversation is a task ragtoll is sure of: its limits apply (the embedded `bounded` profile:
    the loop's searches stall, then the model is asked to answer without tools)."""
    with stack(telemetry, tmp_path) as (base, llm_app):
        answer, _searches = run_agent(base, "loop: what is the answer?", max_turns=60)
    assert answer is not None and answer.startswith("answer to loop:")  # `finish`: answered without tools
    assert llm_app.state.served["chat"] < 60
    chats = [s for s in calls(telemetry) if s.attributes[sc.GEN_AI_OPERATION_NAME] == "chat"]
    assert len({s.attributes[sc.TASK_ID] for s in chats}) == 1


def run_session_client(base: str, n: int) -> list[httpx.Response]:
    with httpx.Client() as http:
        return [
            http.post(
                f"{base}/llm/v1/chat/completions",
                headers={"authorization": "Bearer sk-one"},
                json={"model": "gpt-4o", "messages": [{"role": "user", "content": f"hi {i}"}]},
            )
            for i in range(n)
        ]


@pytest.mark.slow
def test_a_session_gets_progress_limits_only_unless_the_operator_asks(
    telemetry: Telemetry, tmp_path: Any
) -> None:
    """`untracked: session` stays available: its task is a guess that may hold many users, so by
    default only progress limits stop it; `session_budgets: full` restores every limit (402)."""
    with stack(telemetry, tmp_path, tasks={"untracked": "session"}) as (base, _llm):
        answers = run_session_client(base, 45)
    assert {r.status_code for r in answers} == {200}
    # the count limit is a shadow verdict: named on the answers past it (the embedded max_steps 40)
    assert [r.headers.get("x-ragtoll-budget-would-reject") for r in answers[39:]] == [None] + [
        "max_steps"
    ] * 5
    with stack(
        telemetry,
        tmp_path,
        tasks={"untracked": "session", "session_budgets": "full"},
        budgets={"profiles": {"bounded": {"max_steps": 5}}},
    ) as (base, _llm):
        codes = [r.status_code for r in run_session_client(base, 8)]
    assert codes[:5] == [200] * 5 and set(codes[5:]) == {402}


@pytest.mark.slow
def test_a_search_before_the_loop_joins_the_loop_that_asks_its_question(
    telemetry: Telemetry, tmp_path: Any
) -> None:
    """Retrieve-then-reason: the app searches with the user's question, then starts the model loop
    with it (as the demo agent does). The search opens the task; the loop's first call joins it."""
    questions = [f"What is the refund policy for order {i}?" for i in range(4)]

    def agent(base: str, question: str) -> None:
        with httpx.Client() as http:
            http.post(
                f"{base}/docs/search",
                json={"query": question, "top_k": 3},
                headers={"x-auth-groups": "public"},
            )
        run_agent(base, question)

    with stack(telemetry, tmp_path) as (base, _llm), concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda q: agent(base, q), questions))
    spans = sorted(calls(telemetry), key=lambda s: s.start_time)
    tasks = {s.attributes[sc.TASK_ID] for s in spans}
    # one task per user: the early search, the model call, its search (the same query: it stalls,
    # so the progress limit has the model answer) and the answer
    assert len(tasks) == 4 and len(spans) == 16
    for t in tasks:
        mine = [s for s in spans if s.attributes[sc.TASK_ID] == t]
        assert [s.attributes[sc.GEN_AI_OPERATION_NAME] for s in mine] == [
            "retrieval",
            "chat",
            "retrieval",
            "chat",
        ]
        assert mine[0].attributes[sc.TASK_SOURCE] == "conversation-query"
        assert mine[0].attributes[sc.TASK_MATCH] == "pre-search"
        assert mine[1].attributes[sc.TASK_MATCH] == "pre-search"  # the loop's first call joined it


@pytest.mark.slow
def test_a_conversation_spans_replicas(telemetry: Telemetry, tmp_path: Any, redis_url: str) -> None:
    """Two replicas on one Redis: the model calls go to one, the searches to the other; each search
    still joins the conversation whose answer asked for it."""
    questions = [f"What is the refund policy for order {i}? ({uuid.uuid4().hex[:6]})" for i in range(4)]
    with (
        stack(telemetry, tmp_path, redis_url, replicas=2) as (bases, _llm),
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        results = list(pool.map(lambda q: run_agent(bases[0], q, search_base=bases[1]), questions))
    assert all(answer is not None for answer, _ in results)
    spans = calls(telemetry)
    chats = [s for s in spans if s.attributes[sc.GEN_AI_OPERATION_NAME] == "chat"]
    searches = [s for s in spans if s.attributes[sc.GEN_AI_OPERATION_NAME] == "retrieval"]
    tasks = {s.attributes[sc.TASK_ID] for s in chats}
    assert len(tasks) == 4 and len(searches) == 8
    assert {s.attributes[sc.TASK_SOURCE] for s in searches} == {"conversation-tool-match"}
    assert {s.attributes[sc.TASK_ID] for s in searches} == tasks


def responses_app() -> Any:
    """A Responses API stand-in: a function call first, then an answer; ids resp_1, resp_2, ..."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    ids = iter(range(1, 1_000_000))

    async def respond(request: Request) -> JSONResponse:
        doc = await request.json()
        n = next(ids)
        if doc.get("previous_response_id"):
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "done", "annotations": []}],
                }
            ]
        else:
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": "retrieve",
                    "arguments": orjson.dumps({"query": f"search for {doc['input']}"}).decode(),
                    "status": "completed",
                }
            ]
        return JSONResponse(
            {
                "id": f"resp_{n}",
                "object": "response",
                "created_at": 0,
                "status": "completed",
                "model": "gpt-4o",
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
            }
        )

    return Starlette(routes=[Route("/v1/responses", respond, methods=["POST"])])


@pytest.mark.slow
def test_a_responses_api_chain_is_one_task(telemetry: Telemetry, tmp_path: Any) -> None:
    """The Responses API names its chain: previous_response_id joins the task of that response;
    the search its function call asked for joins it too."""
    with (
        serve_in_thread(responses_app()) as llm,
        serve_in_thread(services.retrieval_app(load_corpus())) as docs,
    ):
        doc = {
            "upstreams": _routes(llm, docs),
            "budgets": {"records_file": str(tmp_path / "records.jsonl")},
        }
        app = build_app(
            config.parse(doc),
            tracer_provider=telemetry.tracer_provider,
            meter_provider=telemetry.meter_provider,
        )
        with (
            serve_in_thread(app) as base,
            openai.OpenAI(base_url=f"{base}/llm/v1", api_key="sk-one") as client,
            httpx.Client() as http,
        ):
            for user in ("alice", "bob"):
                first = client.responses.create(model="gpt-4o", input=f"question of {user}")
                args = orjson.loads(first.output[0].arguments)  # type: ignore[union-attr]
                http.post(
                    f"{base}/docs/search",
                    json={"query": args["query"], "top_k": 3},
                    headers={"x-auth-groups": "public"},
                )
                client.responses.create(model="gpt-4o", input="ok", previous_response_id=first.id)
    spans = sorted(calls(telemetry), key=lambda s: s.start_time)
    assert len(spans) == 6
    alice, bob = spans[:3], spans[3:]
    for user in (alice, bob):
        assert len({s.attributes[sc.TASK_ID] for s in user}) == 1
        assert [s.attributes[sc.TASK_MATCH] for s in user] == ["opening", "exact", "previous-response"]
    assert alice[0].attributes[sc.TASK_ID] != bob[0].attributes[sc.TASK_ID]
