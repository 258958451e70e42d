"""ragtoll's app as `ragtoll serve` builds it, for uvicorn (`uvicorn --factory ragtoll_uvicorn:app`):
the bench compares the server ragtoll ships with (granian) against uvicorn on the same app."""

from __future__ import annotations

import os
from typing import Any

from ragtoll.proxy import config
from ragtoll.proxy.cli import served_app


def app() -> Any:
    return served_app(config.load(os.environ))[0]
