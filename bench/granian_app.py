"""Serve an app (module:attribute) on granian's embedded server, as ragtoll serves itself:
`python granian_app.py floor_app:app PORT [asgi|rsgi]` (one process, uvloop, HTTP/1.1, ragtoll's
front-door settings from proxy/server.py on either interface)."""

from __future__ import annotations

import importlib
import sys

import uvloop
from granian.constants import Interfaces
from ragtoll.proxy.config import ServerConfig
from ragtoll.proxy.server import serve

if __name__ == "__main__":
    module, _, attribute = sys.argv[1].partition(":")
    app = getattr(importlib.import_module(module), attribute)
    interface = Interfaces.RSGI if sys.argv[3:] == ["rsgi"] else Interfaces.ASGI
    uvloop.run(serve(app, ServerConfig(host="127.0.0.1", port=int(sys.argv[2])), interface=interface))
