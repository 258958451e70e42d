"""The floor of this stack: a bare Starlette + httpx(2) streaming pass-through, no tracing, no logic.

FLOOR_CLIENT=httpx|httpx2 picks the client; FLOOR_UPSTREAM is the upstream base URL.
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

http = importlib.import_module(os.environ.get("FLOOR_CLIENT", "httpx"))
UPSTREAM = os.environ["FLOOR_UPSTREAM"]
HOP = {"connection", "keep-alive", "transfer-encoding", "host", "te", "upgrade", "trailer"}
state: dict[str, Any] = {}


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    state["client"] = http.AsyncClient(base_url=UPSTREAM, timeout=30)
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
