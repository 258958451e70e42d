"""pool.py, the upstream connection pool, against a raw HTTP/1.1 server on loopback: reuse, the
connection limit and the line behind it, stale and closed connections, timeouts, cancellation,
TLS, and the headers it keeps from untrusted upstreams."""

from __future__ import annotations

import asyncio

import httpx2
import pytest
from ragtoll.proxy.pool import DROP_HEADERS, ConnectionPool
from support.raw_http import Server, localhost_tls, ok


def slow(seconds: float):  # type: ignore[no-untyped-def]
    def respond(head: bytes, body: bytes) -> tuple[float, bytes]:
        return seconds, ok(head, body)  # type: ignore[return-value]

    return respond


def closing(head: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok"


def client(**limits: float) -> tuple[httpx2.AsyncClient, ConnectionPool]:
    pool = ConnectionPool(httpx2.Limits(**limits))  # type: ignore[arg-type]
    return httpx2.AsyncClient(transport=pool, timeout=5), pool


async def test_sequential_requests_share_one_connection() -> None:
    async with Server() as server:
        c, _ = client()
        async with c:
            for n in range(5):
                r = await c.post(f"http://127.0.0.1:{server.port}/", content=b"x" * n)
                assert r.status_code == 200 and r.content.startswith(b"got %d bytes" % n)
        assert server.connections == 1


async def test_max_connections_bounds_what_is_open_and_the_rest_wait_their_turn() -> None:
    async with Server(slow(0.05)) as server:
        c, _ = client(max_connections=2, max_keepalive_connections=2)
        async with c:
            answers = await asyncio.gather(*[c.get(f"http://127.0.0.1:{server.port}/{i}") for i in range(6)])
        assert [r.status_code for r in answers] == [200] * 6
        assert server.max_open == 2 and server.connections == 2


async def test_a_request_that_finds_no_free_connection_in_time_gets_a_pool_timeout() -> None:
    async with Server(slow(0.5)) as server:
        c, _ = client(max_connections=1)
        url = f"http://127.0.0.1:{server.port}/"
        async with c:
            holder = asyncio.create_task(c.get(url))
            await asyncio.sleep(0.05)
            with pytest.raises(httpx2.PoolTimeout):
                await c.get(url, timeout=httpx2.Timeout(5, pool=0.05))
            assert (await holder).status_code == 200
            assert (await c.get(url)).status_code == 200  # the slot is free again
        assert server.connections == 1


async def test_a_waiter_that_is_cancelled_passes_its_turn_on() -> None:
    async with Server(slow(0.2)) as server:
        c, _ = client(max_connections=1)
        url = f"http://127.0.0.1:{server.port}/"
        async with c:
            holder = asyncio.create_task(c.get(url))
            await asyncio.sleep(0.05)
            given_up = asyncio.create_task(c.get(url))
            patient = asyncio.create_task(c.get(url))
            await asyncio.sleep(0.05)
            given_up.cancel()
            async with asyncio.timeout(5):
                assert (await holder).status_code == 200
                assert (await patient).status_code == 200
            assert given_up.cancelled()


async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async with Server(close_after=True) as server:
        c, _ = client(max_connections=1)
        async with c:
            for n in range(3):
                assert (await c.get(f"http://127.0.0.1:{server.port}/")).status_code == 200, n
                await asyncio.sleep(0.05)  # the server's FIN arrives while the connection is idle
        assert server.connections == 3


async def test_connection_close_from_the_server_frees_the_slot() -> None:
    async with Server(closing) as server:
        c, _ = client(max_connections=1)
        async with c:
            for _ in range(3):
                async with asyncio.timeout(5):  # a leaked slot would make this wait for ever
                    assert (await c.get(f"http://127.0.0.1:{server.port}/")).content == b"ok"
        assert server.connections == 3


async def test_a_response_closed_before_its_body_was_read_frees_the_slot() -> None:
    big = b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n" + b"z" * 1_000_000
    async with Server(lambda head, body: big) as server:
        c, _ = client(max_connections=1)
        url = f"http://127.0.0.1:{server.port}/"
        async with c:
            for _ in range(2):
                async with asyncio.timeout(5), c.stream("GET", url) as r:
                    assert r.status_code == 200
                    async for _chunk in r.aiter_raw():
                        break  # most of the body is still unread: the connection cannot be reused
        assert server.connections == 2


async def test_idle_connections_expire() -> None:
    async with Server() as server:
        c, _ = client(keepalive_expiry=0.05)
        async with c:
            await c.get(f"http://127.0.0.1:{server.port}/")
            await asyncio.sleep(0.15)
            await c.get(f"http://127.0.0.1:{server.port}/")
        assert server.connections == 2


async def test_only_max_keepalive_connections_are_kept_idle() -> None:
    async with Server(slow(0.05)) as server:
        c, _ = client(max_connections=3, max_keepalive_connections=1)
        async with c:
            await asyncio.gather(*[c.get(f"http://127.0.0.1:{server.port}/") for _ in range(3)])
            await asyncio.sleep(0.05)
            assert server.open_now == 1 and server.client_closed == 2
        await asyncio.sleep(0.05)
        assert server.open_now == 0  # closing the client closed the idle one too


async def test_a_refused_connection_is_a_connect_error_and_frees_its_slot() -> None:
    async with Server() as server:
        port = server.port
    c, _ = client(max_connections=1)
    async with c:
        for _ in range(2):  # a leaked slot would turn the second into a pool timeout
            with pytest.raises(httpx2.ConnectError):
                await c.get(f"http://127.0.0.1:{port}/", timeout=httpx2.Timeout(2, pool=0.5))


async def test_a_read_timeout_is_httpx2s_and_frees_the_slot() -> None:
    async with Server(slow(5)) as server:
        c, _ = client(max_connections=1)
        async with c:
            for _ in range(2):
                with pytest.raises(httpx2.ReadTimeout):
                    await c.get(f"http://127.0.0.1:{server.port}/", timeout=httpx2.Timeout(2, read=0.1, pool=0.5))


async def test_headers_named_by_the_drop_extension_are_not_sent() -> None:
    async with Server() as server:
        c, _ = client()
        async with c:
            request = c.build_request("GET", f"http://127.0.0.1:{server.port}/", headers={
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Baggage": "a=b",
                "x-kept": "yes"})
            request.extensions[DROP_HEADERS] = frozenset({b"traceparent", b"baggage"})
            assert (await c.send(request)).status_code == 200
            plain = await c.get(f"http://127.0.0.1:{server.port}/", headers={"traceparent": "kept-here"})
            assert plain.status_code == 200
        first, second = (r.lower() for r in server.recvs)
        assert b"x-kept: yes" in first and b"traceparent" not in first and b"baggage" not in first
        assert b"traceparent: kept-here" in second


async def test_tls_upstream_verified_against_its_ca() -> None:
    server_ctx, trusting = localhost_tls()
    async with Server(tls=server_ctx) as server:
        url = f"https://localhost:{server.port}/search"
        async with httpx2.AsyncClient(transport=ConnectionPool(httpx2.Limits(), ssl_context=trusting)) as c:
            for _ in range(2):
                r = await c.post(url, content=b"over tls")
                assert r.status_code == 200 and r.content.startswith(b"got 8 bytes")
        assert server.connections == 1
        # the default context does not trust this CA: the handshake fails as a ConnectError
        async with httpx2.AsyncClient(transport=ConnectionPool(httpx2.Limits())) as strict:
            with pytest.raises(httpx2.ConnectError):
                await strict.get(url)


async def test_a_closed_pool_refuses_requests() -> None:
    async with Server() as server:
        pool = ConnectionPool(httpx2.Limits())
        async with httpx2.AsyncClient(transport=pool) as c:
            await c.get(f"http://127.0.0.1:{server.port}/")
        with pytest.raises(httpx2.UnsupportedProtocol):
            await pool.handle_async_request(httpx2.Request("GET", f"http://127.0.0.1:{server.port}/"))
