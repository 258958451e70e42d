"""netio, the upstream client's asyncio network backend, on real loopback sockets (plain and TLS).

A raw asyncio HTTP/1.1 server (tests/support/raw_http.py) records every `data_received` call, so
the tests see how the request left the client: one write, or a head and a body.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections.abc import AsyncIterator

import httpcore2
import pytest
from ragtoll.proxy.config import Timeouts, UpstreamConfig
from ragtoll.proxy.netio import AsyncioBackend, AsyncioStream
from ragtoll.proxy.upstream import UpstreamClient
from support.raw_http import Server, localhost_tls


def _upstream(url: str, read: float = 5.0) -> UpstreamConfig:
    return UpstreamConfig(name="raw", kind="retrieval", url=url, timeouts=Timeouts(connect=2, read=read, write=5, pool=2))


async def _send(client: UpstreamClient, up: UpstreamConfig, body: bytes | AsyncIterator[bytes]) -> bytes:
    headers = [(b"host", b"raw"), (b"content-type", b"application/octet-stream")]
    if isinstance(body, bytes):
        headers.append((b"content-length", str(len(body)).encode()))
    response = await client.send(up, "POST", "/search", headers, body, timeouts=up.timeouts)
    # the exchange ran on netio's stream (httpx's documented `network_stream` extension)
    assert isinstance(response._response.extensions["network_stream"], AsyncioStream)
    try:
        return b"".join([chunk async for chunk in response.chunks()])
    finally:
        await response.aclose()


async def test_a_request_with_its_body_in_memory_leaves_in_one_write() -> None:
    async with Server() as server:
        up = _upstream(f"http://127.0.0.1:{server.port}")
        client = UpstreamClient([up])
        try:
            answer = await _send(client, up, b'{"query": "refund window"}')
            assert answer.startswith(b"got 26 bytes")
            # the head and the body arrived together: one segment, one wake-up of the upstream
            assert len(server.recvs) == 1
            assert server.recvs[0].startswith(b"POST /search HTTP/1.1\r\n")
            assert server.recvs[0].endswith(b'\r\n\r\n{"query": "refund window"}')
            # and again on the kept-alive connection
            await _send(client, up, b"second")
            assert len(server.recvs) == 2 and server.recvs[1].endswith(b"\r\n\r\nsecond")
            assert server.connections == 1
        finally:
            await client.aclose()


async def test_a_streamed_body_does_not_hold_the_head_back() -> None:
    """The head goes out before the body's next chunk exists: this body waits for the upstream
    to have seen the head, so holding it back would deadlock (the test's timeout would fire)."""
    async with Server() as server:
        up = _upstream(f"http://127.0.0.1:{server.port}")
        client = UpstreamClient([up])

        async def body() -> AsyncIterator[bytes]:
            assert await asyncio.to_thread(server.heads.wait, 5)
            yield b"part one, "
            await asyncio.sleep(0.01)
            yield b"part two"

        try:
            async with asyncio.timeout(5):
                answer = await _send(client, up, body())
            assert answer.startswith(b"got 18 bytes")  # chunked: 18 bytes of body after decoding
        finally:
            await client.aclose()


async def test_large_bodies_both_ways_keep_every_byte() -> None:
    """Flow control: an 8 MiB upload (the client waits for the socket to drain) and a 12 MiB
    download (reading pauses while httpcore has not asked for the data)."""
    big = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(8 * 1024 * 1024 // 32))
    down = big + big[: 4 * 1024 * 1024]

    def respond(head: bytes, body: bytes) -> bytes:
        assert body == big
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(down) + down

    async with Server(respond) as server:
        pool = httpcore2.AsyncConnectionPool(network_backend=AsyncioBackend())
        async with pool:
            response = await pool.request("POST", f"http://127.0.0.1:{server.port}/up", content=big,
                                          headers=[(b"host", b"raw"), (b"content-length", str(len(big)).encode())])
            assert response.status == 200
            assert hashlib.sha256(response.content).digest() == hashlib.sha256(down).digest()


async def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async with Server(close_after=True) as server:
        pool = httpcore2.AsyncConnectionPool(network_backend=AsyncioBackend())
        async with pool:
            url = f"http://127.0.0.1:{server.port}/"
            for n in range(3):
                first = await pool.request("GET", url, headers=[(b"host", b"raw")])
                assert first.status == 200, n
                await asyncio.sleep(0.05)  # the server's FIN arrives while the connection is idle
            assert server.connections == 3


async def test_read_timeout_is_httpcores_and_prompt() -> None:
    async with Server(lambda head, body: b"") as server:  # never answers
        pool = httpcore2.AsyncConnectionPool(network_backend=AsyncioBackend())
        async with pool:
            started = asyncio.get_running_loop().time()
            with pytest.raises(httpcore2.ReadTimeout):
                await pool.request("GET", f"http://127.0.0.1:{server.port}/", headers=[(b"host", b"raw")],
                                   extensions={"timeout": {"read": 0.2}})
            assert asyncio.get_running_loop().time() - started < 3


async def test_a_refused_connection_is_a_connect_error() -> None:
    async with Server() as server:
        port = server.port
    pool = httpcore2.AsyncConnectionPool(network_backend=AsyncioBackend())
    async with pool:
        with pytest.raises(httpcore2.ConnectError):
            await pool.request("GET", f"http://127.0.0.1:{port}/", headers=[(b"host", b"raw")])


async def test_tls_upstream_verified_against_its_ca() -> None:
    server_ctx, trusting = localhost_tls()
    async with Server(tls=server_ctx) as server:
        url = f"https://localhost:{server.port}/search"
        pool = httpcore2.AsyncConnectionPool(ssl_context=trusting, network_backend=AsyncioBackend())
        async with pool:
            response = await pool.request("POST", url, content=b"over tls",
                                          headers=[(b"host", b"localhost"), (b"content-length", b"8")])
            assert response.status == 200 and response.content.startswith(b"got 8 bytes")
            assert len(server.recvs) == 1  # one TLS record's plaintext: the head and body together
        # a CA the client does not trust: the handshake fails as httpcore's ConnectError
        strict = httpcore2.AsyncConnectionPool(ssl_context=ssl.create_default_context(),
                                               network_backend=AsyncioBackend())
        async with strict:
            with pytest.raises(httpcore2.ConnectError):
                await strict.request("GET", url, headers=[(b"host", b"localhost")])
