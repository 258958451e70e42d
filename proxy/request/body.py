"""The client's request body, read once (whole or as a stream) within the front door's bounds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from ..errors import BodyTooLarge, Overloaded, RequestTimeout
from .buffers import Held
from .exchange import Exchange

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class ClientDisconnected(Exception):
    """The client went away before its body was read (flow control inside the pipeline)."""


class RequestBody:
    """The client's request body: read once, whole or as a stream, by `server.body_timeout_s`
    (RequestTimeout, 408), at most `server.max_body_bytes` (BodyTooLarge, 413).

    The server's receive channel is reached only through this object, and `release()` drops it when
    the call ends: an error's traceback can keep a failed read's frames alive in a reference cycle,
    and while anything holds the channel the server keeps the client's connection open.
    """

    def __init__(self, receive: Receive, headers: dict[str, str], limit: int, deadline: float,
                 held: Held | None = None) -> None:
        self._receive: Receive | None = receive
        self._headers = headers
        self._limit = limit
        self._deadline = deadline
        self._held = held or Held(None)  # a body read whole is held against the process-wide bound

    def release(self) -> None:
        self._receive = None
        self._held.release()

    async def read(self) -> bytes:
        """The whole body; Overloaded (503) when holding it would pass `server.max_inspect_total_bytes`."""
        self.check_declared_length()
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self._next()
            chunk = message.get("body", b"")
            size += len(chunk)
            self._check_size(size)
            if not self._held.take(len(chunk)):
                limit = self._held.pool.limit if self._held.pool is not None else 0
                raise Overloaded(f"ragtoll holds server.max_inspect_total_bytes ({limit} bytes) of bodies for "
                                 "inspection already; retry shortly", limit=limit)
            parts.append(chunk)
            if not message.get("more_body", False):
                return parts[0] if len(parts) == 1 else b"".join(parts)

    async def stream(self, ex: Exchange, on_done: Callable[[], None]) -> AsyncIterator[bytes]:
        """The body as it arrives, for the upstream. A failure is kept in `ex.body_error`, since the
        upstream client reports it only as a broken exchange."""
        size = 0
        try:
            while True:
                message = await self._next()
                chunk = message.get("body", b"")
                size += len(chunk)
                self._check_size(size)
                if chunk:
                    yield chunk
                if not message.get("more_body", False):
                    on_done()
                    return
        except (ClientDisconnected, BodyTooLarge, RequestTimeout) as exc:
            ex.body_error = exc
            raise

    def check_declared_length(self) -> None:
        declared = self._headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._limit:
            raise BodyTooLarge(f"request body exceeds {self._limit} bytes (server.max_body_bytes)", limit=self._limit)

    def _check_size(self, size: int) -> None:
        if size > self._limit:
            raise BodyTooLarge(f"request body exceeds {self._limit} bytes (server.max_body_bytes)", limit=self._limit)

    def watch_disconnect(self, ex: Exchange) -> None:
        """Cancel the current task if the client goes away while the upstream is still working.

        Only once the body is consumed. The server also answers `http.disconnect` once the response
        is complete, so a finished exchange (`ex.complete`) is never cancelled.
        """
        handler = asyncio.current_task()

        async def watch() -> None:
            while self._receive is not None and (await self._receive())["type"] != "http.disconnect":
                pass  # an unread empty request body
            if handler is None or handler.done() or ex.complete:
                return
            ex.outcome = "client_disconnect"
            handler.cancel()

        ex.watcher = asyncio.get_running_loop().create_task(watch())

    async def _next(self) -> MutableMapping[str, Any]:
        if self._receive is None:
            raise ClientDisconnected()  # the call has ended
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise RequestTimeout("the request body did not arrive within server.body_timeout_s") from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        return message
