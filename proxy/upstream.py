"""The upstream side: one pooled HTTP client, trust-aware propagation, and error mapping.

The only module that uses the HTTP client (`httpx2`, the API-compatible httpx fork the OpenAI SDK
uses; it measured about half httpx's CPU per proxied call, see bench/); under it, each origin's
transport is pool.py's connection pool on netio's sockets. Every client exception is mapped to a
ragtoll error here, also while a response body streams.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx2 as httpx
from opentelemetry.instrumentation.httpx import AsyncOpenTelemetryTransportHttpx2
from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
from opentelemetry.trace import TracerProvider

from .config import Timeouts, UpstreamConfig
from .errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from .pool import DROP_HEADERS, ConnectionPool

# Trace context leaves ragtoll only toward trusted upstreams; baggage never toward others. The pool
# drops them from the request as it goes out, so this also removes what the OTel transport injected.
_CONTEXT_HEADERS = frozenset({b"traceparent", b"tracestate", b"baggage"})


def _origin(url: str) -> str:
    u = httpx.URL(url)
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}"


class UpstreamClient:
    """Owns the pooled client; made in the app lifespan and closed there.

    Each upstream origin gets its own connection pool (its `limits`), all behind one client.
    """

    def __init__(
        self,
        upstreams: Sequence[UpstreamConfig],
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        mounts: dict[str, httpx.AsyncBaseTransport] = {}
        for up in upstreams:
            origin = _origin(up.url)
            if origin in mounts:
                continue
            limits = httpx.Limits(
                max_connections=up.limits.max_connections,
                max_keepalive_connections=up.limits.max_keepalive_connections,
            )
            # The instrumentation's own http.client.* metrics are off: they repeat what
            # gen_ai.client.operation.duration and ragtoll.proxy.overhead record, at a cost per call.
            mounts[origin + "/"] = AsyncOpenTelemetryTransportHttpx2(
                ConnectionPool(limits), tracer_provider=tracer_provider, meter_provider=NoOpMeterProvider()
            )
        # Never remember cookies: a proxy must not carry one caller's Set-Cookie to another.
        jar = CookieJar(policy=DefaultCookiePolicy(allowed_domains=[]))
        self._client = httpx.AsyncClient(
            mounts=mounts, cookies=jar, trust_env=False, follow_redirects=False, timeout=None
        )
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
        """Start the exchange and return once response headers arrive.

        The caller owns the returned response and must `aclose()` it (also on cancellation).
        """
        timeout = {"connect": timeouts.connect, "read": timeouts.read, "write": timeouts.write, "pool": timeouts.pool}
        with _mapped(upstream.name):
            # A Request made directly, not by build_request: the client has no base URL, default
            # headers or cookies to merge, and the URL of a path seen before is not parsed again.
            request = httpx.Request(method, self._url(upstream.url, target), headers=headers, content=body,
                                    extensions={"timeout": timeout, DROP_HEADERS: None if upstream.trusted
                                                else _CONTEXT_HEADERS})
            response = await self._client.send(request, stream=True)
        return UpstreamResponse(response, upstream.name)


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
    try:
        yield
    except httpx.TimeoutException as exc:
        raise UpstreamTimeout(
            f"upstream {upstream!r} timed out ({type(exc).__name__})", upstream=upstream
        ) from exc
    except (httpx.ConnectError, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
        raise UpstreamUnavailable(
            f"upstream {upstream!r} is unavailable ({type(exc).__name__}: {exc})", upstream=upstream
        ) from exc
    except httpx.HTTPError as exc:
        raise UpstreamError(f"upstream {upstream!r} failed ({type(exc).__name__}: {exc})", upstream=upstream) from exc
