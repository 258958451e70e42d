"""`POST /admin/sources/{name}/version`: the ingestion pipeline announces a source's version.

Body `{"version": "<1-128 printable ASCII>"}`. A new value makes older entries unreachable; the
current value again confirms it (entries older than the source's staleness bound serve again, for
one bound); a value the source has moved past is refused with 409 (versions only move forward).
Guarded by the admin API's bearer token check, so with no token configured the route refuses
everything: an admin API is never open by default.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ..tasks.admin import admin_error
from .versions import VersionSuperseded

SetVersion = Callable[[str, str], Awaitable[object]]


def version_endpoint(set_version: SetVersion,
                     unauthorized: Callable[[Request], Response | None]) -> Callable[[Request], Awaitable[Response]]:
    """`unauthorized` is the admin API's token check (`AdminApi.unauthorized`)."""

    async def endpoint(request: Request) -> Response:
        if (refused := unauthorized(request)) is not None:
            return refused
        name = request.path_params["name"]
        try:
            doc: Any = orjson.loads(await request.body())
            version = doc["version"] if isinstance(doc, dict) else None
        except (orjson.JSONDecodeError, KeyError):
            version = None
        if isinstance(version, float) and version.is_integer():  # JSON Schema: 147.0 is an integer
            version = int(version)
        if isinstance(version, int) and not isinstance(version, bool):
            version = str(version)
        if not isinstance(version, str):
            return admin_error(400, "invalid_version", 'body must be {"version": "<string>"}')
        try:
            await set_version(name, version)
        except KeyError:
            return admin_error(404, "source_not_found", f"no upstream named {name!r}")
        except VersionSuperseded as exc:
            return admin_error(409, "version_superseded", str(exc))
        except ValueError as exc:
            return admin_error(400, "invalid_version", str(exc))
        return Response(orjson.dumps({"source": name, "version": version}), media_type="application/json")

    return endpoint
