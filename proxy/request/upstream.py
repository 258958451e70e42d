"""The upstream side: the one HTTP client, its transports per origin, and every client error mapped.

The only module that speaks HTTP to upstreams. One `httpx2.AsyncClient` (httpx's API; the fork
the OpenAI SDK uses) is made in the app's lifespan. Under it each upstream origin has its engine:
aiohttp's client through httpx-aiohttp for HTTP/1.1 (the fastest candidate measured in
bench/bench_proxy.py), or httpx2's own transport (httpcore2 + h2) for an upstream with `http2: true`,
which aiohttp cannot speak.

Trace context is set here, per request: toward an upstream marked trusted, the current span's (the
call span's) through the configured propagators; toward any other, none (the caller's traceparent,
tracestate and baggage are removed too). The exchange has no span of its own: the call span already
times it and holds its status, and opentelemetry-instrumentation-httpx's span cost a span and a
header normalisation per call (bench/bench_tail.py, docs/performance.md).

TLS (a private CA, a client certificate for mTLS), connection limits and an optional outbound
proxy are per upstream (config.UpstreamConfig). Engine exceptions, including those raised while a
body streams, become ragtoll's UpstreamTimeout / UpstreamUnavailable here and nowhere else.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

# aiohttp's C response parser (llhttp; 3.13 and 3.14 measured) leaves a body read waiting forever
# when a chunked body turns malformed midway: the parse error reaches the connection, not the body
# being read, and the read timer is dropped with it (the garbage-mid-body case of
# tests/reliability/test_upstream_faults.py). Its pure-Python parser raises at once. aiohttp's
# documented switch picks the parser when aiohttp is first imported; the cost, measured in
# bench/bench_proxy.py, is in docs/performance.md. If something imported aiohttp before ragtoll, `PARSER`
# says which parser is in use.
os.environ.setdefault("AIOHTTP_NO_EXTENSIONS", "1")
import aiohttp
import httpx2 as httpx
from aiohttp.http_exceptions import HttpProcessingError
from httpx_aiohttp.httpx2 import AiohttpTransport
from opentelemetry import propagate

from ..config import Timeouts, TlsConfig, UpstreamConfig
from ..errors import BadRequest, UpstreamError, UpstreamTimeout, UpstreamUnavailable

PARSER = "python" if aiohttp.helpers.NO_EXTENSIONS else "c"
# Trace context leaves ragtoll only toward trusted upstreams; baggage never toward others.
_CONTEXT_HEADERS = frozenset({b"traceparent", b"tracestate", b"baggage"})
# A request target goes out as it came in; anything that could end the request line early is refused.
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f]")
# Response heads up to 64 KiB per line (aiohttp's default, 8 KiB, refuses some large cookies and links).
_MAX_HEAD_LINE = 65536


def with_trace_context(headers: list[tuple[bytes, bytes]], trusted: bool) -> list[tuple[bytes, bytes]]:
    """`headers` as they go to an upstream: toward a trusted one, the current context injected by the
    global propagators (W3C trace context and baggage unless OTEL_PROPAGATORS says otherwise), which
    replaces what the caller sent under those names; toward any other, no trace context at all."""
    if not trusted:
        return [(k, v) for k, v in headers if k.lower() not in _CONTEXT_HEADERS]
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return headers
    names = {k.lower().encode("latin-1") for k in carrier}
    return [(k, v) for k, v in headers if k.lower() not in names] + [
        (k.encode("latin-1"), v.encode("latin-1")) for k, v in carrier.items()]


def ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """The client TLS context: the system's CAs, or only `ca_file`'s; a client certificate for mTLS."""
    ctx = ssl.create_default_context(cafile=tls.ca_file)
    if tls.cert_file is not None:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if not tls.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _engine(up: UpstreamConfig) -> httpx.AsyncBaseTransport:
    tls = ssl_context(up.tls) if up.url.startswith("https://") else None
    if up.engine == "httpx":
        return httpx.AsyncHTTPTransport(
            verify=tls or True, http1=True, http2=True, trust_env=False,
            limits=httpx.Limits(max_connections=up.limits.max_connections,
                                max_keepalive_connections=up.limits.max_keepalive_connections,
                                keepalive_expiry=up.limits.keepalive_s),
        )

    def session() -> aiohttp.ClientSession:  # made on first use, inside the event loop
        connector = aiohttp.TCPConnector(ssl=tls if tls is not None else True, limit=up.limits.max_connections,
                                         keepalive_timeout=up.limits.keepalive_s)
        return aiohttp.ClientSession(
            connector=connector,
            # Forward the caller's headers unchanged: no User-Agent, Accept or Accept-Encoding of
            # aiohttp's own (an added Accept-Encoding would bring compressed answers nobody asked for).
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            auto_decompress=False,  # the client gets the upstream's bytes, compressed or not
            cookie_jar=aiohttp.DummyCookieJar(),  # never carry one caller's Set-Cookie to another
            trust_env=False,  # proxy variables are not read; `proxy:` is explicit
            max_line_size=_MAX_HEAD_LINE, max_field_size=_MAX_HEAD_LINE,
        )

    return AiohttpTransport(client=session, proxy=httpx.Proxy(up.proxy) if up.proxy else None)


class UpstreamClient:
    """Owns the client; made in the app lifespan and closed there (`aclose`)."""

    def __init__(self, upstreams: Sequence[UpstreamConfig]) -> None:
        mounts: dict[str, httpx.AsyncBaseTransport] = {}
        for up in upstreams:
            key = up.origin + "/"
            if key not in mounts:  # config.validate made upstreams of one origin agree on its transport
                mounts[key] = _engine(up)
        self._client = httpx.AsyncClient(mounts=mounts, trust_env=False, follow_redirects=False, timeout=None)
        # Forward the caller's headers unchanged: no client defaults added.
        for name in ("user-agent", "accept", "accept-encoding", "connection"):
            del self._client.headers[name]
        self._urls: dict[tuple[str, str], httpx.URL] = {}  # parsed once per (upstream, path + query)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(
        self,
        upstream: UpstreamConfig,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes],
        *,
        timeouts: Timeouts,
    ) -> UpstreamResponse:
        """Start the exchange and return once the response head arrives.

        `headers` must carry no framing (content-length, transfer-encoding): the body's is set
        here, exactly one of them. Trace context is the current span's, and goes only to a trusted
        upstream (`with_trace_context`). The caller owns the returned response and must `aclose()`
        it (also on cancellation).
        """
        if _BAD_TARGET.search(target.encode("latin-1", "replace")):
            raise BadRequest("the request target holds a control character or space")
        timeout = {"connect": timeouts.connect, "read": timeouts.read, "write": timeouts.write, "pool": timeouts.pool}
        with _mapped(upstream.name):
            # A Request made directly, not by build_request: the client has no base URL, default
            # headers or cookies to merge, and the URL of a path seen before is not parsed again.
            # httpx frames `body`: content-length for bytes, chunked for a stream.
            request = httpx.Request(method, self._url(upstream.url, target),
                                    headers=with_trace_context(headers, upstream.trusted), content=body,
                                    extensions={"timeout": timeout})
            response = await self._client.send(request, stream=True)
        return UpstreamResponse(response, upstream.name)

    async def fetch(self, upstream: UpstreamConfig, method: str, target: str, headers: list[tuple[bytes, bytes]],
                    body: bytes, *, timeouts: Timeouts) -> tuple[int, bytes, Mapping[str, str]]:
        """One whole exchange for ragtoll's own calls to an upstream (a version probe, an audit, an
        embedding, an authz check): status, body and headers, the response closed."""
        response = await self.send(upstream, method, target, headers, body, timeouts=timeouts)
        try:
            parts = [chunk async for chunk in response.chunks()]
            return response.status, b"".join(parts), response.headers
        finally:
            await response.aclose()

    def _url(self, base: str, target: str) -> httpx.URL:
        url = self._urls.get((base, target))
        if url is None:
            url = httpx.URL(base.rstrip("/") + target)
            if len(self._urls) >= _MAX_URLS:
                self._urls.clear()  # bounded: ids in paths make targets unbounded; a refill costs only parsing
            self._urls[(base, target)] = url
        return url


_MAX_URLS = 4096


class UpstreamResponse:
    """A streaming upstream response; raw (still compressed) bytes, errors mapped."""

    def __init__(self, response: httpx.Response, upstream: str) -> None:
        self._response = response
        self._upstream = upstream
        self.status = response.status_code
        self.raw_headers: list[tuple[bytes, bytes]] = response.headers.raw
        self.headers: Mapping[str, str] = response.headers

    async def chunks(self) -> AsyncIterator[bytes]:
        with _mapped(self._upstream):
            async for chunk in self._response.aiter_raw():
                yield chunk

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._response.aclose()


@contextlib.contextmanager
def _mapped(upstream: str) -> Iterator[None]:
    """Engine errors as ragtoll errors. httpx-aiohttp re-raises aiohttp's errors as httpx ones with
    the original as the cause, and files a dropped connection under ConnectTimeout, so the cause
    decides when there is one."""
    try:
        yield
    except (httpx.HTTPError, aiohttp.ClientError, HttpProcessingError, TimeoutError) as exc:
        raise _translate(exc, upstream) from exc


def _translate(exc: BaseException, upstream: str) -> UpstreamError:
    cause: Any = exc.__cause__ if isinstance(exc.__cause__, aiohttp.ClientError | TimeoutError) else exc
    if isinstance(cause, HttpProcessingError):  # the upstream's bytes are not HTTP
        return UpstreamUnavailable(f"upstream {upstream!r} sent a malformed response ({cause.message})",
                                   upstream=upstream)
    what = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    if isinstance(cause, httpx.TimeoutException | TimeoutError):  # aiohttp's timeouts are TimeoutErrors
        return UpstreamTimeout(f"upstream {upstream!r} timed out ({type(cause).__name__})", upstream=upstream)
    if isinstance(cause, httpx.TransportError | aiohttp.ClientError):
        return UpstreamUnavailable(f"upstream {upstream!r} is unavailable ({what})", upstream=upstream)
    return UpstreamError(f"upstream {upstream!r} failed ({what})", upstream=upstream)
