"""Run ASGI apps in a background thread on a free loopback port (httpx's serve_in_thread): ragtoll's
app on the server `ragtoll serve` uses (proxy/server.py, granian), other apps under uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
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

    ragtoll's app is served as `ragtoll serve` runs it (granian, with its `server:` limits). Other
    apps get uvicorn with httptools."""
    from ragtoll.proxy.app import RagtollApp

    if isinstance(app, RagtollApp) and http is None:
        with serve_ragtoll_in_thread(app) as url:
            yield url
        return
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", lifespan=lifespan,
                            http=http or "httptools", loop="asyncio", timeout_graceful_shutdown=2,
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


@contextlib.contextmanager
def serve_ragtoll_in_thread(app: Any) -> Iterator[str]:
    """ragtoll's app on its own server (granian embedded, as `ragtoll serve`), in a thread with its own loop."""
    from ragtoll.proxy.server import make_server

    port = free_port()
    server = make_server(app, dataclasses.replace(app.settings.server, host="127.0.0.1", port=port))
    loop = asyncio.new_event_loop()
    failed: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            failed.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while True:
        if failed or not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"ragtoll test server failed to start: {failed}")
        if app.pipeline is not None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                pass
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(server.stop)
        thread.join(timeout=15)
