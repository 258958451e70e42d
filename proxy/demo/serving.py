"""Serve an ASGI app with uvicorn in a background thread on a loopback port (uvicorn lives here only)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import uvicorn


class _ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # not the main thread: Ctrl-C stays with the CLI
        pass


@contextlib.contextmanager
def serve(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, lifespan: Literal["auto", "on", "off"] = "auto"
) -> Iterator[str]:
    """Yields the base URL once the server accepts connections; stops it (gracefully) on exit."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="error",
        lifespan=lifespan,
        access_log=False,
        loop="asyncio",
        timeout_graceful_shutdown=2,
        server_header=False,
        date_header=False,
    )
    server = _ThreadServer(config)
    thread = threading.Thread(target=server.run, name="ragtoll-demo-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the demo could not start a server on {host}:{port}")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
