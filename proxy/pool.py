"""The upstream connection pool: an httpx2 transport over http11.py's connections on netio's
sockets.

httpx2's default transport sends every request through httpcore2's general-purpose pool: a
pool-request object, an anyio Event and an anyio cancel scope per request, and a pass over every
connection to hand out requests, even when an idle connection is waiting. On a process that sat
idle (bench/bench_proxy.py's stream phase, where every call starts cold) that bookkeeping cost
about 0.15 ms of the time to the first streamed event (measured A/B in one run). This pool:

  * gives a request the most recently used idle connection of its origin; one that is past its
    keep-alive expiry or that the server closed meanwhile is closed and skipped;
  * else opens a connection when the origin has fewer than `max_connections`, else waits in line
    (first come, first served) up to the request's pool timeout (`httpx2.PoolTimeout`);
  * takes a connection back when its response is closed, if the exchange left it reusable and
    fewer than `max_keepalive_connections` are idle; otherwise it is closed;
  * speaks HTTP/1.1 only, as httpx2's transport does without `http2=True`; TLS by `start_tls` with
    httpx2's default context (certificates verified);
  * drops the request headers named by the `DROP_HEADERS` extension while it converts the request
    (upstream.py uses it to keep trace context from untrusted upstreams);
  * raises httpx2's exceptions for httpcore2's, as httpx2's own transport maps them.

The HTTP/1.1 exchange itself (framing, keep-alive, streaming both ways) is http11.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpcore2
import httpx2

from .http11 import Body, Connection
from .netio import AsyncioBackend

# Request extension: lower-case header names (bytes) not to send upstream.
DROP_HEADERS = "ragtoll.drop_headers"

_DEFAULT_PORTS = {b"http": 80, b"https": 443}

# httpcore2 exception -> httpx2 exception; the most specific class in the exception's MRO wins.
_EXCEPTIONS: dict[type[Exception], type[httpx2.HTTPError]] = {
    httpcore2.ConnectTimeout: httpx2.ConnectTimeout,
    httpcore2.ReadTimeout: httpx2.ReadTimeout,
    httpcore2.WriteTimeout: httpx2.WriteTimeout,
    httpcore2.PoolTimeout: httpx2.PoolTimeout,
    httpcore2.TimeoutException: httpx2.TimeoutException,
    httpcore2.ConnectError: httpx2.ConnectError,
    httpcore2.ReadError: httpx2.ReadError,
    httpcore2.WriteError: httpx2.WriteError,
    httpcore2.NetworkError: httpx2.NetworkError,
    httpcore2.ProxyError: httpx2.ProxyError,
    httpcore2.UnsupportedProtocol: httpx2.UnsupportedProtocol,
    httpcore2.LocalProtocolError: httpx2.LocalProtocolError,
    httpcore2.RemoteProtocolError: httpx2.RemoteProtocolError,
    httpcore2.ProtocolError: httpx2.ProtocolError,
}


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for cls in type(exc).__mro__:
            target = _EXCEPTIONS.get(cls)
            if target is not None:
                raise target(str(exc)) from exc
        raise


@dataclass(slots=True)
class _Origin:
    """One origin's connections: the idle ones (most recent last) and how many are open."""

    idle: list[Connection] = field(default_factory=list)
    open: int = 0  # idle, in use, or being opened
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)

    def wake(self) -> None:
        """Let the first request in line look again (a connection came back or a slot freed)."""
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                return


