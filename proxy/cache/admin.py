"""`POST /admin/sources/{name}/version`: the ingestion pipeline announces a new source version.

Body `{"version": "<1-128 printable ASCII>"}`; bearer token from `admin.token_env`/`token_file`.
With no token configured the route refuses everything (403): an admin API is never open by default.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

SetVersion = Callable[[str, str], Awaitable[None]]


def version_endpoint(set_version: SetVersion, token: str | None) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        given = request.headers.get("authorization", "")
        if not token:
            return _error(403, "admin_disabled", "no admin token is configured (admin.token_env)")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _error(401, "admin_unauthorized", "a valid admin bearer token is required")
        name = request.path_params["name"]
        try:
            doc: Any = orjson.loads(await request.body())
            version = doc["version"] if isinstance(doc, dict) else None
        except (orjson.JSONDecodeError, KeyError):
            version = None
        if isinstance(version, int) and not isinstance(version, bool):
            version = str(version)
        if not isinstance(version, str):
            return _error(400, "invalid_version", 'body must be {"version": "<string>"}')
        try:
            await set_version(name, version)
        except KeyError:
            return _error(404, "source_not_found", f"no upstream named {name!r}")
        except ValueError as exc:
            return _error(400, "invalid_version", str(exc))
        return Response(orjson.dumps({"source": name, "version": version}), media_type="application/json")

    return endpoint


def _error(status: int, code: str, message: str) -> Response:
    return Response(orjson.dumps({"error": {"type": "admin_error", "code": code, "message": message}}),
                    status_code=status, media_type="application/json")
