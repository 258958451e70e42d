"""The proxy core over real loopback sockets: the real OpenAI SDK, streaming, errors, disconnects."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import openai
import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from support.poll import wait_until


def test_openai_sdk_sync_chat_passes_through(proxy: ProxyFactory, upstream: Upstream) -> None:
    with proxy() as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0)
        resp = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert resp.choices[0].message.content == "Hello there."
    assert resp.usage is not None and resp.usage.prompt_tokens == 12
    req = upstream.app.state.requests[-1]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["authorization"] == "Bearer sk-test"
    assert orjson.loads(req["body"])["messages"][0]["content"] == "hi"


async def test_openai_sdk_async_chat(proxy: ProxyFactory) -> None:
    with proxy() as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0)
        resp = await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        await client.close()
    assert resp.model == "gpt-4o"


def test_openai_sdk_streaming_collects_all_chunks(proxy: ProxyFactory) -> None:
    with proxy() as base:
        client = openai.OpenAI(base_url=f"{base}/openai/v1", api_key="sk-test", max_retries=0)
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True},
        )
        parts = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(parts) == "Hello there."


@pytest.mark.slow
def test_sse_reaches_client_before_upstream_finishes(proxy: ProxyFactory) -> None:
    body = {"model": "gpt-4o-mini", "stream": True, "messages": []}
    with proxy() as base, httpx.Client() as http:
        t0 = time.perf_counter()
        with http.stream("POST", f"{base}/openai/v1/chat/completions", json=body,
                         headers={"x-test-delay": "0.3"}) as resp:
            chunks = resp.iter_raw()
            first = next(chunks)
            t_first = time.perf_counter() - t0
            rest = b"".join(chunks)
            t_all = time.perf_counter() - t0
    assert first.startswith(b"data: ")
    # five delays of 0.3 s sit between the events; the first event must not wait for them
    assert t_first < t_all / 2
    assert rest.endswith(b"data: [DONE]\n\n")


def test_headers_and_body_pass_through_byte_for_byte(proxy: ProxyFactory) -> None:
    payload = b'{"a": 1,   "b": [1,2]}'
    with proxy() as base:
        r = httpx.post(f"{base}/raw/echo/x%20y?z=1&z=2", content=payload,
                       headers={"x-custom": "v", "connection": "keep-alive", "x-ragtoll-task-id": "t-1",
                                "content-type": "application/json"})
    doc = r.json()
    assert r.status_code == 200
    assert doc["body"] == payload.decode()
    assert doc["raw_path"] == "/echo/x%20y"
    assert doc["query"] == "z=1&z=2"
    assert doc["headers"]["x-custom"] == "v"
    assert "x-ragtoll-task-id" not in doc["headers"]  # ragtoll's own control header stays here
    assert doc["headers"]["host"] == r.url.host or doc["headers"]["host"].startswith("127.0.0.1")
    assert r.headers["x-upstream"] == "yes"
    assert r.headers["x-ragtoll-task-id"] == "t-1"
    names = [k.lower() for k, _ in r.headers.raw]
    assert len(names) == len(set(names)), names  # no header doubled by the proxy's own server


def test_cookies_from_one_call_never_reach_another(proxy: ProxyFactory) -> None:
    with proxy() as base:
        first = httpx.get(f"{base}/raw/echo")
        assert "set-cookie" in first.headers  # passed to the caller
        second = httpx.get(f"{base}/raw/echo")
    assert "cookie" not in second.json()["headers"]


def test_compressed_body_passes_untouched(proxy: ProxyFactory, telemetry: Telemetry) -> None:
    with proxy() as base, httpx.Client() as http, http.stream("GET", f"{base}/openai/gzip") as resp:
        raw = b"".join(resp.iter_raw())
        assert resp.headers["content-encoding"] == "gzip"
    assert raw[:2] == b"\x1f\x8b"


def test_upstream_status_and_error_body_returned_as_is(proxy: ProxyFactory) -> None:
    with proxy() as base:
        r = httpx.get(f"{base}/raw/status/418")
    assert r.status_code == 418
    assert r.json()["error"]["message"] == "as asked"


def test_connect_failure_is_502_json_naming_upstream(upstream: Upstream, telemetry: Telemetry) -> None:
    from ragtoll.proxy import config
    from ragtoll.proxy.app import build_app
    from support.servers import free_port, serve_in_thread

    dead = f"http://127.0.0.1:{free_port()}"
    settings = config.parse({"upstreams": [{"name": "gone", "kind": "llm", "api": "openai", "url": dead}]})
    with serve_in_thread(build_app(settings, tracer_provider=telemetry.tracer_provider)) as base:
        r = httpx.post(f"{base}/gone/v1/chat/completions", json={"model": "m", "messages": []})
    assert r.status_code == 502
    err = r.json()["error"]
    assert err["code"] == "upstream_unavailable" and err["upstream"] == "gone" and "gone" in err["message"]
    call = [s for s in telemetry.spans() if s.name == "chat m"][0]
    assert call.attributes["error.type"] == "upstream_unavailable"


@pytest.mark.slow
def test_slow_headers_beyond_timeout_is_504_json(upstream: Upstream, telemetry: Telemetry) -> None:
    from ragtoll.proxy import config
    from ragtoll.proxy.app import build_app
    from support.servers import serve_in_thread

    settings = config.parse({"upstreams": [{"name": "slow", "kind": "other", "url": upstream.url,
                                            "timeouts": {"read": 0.3}}]})
    with serve_in_thread(build_app(settings, tracer_provider=telemetry.tracer_provider)) as base:
        t0 = time.perf_counter()
        r = httpx.get(f"{base}/slow/slow", headers={"x-test-delay": "5"})
        elapsed = time.perf_counter() - t0
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "upstream_timeout"
    assert elapsed < 4  # the 5 s upstream was not waited for


def test_openai_sdk_sees_a_clean_error_on_502(upstream: Upstream, telemetry: Telemetry) -> None:
    from ragtoll.proxy import config
    from ragtoll.proxy.app import build_app
    from support.servers import free_port, serve_in_thread

    settings = config.parse({"upstreams": [{"name": "gone", "kind": "llm", "api": "openai",
                                            "url": f"http://127.0.0.1:{free_port()}"}]})
    with serve_in_thread(build_app(settings, tracer_provider=telemetry.tracer_provider)) as base:
        client = openai.OpenAI(base_url=f"{base}/gone/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="m", messages=[])
    assert info.value.status_code == 502


def test_client_disconnect_mid_stream_closes_upstream(proxy: ProxyFactory, upstream: Upstream,
                                                      telemetry: Telemetry) -> None:
    body = {"model": "gpt-4o-mini", "stream": True, "messages": []}
    with proxy() as base:
        with httpx.Client() as http, http.stream(
            "POST", f"{base}/openai/v1/chat/completions", json=body, headers={"x-test-stall": "1"}
        ) as resp:
            next(iter(resp.iter_raw()))
        # the client is gone; the stalled upstream stream must be closed by ragtoll promptly
        wait_until(lambda: upstream.app.state.stream_closed_early > 0)
    assert upstream.app.state.stream_closed_early == 1
    call = telemetry.by_name("chat gpt-4o-mini")[0]
    assert call.attributes["ragtoll.outcome"] == "client_disconnect"


def test_client_disconnect_while_waiting_for_headers_cancels_upstream(proxy: ProxyFactory, upstream: Upstream,
                                                                     telemetry: Telemetry) -> None:
    with proxy() as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET /raw/slow HTTP/1.1\r\nHost: x\r\nx-test-delay: 30\r\n\r\n")
            assert wait_until(lambda: upstream.app.state.calls["/slow"] == 1)  # the upstream is working on it
        wait_until(lambda: telemetry.by_name("other raw"))
    call = telemetry.by_name("other raw")[0]
    assert call.attributes["ragtoll.outcome"] == "client_disconnect"


@pytest.mark.parametrize("path", ["/nope", "/openaix/v1/chat", "/", "/admin"])
def test_unknown_paths_get_404_json_listing_prefixes(proxy: ProxyFactory, path: str) -> None:
    with proxy() as base:
        r = httpx.post(f"{base}{path}")
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] == "route_not_found"
    assert "/openai" in err["prefixes"] and "/docs" in err["prefixes"]


@pytest.mark.parametrize("raw_path", [
    b"/raw/../openai/v1/chat/completions", b"/raw/%2e%2e/admin", b"/raw/%252e%252e/x", b"/raw/a/..%2f..%2fadmin",
    b"/raw/.%2E/x", b"/raw/..\\admin",
])
def test_path_traversal_is_refused(proxy: ProxyFactory, upstream: Upstream, raw_path: bytes) -> None:
    with proxy() as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET " + raw_path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    status = int(data.split(b" ", 2)[1])
    assert status in (400, 404)
    assert b'"error"' in data
    assert upstream.app.state.calls.total() == 0


def test_absolute_uri_never_reaches_another_host(proxy: ProxyFactory, upstream: Upstream) -> None:
    with proxy() as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET http://example.invalid/raw/echo HTTP/1.1\r\nHost: example.invalid\r\n"
                         b"Connection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    # the absolute form names another host, but only the configured upstream can be reached
    assert upstream.app.state.calls.get("/echo", 0) in (0, 1)
    assert b"example.invalid/raw" not in data
    if upstream.app.state.calls.get("/echo"):
        assert upstream.app.state.requests[-1]["headers"]["host"].startswith("127.0.0.1")


def test_connect_method_is_refused(proxy: ProxyFactory, upstream: Upstream) -> None:
    with proxy() as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
            data = sock.recv(65536)
    assert int(data.split(b" ", 2)[1]) in (400, 405)
    assert upstream.app.state.calls.total() == 0


def test_health_endpoints_need_no_task_and_touch_no_upstream(proxy: ProxyFactory, upstream: Upstream) -> None:
    with proxy(tasks={"untracked": "reject"}) as base:
        assert httpx.get(f"{base}/healthz").json()["status"] == "ok"
        ready = httpx.get(f"{base}/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert upstream.app.state.calls.total() == 0


def test_untracked_reject_gives_400_json(proxy: ProxyFactory, upstream: Upstream) -> None:
    with proxy(tasks={"untracked": "reject"}) as base:
        r = httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []})
        ok = httpx.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []},
                        headers={"x-ragtoll-task-id": "task-9"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "task_required"
    assert r.headers["x-should-retry"] == "false"
    assert ok.status_code == 200 and ok.headers["x-ragtoll-task-id"] == "task-9"
    assert upstream.app.state.calls["/v1/chat/completions"] == 1


@pytest.mark.slow
def test_many_concurrent_calls_all_complete(proxy: ProxyFactory) -> None:
    async def run(base: str) -> list[int]:
        async with httpx.AsyncClient() as http:
            rs = await asyncio.gather(*[
                http.post(f"{base}/openai/v1/chat/completions", json={"model": "m", "messages": []})
                for _ in range(50)])
        return [r.status_code for r in rs]

    with proxy(tasks={"untracked": "per-call"}) as base:  # 50 separate tasks: no budget interferes
        assert asyncio.run(run(base)) == [200] * 50


def test_unmatchable_paths_still_get_json_404(proxy: ProxyFactory, upstream: Upstream) -> None:
    with proxy() as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET /nope%0Aevil HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    assert data.startswith(b"HTTP/1.1 404")
    assert b"application/json" in data and b'"route_not_found"' in data
