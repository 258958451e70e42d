"""Serve the demo's apps (its RAG stack, and ragtoll) in background threads on loopback ports,
on the same server `ragtoll serve` uses (proxy/server.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from ...config import ServerConfig
from ...server import free_port, make_server, running


@contextlib.contextmanager
def serve(app: Any, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Yields the base URL once the server accepts connections (and, for ragtoll, once its lifespan
    has started); stops it on exit."""
    port = port or free_port(host)
    settings = getattr(app, "settings", None)  # ragtoll's app brings its own front-door limits
    server_cfg = settings.server if settings is not None else ServerConfig()
    server = make_server(app, dataclasses.replace(server_cfg, host=host, port=port))
    with running(server, host, port, ready=lambda: getattr(app, "pipeline", True) is not None) as url:
        yield url
