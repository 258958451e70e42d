"""http11.py, ragtoll's HTTP/1.1 client connection, through the pool against a raw server on
loopback that answers with exact bytes: framing both ways, informational and bodiless answers,
bodies that end with the connection, broken and truncated answers, and when a connection is
kept."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx2
import pytest
from ragtoll.proxy.pool import ConnectionPool
from support.raw_http import Server


def answer(raw: bytes):  # type: ignore[no-untyped-def]
    return lambda head, body: raw


def client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(transport=ConnectionPool(httpx2.Limits()), timeout=5)


async def get(server: Server, method: str = "GET", content: bytes | AsyncIterator[bytes] | None = None,
              **kwargs: object) -> tuple[httpx2.Response, bytes]:
    async with client() as c, c.stream(method, f"http://127.0.0.1:{server.port}/x?q=1", content=content,
                                       **kwargs) as r:  # type: ignore[arg-type]
        return r, b"".join([part async for part in r.aiter_raw()])


async def test_a_request_leaves_with_its_framing_and_one_response_per_connection_use() -> None:
    async with Server() as server, client() as c:
        r = await c.post(f"http://127.0.0.1:{server.port}/x?q=1", content=b"abc", headers={"x-a": "1"})
        assert r.status_code == 200 and r.reason_phrase == "OK" and r.http_version == "HTTP/1.1"
        await c.post(f"http://127.0.0.1:{server.port}/x", content=b"")
        first = server.recvs[0]
        assert first.startswith(b"POST /x?q=1 HTTP/1.1\r\n") and first.endswith(b"\r\n\r\nabc")
        assert b"\r\ncontent-length: 3\r\n" in first.lower() and b"\r\nx-a: 1\r\n" in first
        assert server.connections == 1


async def test_a_streamed_request_body_is_chunk_encoded() -> None:
    async def parts() -> AsyncIterator[bytes]:
        yield b"one "
        yield b""
        yield b"two"

    async with Server() as server:
        _, body = await get(server, "POST", parts())
    assert body.startswith(b"got 7 bytes")  # the server decoded the chunks back to the body
    assert b"transfer-encoding: chunked" in b"".join(server.recvs).lower()


async def test_informational_answers_are_skipped() -> None:
    raw = (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"
           b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok")
    async with Server(answer(raw)) as server:
        r, body = await get(server)
    assert r.status_code == 201 and body == b"ok" and "link" not in r.headers


async def test_a_chunked_answer_is_decoded_and_its_connection_kept() -> None:
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    async with Server(answer(raw)) as server, client() as c:
        for _ in range(2):
            assert (await c.get(f"http://127.0.0.1:{server.port}/")).content == b"hello world"
    assert server.connections == 1


@pytest.mark.parametrize("raw", [b"HTTP/1.1 204 No Content\r\n\r\n",
                                 b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n"])
async def test_204_and_304_have_no_body(raw: bytes) -> None:
    async with Server(answer(raw)) as server, client() as c:
        for _ in range(2):
            r = await c.get(f"http://127.0.0.1:{server.port}/")
            assert r.content == b""
    assert server.connections == 1


async def test_the_answer_to_head_ends_at_its_head() -> None:
    async with Server(answer(b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n")) as server, client() as c:
        for _ in range(2):
            r = await c.head(f"http://127.0.0.1:{server.port}/")
            assert r.status_code == 200 and r.headers["content-length"] == "1234" and r.content == b""
    assert server.connections == 1


async def test_a_body_without_framing_runs_until_the_server_closes() -> None:
    async with Server(answer(b"HTTP/1.1 200 OK\r\n\r\nall of it"), close_after=True) as server, client() as c:
        for _ in range(2):
            assert (await c.get(f"http://127.0.0.1:{server.port}/")).content == b"all of it"
    assert server.connections == 2  # never reused


async def test_connection_close_and_http_1_0_are_not_reused() -> None:
    for raw in (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok",
                b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok"):
        async with Server(answer(raw)) as server, client() as c:
            for _ in range(2):
                assert (await c.get(f"http://127.0.0.1:{server.port}/")).content == b"ok"
        assert server.connections == 2, raw


@pytest.mark.parametrize(("raw", "close_after"), [
    (b"", True),  # closed before any answer
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", True),  # closed inside a framed body
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n", True),  # no last chunk
    (b"NOT HTTP AT ALL\r\n\r\n", False),
])
async def test_a_broken_or_truncated_answer_is_a_remote_protocol_error(raw: bytes, close_after: bool) -> None:
    async with Server(answer(raw), close_after=close_after) as server:
        with pytest.raises(httpx2.RemoteProtocolError):
            await get(server)


async def test_a_body_that_breaks_mid_way_gives_what_came_before_the_error() -> None:
    raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\nzz-not-a-size\r\n\r\n"
    got = b""
    async with Server(answer(raw)) as server, client() as c, c.stream("GET", f"http://127.0.0.1:{server.port}/") as r:
        assert r.status_code == 200
        with pytest.raises(httpx2.RemoteProtocolError):
            async for part in r.aiter_raw():
                got += part
    assert got == b"hello"


async def test_bytes_after_the_answer_are_not_taken_for_the_next_one() -> None:
    async with Server(answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokGARBAGE")) as server, client() as c:
        for _ in range(2):
            assert (await c.get(f"http://127.0.0.1:{server.port}/")).content == b"ok"
    assert server.connections == 2


async def test_an_answer_before_the_upload_ends_is_still_read() -> None:
    """A server that refuses a large upload at once (413) and closes: the answer is what the
    client gets, not the write error of the rest of the body."""
    big = b"x" * (32 << 20)
    refuse = b"HTTP/1.1 413 Content Too Large\r\nconnection: close\r\ncontent-length: 3\r\n\r\nno!"

    def respond(head: bytes, body: bytes) -> bytes:
        return refuse

    async with Server(respond, close_after=True, answer_at_head=True) as server:
        r, body = await get(server, "POST", big)
    assert r.status_code == 413 and body == b"no!"


@pytest.mark.parametrize("headers", [
    {"x-bad": "a\r\nx-injected: yes"},
    {"content-length": "5"},  # the body is 3 bytes
])
async def test_a_request_that_cannot_be_framed_is_a_local_protocol_error(headers: dict[str, str]) -> None:
    async with Server() as server:
        with pytest.raises(httpx2.LocalProtocolError):
            await get(server, "POST", b"abc", headers=headers)
        await asyncio.sleep(0.05)
    assert b"x-injected" not in b"".join(server.recvs)


async def test_an_oversized_response_head_is_refused() -> None:
    raw = b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"p" * 300_000 + b"\r\n\r\n"
    async with Server(answer(raw)) as server:
        with pytest.raises(httpx2.RemoteProtocolError):
            await get(server)
