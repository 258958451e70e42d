"""How ragtoll is served: granian's embedded HTTP/1.1 server (hyper) running the ASGI app on this loop.

Granian, not uvicorn, because the front door needs what uvicorn has no public setting for: hyper
closes a connection whose request head has not fully arrived within `server.header_timeout_s`
(uvicorn's only timer is the keep-alive one, which every received byte resets), drops the trailers
of a chunked request instead of adding them to the request's headers, answers a head that carries
both Content-Length and Transfer-Encoding by the chunked framing and closes the connection, and its
`backpressure` bounds the connections served at once (the rest wait in the listen backlog). What
granian has no setting for, one address's share of those connections, gate.py keeps at the socket.
The body read timeout is the app's (app.py), since only it knows when a body is still wanted.
Measured against uvicorn in bench/bench_proxy.py (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server
from prometheus_client import start_http_server

from .config import ServerConfig
from .gate import ConnectionGate, share_of

# Granian logs "Embedded server is experimental!" on every start; ragtoll pins the release it
# is tested with (pyproject) and says what it serves with itself.
logging.getLogger("_granian").setLevel(logging.ERROR)
_BACKLOG = 1024  # connections past `server.max_connections` wait here, in the kernel


def make_server(app: Any, cfg: ServerConfig, *, port: int | None = None, interface: Interfaces = Interfaces.ASGI
                ) -> Server:
    """A granian server for `app` with the front-door limits of `cfg` (not started). ragtoll is an
    ASGI app (its lifespan makes and closes its resources); bench/ also serves RSGI floors with it."""
    return Server(
        app,
        address=cfg.host,
        port=cfg.port if port is None else port,
        interface=interface,
        http=HTTPModes.http1,
        websockets=False,
        backlog=_BACKLOG,
        backpressure=cfg.max_connections,
        http1_settings=HTTP1Settings(header_read_timeout=round(cfg.header_timeout_s * 1000), keep_alive=True),
        log_enabled=cfg.access_log,
        log_access=cfg.access_log,
    )


def raise_open_files_limit(needed: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard one so `needed` descriptors fit; returns the soft limit.

    Each client connection and each upstream connection holds a descriptor; with the usual soft
    limit of 1024, a bound of 1024 client connections alone would exhaust it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return int(soft)


_M_MMAP_THRESHOLD = -3  # glibc mallopt(3)
_MMAP_FROM = 256 * 1024


def return_big_buffers() -> bool:
    """Have glibc serve every allocation of 256 KB or more by mmap, so a big body's memory goes back
    to the system when it is freed; True if set. By default glibc raises that threshold up to 32 MB
    after the first big free, and 7 MB answers then came from the heap and kept it grown (issue 30:
    863 MB held after 100 of them had ended). A no-op off glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        return bool(ctypes.CDLL(name).mallopt(_M_MMAP_THRESHOLD, _MMAP_FROM))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False


def check_bindable(host: str, port: int) -> None:
    """Raise OSError (its strerror says why) if `host:port` cannot be listened on: granian reports a
    taken port as a RuntimeError from its socket layer, so ragtoll asks the OS first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


async def serve(app: Any, cfg: ServerConfig, *, on_signal: Callable[[], None] | None = None,
                interface: Interfaces = Interfaces.ASGI) -> None:
    """Serve `app` until SIGTERM or SIGINT. `on_signal` runs first (the app stops taking new calls).
    OSError if the address cannot be listened on (nothing is started then)."""
    check_bindable(cfg.host, cfg.port)
    return_big_buffers()
    gate = ConnectionGate(cfg.port, share_of(cfg.max_connections, cfg.max_connections_per_address))
    # the gate learns which peers are mid-request from ASGI calls; an RSGI app (bench/'s floors) is
    # served unwrapped, the gate still bounding its connections per address
    server = make_server(gate.watch(app) if interface == Interfaces.ASGI else app, cfg, interface=interface)
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if on_signal is not None:
            on_signal()
        server.stop()  # type: ignore[no-untyped-call]  # granian ships no annotations here

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    try:
        async with gate.running():
            await server.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


@contextlib.contextmanager
def metrics_listener(registry: Any, host: str, port: int) -> Iterator[str]:
    """Serves `registry` (GET /metrics, Prometheus or OpenMetrics text by the scraper's Accept) on
    `host:port` until the block ends: prometheus_client's own HTTP server, on a thread, apart from
    the proxy's server, so a scraper can reach it where the proxy listens on loopback (a sidecar).
    OSError if the address cannot be listened on."""
    check_bindable(host, port)
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    try:
        yield f"http://{host}:{port}/metrics"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the demo's and the tests' servers; racy by nature, so loopback only)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(server: Server, host: str, port: int, *, ready: Callable[[], bool] = lambda: True) -> Iterator[str]:
    """Run `server` on its own event loop in a background thread; yields its base URL once it
    accepts connections and `ready()` holds (ragtoll: its lifespan has started); stops it on exit."""
    loop = asyncio.new_event_loop()
    failed: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.serve())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            failed.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=run, name=f"ragtoll-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while True:
        if failed or not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"could not start a server on {host}:{port}: {failed[0] if failed else 'timed out'}")
        if ready():
            try:
                socket.create_connection((host, port), timeout=0.2).close()
                break
            except OSError:
                pass
        time.sleep(0.01)
    try:
        yield f"http://{host}:{port}"
    finally:
        loop.call_soon_threadsafe(server.stop)
        thread.join(timeout=15)
