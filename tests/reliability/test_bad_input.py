"""Bad input over the wire: oversized bodies, malformed JSON on every adapter, broken trace context,
odd task ids against a real Redis, header injection attempts, admin API credentials, path tricks.

What each proves: the caller gets a clear JSON answer or its bytes go through unchanged, the span
records what was ignored and why, and nothing reaches another key, header, host or the admin API.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import httpx
import orjson
import pytest
import redis
from conftest import ProxyFactory, Telemetry
from ragtoll.instrumentation import semconv as sc
from support.admin import ADMIN_TOKEN, ledger
from support.faulty import BUDGETS, CHAT, FaultyUpstream, exchange, new_task, raw_request, routes
from support.spans import call_span

pytestmark = pytest.mark.usefixtures("admin_token")


# --- oversized bodies ---------------------------------------------------------------------------

@pytest.mark.parametrize(("route", "framing"), [
    ("/openai/v1/chat/completions", "length"), ("/openai/v1/chat/completions", "chunked"),
    ("/raw/upload", "length"), ("/raw/upload", "chunked"),
])
def test_body_past_max_body_bytes_is_413_json(proxy: ProxyFactory, faulty: FaultyUpstream, route: str,
                                              framing: str) -> None:
    body = b'{"model": "m", "messages": [], "pad": "' + b"x" * 5000 + b'"}'
    content: Any = body if framing == "length" else iter([body[:1000], body[1000:]])
    with proxy(upstreams=routes(faulty.url), server={"max_body_bytes": 2048}) as base:
        before = len(faulty.seen)
        r = httpx.post(f"{base}{route}", content=content, headers={"content-type": "application/json"})
        ok = httpx.post(f"{base}{route}", content=b'{"model": "m", "messages": []}')
    assert r.status_code == 413
    err = r.json()["error"]
    assert err["code"] == "body_too_large" and err["limit"] == 2048
    assert r.headers["x-should-retry"] == "false"
    assert ok.status_code == 200
    # the upstream never received the oversized body whole
    assert all(len(s.body) < len(body) for s in faulty.seen[before:])


# --- malformed JSON on every adapter ------------------------------------------------------------

ADAPTER_PATHS = {
    "openai": "/v1/chat/completions", "anthropic": "/v1/messages", "cohere": "/v1/rerank", "tei": "/rerank",
    "json": "/search", "qdrant": "/collections/c/points/search", "chroma": "/collections/c/query",
    "elasticsearch": "/idx/_search", "opensearch": "/idx/_search", "langserve": "/invoke",
    "passthrough": "/anything",
}
MALFORMED = [b'{"model": "gpt', b"\xff\xfe\x00 not json", b"[1, 2, 3]", b'{"messages": 5, "query": {"a": []}}',
             b"null", b'{"input": "' + "\u00e9\U0001f600".encode() * 50 + b'"']


def is_json(body: bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


@pytest.mark.parametrize("api", sorted(ADAPTER_PATHS))
def test_malformed_json_is_forwarded_unchanged_and_recorded(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                            telemetry: Telemetry, api: str) -> None:
    """With `on_unreadable: charge_reservation`: forwarded byte for byte, charged, never a crash."""
    kind = {"openai": "llm", "anthropic": "llm", "cohere": "rerank", "tei": "rerank", "passthrough": "other"}
    up = [{"name": "x", "kind": kind.get(api, "retrieval"), "api": api, "url": faulty.url, "prefix": "/x"}]
    budgets = {**BUDGETS, "on_unreadable": "charge_reservation"}
    with proxy(upstreams=up, budgets=budgets) as base, httpx.Client(timeout=10) as http:
        for body in MALFORMED:
            task = new_task()
            r = http.post(f"{base}/x{ADAPTER_PATHS[api]}", content=body,
                          headers={"content-type": "application/json", "x-ragtoll-task-id": task})
            assert r.status_code == 200, (api, body, r.text)
            assert faulty.last().body == body  # byte for byte
            span = call_span(telemetry, task)
            assert span.attributes[sc.OUTCOME] == "ok"
            if api != "passthrough" and not is_json(body):  # a wrong shape may be read as "no query"
                assert span.attributes.get(sc.PARSE_ERROR), (api, body)
            assert ledger(http, base, task)["in_flight"] == 0


@pytest.mark.parametrize("api", sorted(ADAPTER_PATHS))
def test_malformed_json_is_refused_by_an_enforcing_budget(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                          telemetry: Telemetry, api: str) -> None:
    """The default (`on_unreadable: reject`): a body the adapter cannot read is a 400 naming why,
    never forwarded unbudgeted; what it reads (or does not read at all: passthrough) goes on."""
    kind = {"openai": "llm", "anthropic": "llm", "cohere": "rerank", "tei": "rerank", "passthrough": "other"}
    up = [{"name": "x", "kind": kind.get(api, "retrieval"), "api": api, "url": faulty.url, "prefix": "/x"}]
    with proxy(upstreams=up, budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
        for body in MALFORMED:
            task, before = new_task(), len(faulty.seen)
            r = http.post(f"{base}/x{ADAPTER_PATHS[api]}", content=body,
                          headers={"content-type": "application/json", "x-ragtoll-task-id": task})
            if api != "passthrough" and not is_json(body):
                assert r.status_code == 400, (api, body, r.text)
            if r.status_code == 400:  # not JSON, or JSON the adapter cannot read (a list, null)
                assert r.json()["error"]["code"] == "unreadable_body"
                assert r.json()["error"]["reason"] == call_span(telemetry, task).attributes[sc.PARSE_ERROR]
                assert len(faulty.seen) == before  # refused before the store: the task was never opened
            else:
                assert r.status_code == 200 and faulty.last().body == body, (api, body, r.text)
                assert ledger(http, base, task)["in_flight"] == 0


# --- trace context ------------------------------------------------------------------------------

GOOD_TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(("headers", "note"), [
    ([("traceparent", "00-zz-00f067aa0ba902b7-01")], "traceparent ignored: malformed"),
    ([("traceparent", "00-" + "0" * 32 + "-00f067aa0ba902b7-01")], "traceparent ignored: malformed"),
    ([("traceparent", GOOD_TP + "x" * 600)], "traceparent ignored: malformed"),
    ([("traceparent", GOOD_TP), ("traceparent", GOOD_TP.replace("4bf9", "5bf9"))],
     "traceparent ignored: header given more than once"),
    ([("baggage", "ragtoll.task.id=a"), ("baggage", "ragtoll.task.id=b")],
     "baggage ignored: header given more than once"),
    ([("baggage", "ragtoll.task.id=a,ragtoll.task.id=b")], "baggage ragtoll.task.id ignored: given more than once"),
    ([("baggage", "k=" + "v" * 9000)], "baggage ignored: larger than 8192 bytes"),
    ([("baggage", ",".join(f"k{i}=v" for i in range(200)))], "baggage ignored: more than 180 members"),
    ([("baggage", "ragtoll.task.id=has%20space")], "baggage ragtoll.task.id ignored: malformed"),
])
def test_bad_trace_context_is_ignored_and_noted(proxy: ProxyFactory, faulty: FaultyUpstream, telemetry: Telemetry,
                                                headers: list[tuple[str, str]], note: str) -> None:
    task = new_task()
    with proxy(upstreams=routes(faulty.url)) as base:
        data = exchange(base, raw_request("POST", "/openai/v1/chat/completions",
                                          {"x-ragtoll-task-id": task, "connection": "close"}, orjson.dumps(CHAT))
                        .replace(b"\r\n\r\n", b"".join(f"\r\n{k}: {v}".encode() for k, v in headers) + b"\r\n\r\n", 1))
    assert data.startswith(b"HTTP/1.1 200")
    assert f"x-ragtoll-task-id: {task}".encode() in data  # the task header still names the task
    span = call_span(telemetry, task)
    assert note in span.attributes[sc.TASK_NOTES]


# --- odd task ids and Redis keys ----------------------------------------------------------------

ODD_IDS = ["ragtoll:records", "ragtoll:records:h", "../../etc/passwd", "x/../../admin", "=+@~.-_", "t" * 128]
# refused as task ids (the call runs under a session task instead): braces would be a hash tag
REFUSED_IDS = ["a:b:{x}", "ragtoll:{t:00000000000000000000000000000000}:h", "a b", "t" * 129]


def test_odd_task_ids_touch_only_their_own_hashed_keys(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                       redis_url: str) -> None:
    db_url = redis_url.rsplit("/", 1)[0] + "/9"
    client = redis.Redis.from_url(db_url)
    client.flushdb()
    client.set("victim", "untouched")
    stream = f"rel-records-{uuid.uuid4().hex[:6]}"
    baggage_ids = ["%7Bx%7D", "a%0D%0Ab", "%00", "%E2%80%AEevil", "%7F"]  # decoded: odd bytes
    try:
        with proxy(upstreams=routes(faulty.url), store=db_url,
                   budgets={**BUDGETS, "records_stream": stream}) as base, httpx.Client(timeout=10) as http:
            for task in ODD_IDS:
                r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT, headers={"x-ragtoll-task-id": task})
                assert r.status_code == 200 and r.headers["x-ragtoll-task-id"] == task
                view = ledger(http, base, task)  # the admin path reads the same task back
                assert view["task_id"] == task and view["used"]["steps"] == 1
            for task in REFUSED_IDS:
                r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT, headers={"x-ragtoll-task-id": task})
                # the untracked default: the call's conversation (each of these opens a new one)
                assert r.status_code == 200 and r.headers["x-ragtoll-task-id"].startswith("conv-")
            for raw in baggage_ids:
                r = http.post(f"{base}/openai/v1/chat/completions", json=CHAT,
                              headers={"baggage": f"ragtoll.task.id={raw}"})
                # the untracked default: the call's conversation (each of these opens a new one)
                assert r.status_code == 200 and r.headers["x-ragtoll-task-id"].startswith("conv-")
        keys = sorted(k.decode() for k in client.keys("*"))
        assert client.get("victim") == b"untouched"
    finally:
        client.flushdb()
        client.close()
    pattern = re.compile(r"^ragtoll:\{t:[0-9a-f]{32}\}:[hqc]$|^ragtoll:conv:[lpc]:[0-9a-f]{24,32}$")
    # and the deployment's own fixed keys: its records stream, the tasks it handed over when it stopped
    assert [k for k in keys if k not in ("victim", stream, f"ragtoll:handover:{stream}") and not pattern.match(k)] == []
    # + one conversation task per refused id (each call opens its own conversation)
    assert len([k for k in keys if k.endswith(":h")]) == len(ODD_IDS) + len(REFUSED_IDS) + len(baggage_ids)


# --- header injection ---------------------------------------------------------------------------

@pytest.mark.parametrize("header", [
    ("baggage", "ragtoll.task.id=a%0D%0ASet-Cookie:%20pwn=1"),
    ("baggage", "ragtoll.task.id=a%0ASet-Cookie:%20pwn=1,ragtoll.budget.profile=p%0D%0Ax-pwn:%201"),
    ("x-ragtoll-task-id", "a%0d%0aSet-Cookie: pwn=1"),
    ("x-ragtoll-task-id", "a\xc2\x85Set-Cookie: pwn=1"),
])
def test_values_echoed_into_headers_cannot_inject(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                  header: tuple[str, str]) -> None:
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base:
        req = raw_request("POST", "/openai/v1/chat/completions", {"connection": "close", header[0]: header[1]},
                          orjson.dumps(CHAT))
        data = exchange(base, req.decode("latin-1").encode("latin-1"))
    head = data.split(b"\r\n\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 200")
    names = [line.split(b":", 1)[0].lower() for line in head.split(b"\r\n")[1:]]
    assert b"set-cookie" not in names and b"x-pwn" not in names
    assert b"pwn" not in head
    assert all(b"\r" not in line and b"\n" not in line for line in head.split(b"\r\n"))


# --- admin API ----------------------------------------------------------------------------------

@pytest.mark.parametrize("auth", [None, "", "Bearer", "Bearer wrong", f"Basic {ADMIN_TOKEN}",
                                  f"Bearer {ADMIN_TOKEN}x", f"Bearer {ADMIN_TOKEN[:-1]}",
                                  f"bearer  {ADMIN_TOKEN[::-1]}", f"Token {ADMIN_TOKEN}"])
def test_admin_without_the_right_token_is_401(proxy: ProxyFactory, faulty: FaultyUpstream, auth: str | None) -> None:
    task = new_task()
    headers = {} if auth is None else {"authorization": auth}
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base, httpx.Client(timeout=10) as http:
        http.post(f"{base}/openai/v1/chat/completions", json=CHAT, headers={"x-ragtoll-task-id": task})
        got = http.get(f"{base}/admin/tasks/{task}", headers=headers)
        end = http.post(f"{base}/admin/tasks/{task}/end", headers=headers)
        still = ledger(http, base, task)  # the right token still reads it: nothing ended
    for r in (got, end):
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"].startswith("Bearer")
    assert still["used"]["steps"] == 1


def test_admin_is_off_without_a_configured_token(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAGTOLL_ADMIN_TOKEN")
    with proxy(upstreams=routes(faulty.url)) as base:
        r = httpx.get(f"{base}/admin/tasks/x", headers={"authorization": "Bearer x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "admin_disabled"


@pytest.mark.parametrize("target", [
    b"//admin/tasks/t", b"/raw/..%2f..%2fadmin/tasks/t", b"/raw/%2e%2e/admin/tasks/t", b"/%61dmin/tasks/t",
    b"http://127.0.0.1/admin/tasks/t", b"http://evil.invalid/raw/echo", b"/raw//admin/tasks/t",
    b"*", b"/raw/x?../../admin", b"/RAW/echo", b"/raw\\..\\admin",
])
def test_path_tricks_reach_neither_admin_nor_another_host(proxy: ProxyFactory, faulty: FaultyUpstream,
                                                          target: bytes) -> None:
    with proxy(upstreams=routes(faulty.url), budgets=BUDGETS) as base:
        before = len(faulty.seen)
        data = exchange(base, b"GET " + target + b" HTTP/1.1\r\nHost: evil.invalid\r\nConnection: close\r\n\r\n")
    status = int(data.split(b" ", 2)[1])
    assert status != 200 or len(faulty.seen) == before + 1  # a 200 only ever comes from the configured upstream
    assert b'"ledger"' not in data and b'"task_id"' not in data and b'"used"' not in data  # no admin answer
    for seen in faulty.seen[before:]:
        assert not seen.path.startswith("/admin")  # the upstream only ever gets what follows /raw
        assert not seen.path.startswith("http")