class ConnectionPool(httpx2.AsyncBaseTransport):
    def __init__(self, limits: httpx2.Limits, *, ssl_context: ssl.SSLContext | None = None,
                 backend: httpcore2.AsyncNetworkBackend | None = None) -> None:
        self._max_open = limits.max_connections
        self._max_idle = limits.max_keepalive_connections
        self._expiry = limits.keepalive_expiry
        self._ssl_context = ssl_context
        self._backend = backend or AsyncioBackend()
        self._origins: dict[tuple[bytes, bytes, int], _Origin] = {}
        self._closed = False

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        scheme, host = url.raw_scheme, url.raw_host
        port = url.port or _DEFAULT_PORTS.get(scheme, 0)
        drop = request.extensions.get(DROP_HEADERS)
        headers = request.headers.raw
        if drop:
            headers = [(k, v) for k, v in headers if k.lower() not in drop]
        timeouts = request.extensions.get("timeout", {})
        key = (scheme, host, port)
        origin = self._origins.get(key)
        if origin is None:
            origin = self._origins[key] = _Origin()
        with _mapped():
            conn = await self._acquire(origin, timeouts.get("pool"))
            try:
                if conn is None:
                    conn = await self._connect(scheme, host, port, timeouts.get("connect"))
                assert isinstance(request.stream, httpx2.AsyncByteStream)
                response = await conn.send(request.method.encode("ascii"), url.raw_path, headers,
                                           request.stream, timeouts.get("read"), timeouts.get("write"))
            except BaseException:
                await self._release(origin, conn)
                raise
        extensions = {"http_version": response.http_version, "reason_phrase": response.reason,
                      "network_stream": conn.stream}
        return httpx2.Response(status_code=response.status, headers=response.headers,
                               stream=_ResponseStream(response.body, self, origin, conn), extensions=extensions)

    async def _acquire(self, origin: _Origin, timeout: float | None) -> Connection | None:
        """An idle connection, or None with a slot reserved for a new one (waits while none is free)."""
        while True:
            if self._closed:
                raise httpcore2.UnsupportedProtocol("the connection pool is closed")
            while origin.idle:
                conn = origin.idle.pop()
                if not conn.has_expired():
                    return conn
                origin.open -= 1
                await conn.aclose()
            if self._max_open is None or origin.open < self._max_open:
                origin.open += 1
                return None
            fut = asyncio.get_running_loop().create_future()
            origin.waiting.append(fut)
            woken = False
            try:
                async with asyncio.timeout(timeout):
                    await fut
                woken = True
            except TimeoutError:
                raise httpcore2.PoolTimeout(f"no connection was free within {timeout} s") from None
            finally:
                if not woken and fut.done() and not fut.cancelled():
                    origin.wake()  # its turn came just as it gave up (timeout, cancelled): pass it on
                elif not woken:
                    fut.cancel()
                    with contextlib.suppress(ValueError):
                        origin.waiting.remove(fut)

    async def _connect(self, scheme: bytes, host: bytes, port: int, timeout: float | None) -> Connection:
        name = host.decode("ascii")
        stream = await self._backend.connect_tcp(name, port, timeout=timeout)
        if scheme == b"https":
            if self._ssl_context is None:
                self._ssl_context = httpx2.create_ssl_context()
                self._ssl_context.set_alpn_protocols(["http/1.1"])
            try:
                stream = await stream.start_tls(self._ssl_context, server_hostname=name, timeout=timeout)
            except BaseException:
                await stream.aclose()
                raise
        elif scheme != b"http":
            await stream.aclose()
            raise httpcore2.UnsupportedProtocol(f"unsupported URL scheme {scheme.decode()!r}")
        return Connection(stream, self._expiry)

    async def _release(self, origin: _Origin, conn: Connection | None) -> None:
        """The exchange on `conn` (None: it never opened) is over: keep it idle or close it."""
        if conn is not None and conn.is_idle() and not self._closed and (
                self._max_idle is None or len(origin.idle) < self._max_idle):
            origin.idle.append(conn)
        else:
            origin.open -= 1
            if conn is not None and not conn.is_closed():
                await conn.aclose()
        origin.wake()

    async def aclose(self) -> None:
        self._closed = True
        for origin in self._origins.values():
            idle, origin.idle = origin.idle, []
            origin.open -= len(idle)
            for conn in idle:
                await conn.aclose()
            while origin.waiting:
                origin.wake()


class _ResponseStream(httpx2.AsyncByteStream):
    """A response body for httpx2; closing it gives the connection back to the pool, once."""

    def __init__(self, body: Body, pool: ConnectionPool, origin: _Origin, conn: Connection) -> None:
        self._body = body
        self._pool, self._origin, self._conn = pool, origin, conn
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with _mapped():
            async for part in self._body:
                yield part

    async def aclose(self) -> None:
        if self._released:
            return
        self._released = True
        try:
            with _mapped():
                await self._body.aclose()
        finally:
            await self._pool._release(self._origin, self._conn)
