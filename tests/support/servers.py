"""Run ASGI apps under uvicorn in a background thread on a free loopback port (httpx's serve_in_thread)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


class ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # not the main thread
        pass


@contextlib.contextmanager
def serve_in_thread(app: Any, *, lifespan: str = "on", http: Any = None) -> Iterator[str]:
    """Serve `app` on 127.0.0.1:<free port>; yields the base URL; stops the server on exit.

    ragtoll's app is served as `ragtoll serve` runs it: on ragtoll's HTTP protocol (its response
    writes held for the turn), with no `server`/`date` headers of uvicorn's own, so a proxied
    response carries exactly the upstream's headers plus ragtoll's. Other apps get httptools."""
    if http is None:
        from ragtoll.proxy.app import RagtollApp
        from ragtoll.proxy.server import http_protocol

        http = http_protocol() if isinstance(app, RagtollApp) else "httptools"
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan=lifespan,
                            http=http, loop="asyncio", timeout_graceful_shutdown=2,
                            server_header=False, date_header=False)
    server = ThreadServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("test server failed to start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
