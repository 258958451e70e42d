"""The floor pass-through of floor_app.py on granian's RSGI interface instead of ASGI: the same client
(FLOOR_CLIENT) and upstream (FLOOR_UPSTREAM), no Starlette (RSGI has no framework layer), so it shows
what the server interface itself costs. Served by `python granian_app.py floor_rsgi:app PORT rsgi`."""

from __future__ import annotations

from typing import Any

from floor_app import HOP, UPSTREAM, http, transport_options


class Floor:
    def __init__(self) -> None:
        self.client: Any = None

    def __rsgi_init__(self, loop: Any) -> None:
        # made once the worker's loop exists; left to the process's exit, as the benchmark stops it
        self.client = http.AsyncClient(base_url=UPSTREAM, timeout=30, **transport_options())

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        body = await proto()
        headers = [(k, v) for k, v in scope.headers.items() if k.lower() not in HOP]
        req = self.client.build_request(scope.method, scope.path.removeprefix("/p"), headers=headers, content=body)
        resp = await self.client.send(req, stream=True)
        try:
            out = [(k, v) for k, v in resp.headers.items() if k.lower() not in HOP]
            transport = proto.response_stream(resp.status_code, out)
            async for chunk in resp.aiter_raw():
                await transport.send_bytes(chunk)
        finally:
            await resp.aclose()


app = Floor()
