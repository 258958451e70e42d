"""The two chores every fake ASGI server in the tests shares: answering lifespan, reading a body."""

from __future__ import annotations

from typing import Any


async def serve_lifespan(receive: Any, send: Any) -> None:
    """Acknowledge lifespan startup and shutdown; returns after shutdown."""
    while True:
        msg = await receive()
        await send({"type": msg["type"] + ".complete"})
        if msg["type"] == "lifespan.shutdown":
            return


async def read_body(receive: Any) -> bytes | None:
    """The whole request body, or None if the client went away first."""
    body = b""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body
