"""The floor of this stack: a bare Starlette streaming pass-through, no tracing, no logic.

FLOOR_CLIENT picks the client: httpx | httpx2 (their own transports) | httpx+aiohttp |
httpx2+aiohttp (httpx-aiohttp's AiohttpTransport under the httpx API); FLOOR_UPSTREAM is the
upstream base URL.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

CLIENT = os.environ.get("FLOOR_CLIENT", "httpx")
MODULE, _, ENGINE = CLIENT.partition("+")
http = importlib.import_module(MODULE)
UPSTREAM = os.environ["FLOOR_UPSTREAM"]
HOP = {"connection", "keep-alive", "transfer-encoding", "host", "te", "upgrade", "trailer"}
state: dict[str, Any] = {}


def transport_options() -> dict[str, Any]:
    if ENGINE != "aiohttp":
        return {}
    transports = importlib.import_module("httpx_aiohttp" if MODULE == "httpx" else "httpx_aiohttp.httpx2")
    return {"transport": transports.AiohttpTransport()}


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    state["client"] = http.AsyncClient(base_url=UPSTREAM, timeout=30, **transport_options())
    yield
    await state["client"].aclose()


async def forward(request: Request) -> StreamingResponse:
    client = state["client"]
    headers = [(k, v) for k, v in request.headers.raw if k.decode().lower() not in HOP]
    req = client.build_request(request.method, request.url.path.removeprefix("/p"), headers=headers,
                               content=await request.body())
    resp = await client.send(req, stream=True)
    out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
    return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=out,
                             background=BackgroundTask(resp.aclose))


app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])], lifespan=lifespan)
