"""Run ASGI apps in a background thread on a free loopback port (httpx's serve_in_thread): ragtoll's
app on the server `ragtoll serve` uses (proxy/server.py, granian), other apps under uvicorn."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn
from ragtoll.proxy.server import free_port, make_server, running


class ThreadServer(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # not the main thread
        pass


@contextlib.contextmanager
def serve_in_thread(app: Any, *, lifespan: str = "on", http: Any = None, **options: Any) -> Iterator[str]:
    """Serve `app` on 127.0.0.1:<free port>; yields the base URL; stops the server on exit.

    ragtoll's app is served as `ragtoll serve` runs it (granian, with its `server:` limits). Other
    apps get uvicorn with httptools (`options` go to uvicorn.Config: ssl_certfile, ...)."""
    from ragtoll.proxy.app import RagtollApp

    if isinstance(app, RagtollApp) and http is None:
        with serve_ragtoll_in_thread(app) as url:
            yield url
        return
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan=lifespan,
                            http=http or "httptools", loop="asyncio", timeout_graceful_shutdown=2,
                            server_header=False, date_header=False, **options)
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




@contextlib.contextmanager
def serve_ragtoll_in_thread(app: Any) -> Iterator[str]:
    """ragtoll's app on its own server (granian embedded, as `ragtoll serve`), in a thread with its own loop."""
    port = free_port()
    server = make_server(app, dataclasses.replace(app.settings.server, host="127.0.0.1", port=port))
    with running(server, "127.0.0.1", port, ready=lambda: app.pipeline is not None) as url:
        yield url


@contextlib.contextmanager
def serve_granian_in_thread(app: Any, **options: Any) -> Iterator[str]:
    """Any ASGI app on granian's embedded server (HTTP/1.1 and HTTP/2; `options`: ssl_cert, ssl_key, ...)."""
    from granian.constants import Interfaces
    from granian.server.embed import Server

    port = free_port()
    server = Server(app, address="127.0.0.1", port=port, interface=Interfaces.ASGI, websockets=False,
                    log_enabled=False, ssl_protocol_min="tls1.2", **options)
    with running(server, "127.0.0.1", port) as url:
        yield url
