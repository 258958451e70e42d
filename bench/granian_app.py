"""Serve an app (module:attribute, or module:factory() to call one) on granian's embedded server, as
ragtoll serves itself: `python granian_app.py floor_app:app PORT [asgi|rsgi|rsgi-adapter]` (one
process, uvloop, HTTP/1.1, ragtoll's front-door settings from proxy/server.py). `rsgi-adapter`
serves an ASGI app on granian's RSGI interface through asgi_on_rsgi.py (an experiment)."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import uvloop
from asgi_on_rsgi import RsgiApp
from granian.asgi import LifespanProtocol
from granian.constants import Interfaces
from ragtoll.proxy.config import ServerConfig
from ragtoll.proxy.server import serve


async def adapted(app: Any, cfg: ServerConfig) -> None:
    """`app` through the adapter, its lifespan around the server (granian runs none for RSGI)."""
    lifespan = LifespanProtocol(app)
    await lifespan.startup()
    if lifespan.interrupt:
        raise RuntimeError("the app did not start") from lifespan.exc
    try:
        await serve(RsgiApp(app, lifespan.state, cfg.max_body_bytes), cfg, interface=Interfaces.RSGI)
    finally:
        await lifespan.shutdown()


if __name__ == "__main__":
    module, _, attribute = sys.argv[1].partition(":")
    app = getattr(importlib.import_module(module), attribute.removesuffix("()"))
    if attribute.endswith("()"):
        app = app()
    mode = (sys.argv[3:] or ["asgi"])[0]
    cfg = ServerConfig(host="127.0.0.1", port=int(sys.argv[2]))
    if mode == "rsgi-adapter":
        uvloop.run(adapted(app, cfg))
    else:
        uvloop.run(serve(app, cfg, interface=Interfaces.RSGI if mode == "rsgi" else Interfaces.ASGI))
