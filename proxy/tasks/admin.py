"""The admin API under /admin: read a task's ledger, end a task with an outcome, announce a source's
version (the evidence cache's freshness), the OpenAPI text.

Every route but /admin/openapi.json needs `Authorization: Bearer <token>`, the token coming from
the file `admin.token_file` or the variable `admin.token_env`; with neither set the API refuses
everything (secure by default). Tokens are compared in constant time. Errors are JSON.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
import xxhash
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..cache.versions import VersionSuperseded
from ..config import DIMENSIONS, Settings
from ..core import budget as bm
from ..model import TASK_ID_PATTERN
from ..secrets import admin_token
from .records import TaskEnder, _iso

MAX_BODY = 4096
MAX_REMEMBERED_ENDED = 100_000  # task ids that may still get a late outcome on this replica
SetVersion = Callable[[str, str], Awaitable[object]]


def _id_hash(task_id: str) -> int:
    return xxhash.xxh3_64_intdigest(task_id.encode("utf-8", "surrogatepass"))


def _json(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def admin_error(status: int, code: str, message: str) -> Response:
    """The JSON error body of every admin route."""
    return _json({"error": {"type": "admin_error", "code": code, "message": message}}, status)


def ledger_view(ledger: bm.Ledger, settings: Settings, now_ms: int) -> dict[str, Any]:
    """A task's ledger as JSON: use, the profile's limits and what is left, in user units."""
    profile = settings.budgets.profiles.get(ledger.profile)
    limits = bm.to_units(profile.limits()) if profile else {}
    c = ledger.counters
    used: dict[str, float] = {k: c.get(k, 0) for k in ("steps", "calls", "retrieval_calls", "unique_queries", "rerank_calls",
                                     "context_tokens", "completion_tokens", "cache_hits")}
    used["cost_usd"] = round(bm.usd(c.get("cost_nusd", 0)), 9)
    used["stalled_retrievals"] = c.get("stalled", 0)
    used["fruitless_retrievals"] = c.get("fruitless", 0)
    used["finished_by_ragtoll"] = c.get("finished", 0)
    used["elapsed_ms"] = max(0, now_ms - ledger.started_ms) if ledger.started_ms else 0
    return {
        "task_id": ledger.task_id, "profile": ledger.profile, "class": ledger.cls or None,
        "started_at": _iso(ledger.started_ms), "last_call_at": _iso(ledger.last_ms),
        "used": used,
        "limits": {d: (bm.usd(v) if d == "max_cost_usd" else v) for d, v in limits.items()},
        "remaining": bm.remaining(limits, ledger, None, now_ms),
        "rejections": dict(ledger.rejections), "would_reject": dict(ledger.shadow_rejections),
        "exhausted": ledger.exhausted, "in_flight": c.get("inflight", 0), "chunks_seen": ledger.chunks_seen,
    }


class AdminApi:
    """Routes bound to the app's live store and ender (both set in the lifespan)."""

    def __init__(self, settings: Settings, env: Mapping[str, str], wall_ms: Callable[[], int] | None = None) -> None:
        """`env`: where the token named by `admin.token_env` is read (the app's)."""
        self.settings = settings
        self._token = admin_token(settings, env)
        self._ender: TaskEnder | None = None
        # 64-bit hashes of the task ids recently ended here, for late outcomes: ~70 bytes each at
        # the bound instead of ~190 for the id strings (ids are caller-chosen and can be long)
        self._ended: dict[int, None] = {}
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        # the evidence cache's `set_source_version` while it serves (set in the app's lifespan)
        self.set_source_version: SetVersion | None = None

    @property
    def ender(self) -> TaskEnder | None:
        return self._ender

    @ender.setter
    def ender(self, ender: TaskEnder | None) -> None:
        self._ender = ender
        if ender is not None:
            ender.listeners.append(self._remember_ended)

    def _remember_ended(self, record: dict[str, Any]) -> None:
        self._ended[_id_hash(str(record["task_id"]))] = None
        if len(self._ended) > MAX_REMEMBERED_ENDED:
            del self._ended[next(iter(self._ended))]  # dicts keep insertion order: the oldest

    def routes(self) -> list[Route]:
        return [
            Route("/admin/openapi.json", self.openapi, methods=["GET"]),
            Route("/admin/tasks/{task_id:path}/end", self.end_task, methods=["POST"]),
            Route("/admin/tasks/{task_id:path}/outcome", self.post_outcome, methods=["POST"]),
            Route("/admin/tasks/{task_id:path}", self.get_task, methods=["GET"]),
            *([Route("/admin/sources/{name}/version", self.post_source_version, methods=["POST"])]
              if self.settings.cache.enabled else []),
        ]

    def unauthorized(self, request: Request) -> Response | None:
        """The 401 for a request without the admin bearer token, else None. Shared by every admin route."""
        if self._token is None:
            return admin_error(401, "admin_disabled", "the admin API is off: set the token in "
                          f"${self.settings.admin.token_env} or admin.token_file")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._token):
            return Response(orjson.dumps({"error": {"type": "admin_error", "code": "unauthorized",
                                                    "message": "a valid bearer token is required"}}),
                            status_code=401, media_type="application/json",
                            headers={"www-authenticate": 'Bearer realm="ragtoll-admin"'})
        return None

    def _denied(self, request: Request) -> Response | None:
        if (refused := self.unauthorized(request)) is not None:
            return refused
        if self.ender is None:
            return admin_error(503, "starting", "the proxy is starting")
        return None

    async def get_task(self, request: Request) -> Response:
        if (denied := self._denied(request)) is not None:
            return denied
        task_id = request.path_params["task_id"]
        try:
            ledger = await self.ender.store.get_task(task_id)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - any store failure is a 503 here
            return admin_error(503, "store_unavailable", f"the budget store failed: {type(exc).__name__}")
        if ledger is None:
            return admin_error(404, "task_not_found", f"no active task {task_id[:200]!r}")
        return _json(ledger_view(ledger, self.settings, self._wall_ms()))

    async def end_task(self, request: Request) -> Response:
        if (denied := self._denied(request)) is not None:
            return denied
        task_id = request.path_params["task_id"]
        body = await request.body()
        outcome: dict[str, bool] | None = None
        if len(body) > MAX_BODY:
            return admin_error(413, "body_too_large", f"body larger than {MAX_BODY} bytes")
        if body.strip():
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                return admin_error(400, "invalid_body", 'body must be JSON: {} or {"correct": true|false}')
            if not isinstance(doc, dict) or set(doc) - {"correct"} or \
                    ("correct" in doc and not isinstance(doc["correct"], bool)):
                return admin_error(400, "invalid_body", 'body must be {} or {"correct": true|false}')
            if "correct" in doc:
                outcome = {"correct": doc["correct"]}
        try:
            record = await self.ender.end(task_id, outcome)  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - any store failure is a 503 here
            return admin_error(503, "store_unavailable", f"the budget store failed: {type(exc).__name__}")
        if record is None:
            return admin_error(404, "task_not_found", f"no active task {task_id[:200]!r}")
        return _json(record)

    async def post_outcome(self, request: Request) -> Response:
        """Record a verdict on a running task, or one this replica ended, as an outcome entry in the
        record sink (`{"kind": "outcome", ...}`); `ragtoll report` applies a task's last verdict to
        its record. Other task ids get 404 (post the verdict with the end call instead)."""
        if (denied := self._denied(request)) is not None:
            return denied
        task_id = request.path_params["task_id"]
        if not TASK_ID_PATTERN.match(task_id):
            return admin_error(400, "invalid_task_id", "not a task id: 1-128 of A-Z a-z 0-9 . _ : ~ @ / + = -")
        body = await request.body()
        if len(body) > MAX_BODY:
            return admin_error(413, "body_too_large", f"body larger than {MAX_BODY} bytes")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or set(doc) != {"correct"} or not isinstance(doc["correct"], bool):
            return admin_error(400, "invalid_body", 'body must be {"correct": true|false}')
        try:
            known = _id_hash(task_id) in self._ended or await self.ender.store.get_task(task_id) is not None  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - any store failure is a 503 here
            return admin_error(503, "store_unavailable", f"the budget store failed: {type(exc).__name__}")
        if not known:
            return admin_error(404, "task_not_found", f"no running or recently ended task {task_id[:200]!r}")
        try:
            entry = await self.ender.record_outcome(task_id, doc["correct"])  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a failing sink is a 503 here, nothing else changes
            return admin_error(503, "sink_unavailable", f"the task record sink failed: {type(exc).__name__}")
        return _json(entry)

    async def post_source_version(self, request: Request) -> Response:
        """The ingestion pipeline announces a source's version: body `{"version": "<1-128 printable
        ASCII>"}`. A new value makes older entries unreachable; the current value again confirms it
        (entries older than the source's staleness bound serve again, for one bound); a value the
        source has moved past is refused with 409 (versions only move forward)."""
        if (refused := self.unauthorized(request)) is not None:
            return refused
        if self.set_source_version is None:
            return admin_error(503, "starting", "the proxy is starting")
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
            await self.set_source_version(name, version)
        except KeyError:
            return admin_error(404, "source_not_found", f"no upstream named {name!r}")
        except VersionSuperseded as exc:
            return admin_error(409, "version_superseded", str(exc))
        except ValueError as exc:
            return admin_error(400, "invalid_version", str(exc))
        return _json({"source": name, "version": version})

    async def openapi(self, request: Request) -> Response:
        return _json(OPENAPI)


_ERROR = {"$ref": "#/components/schemas/Error"}
_TASK_ID = {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}
OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "ragtoll admin API", "version": "1",
             "description": "Read and end per-task budgets, announce source versions. Bearer token from admin.token_env / admin.token_file."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
                "type": {"type": "string"}, "code": {"type": "string"}, "message": {"type": "string"}}}}},
            "Ledger": {"type": "object", "properties": {
                "task_id": {"type": "string"}, "profile": {"type": "string"}, "class": {"type": ["string", "null"]},
                "started_at": {"type": ["string", "null"], "format": "date-time"},
                "last_call_at": {"type": ["string", "null"], "format": "date-time"},
                "used": {"type": "object", "additionalProperties": {"type": "number"}},
                "limits": {"type": "object", "propertyNames": {"enum": list(DIMENSIONS)},
                           "additionalProperties": {"type": "number"}},
                "remaining": {"type": "object", "additionalProperties": {"type": "number"}},
                "rejections": {"type": "object", "additionalProperties": {"type": "integer"}},
                "would_reject": {"type": "object", "additionalProperties": {"type": "integer"}},
                "exhausted": {"type": ["string", "null"]}, "in_flight": {"type": "integer"},
                "chunks_seen": {"type": "integer"}}},
            "TaskRecord": {"type": "object", "required": [
                "task_id", "profile", "class", "route", "started_at", "ended_at", "duration_ms", "calls", "steps",
                "retrieval_calls", "unique_queries", "rerank_calls", "context_tokens", "completion_tokens",
                "cost_usd", "cache_hits", "rejections", "exhausted", "outcome", "end_reason"], "properties": {
                "task_id": {"type": "string"}, "profile": {"type": "string"},
                "class": {"type": ["string", "null"]}, "route": {"type": ["string", "null"]},
                "started_at": {"type": ["string", "null"], "format": "date-time"},
                "ended_at": {"type": ["string", "null"], "format": "date-time"},
                "duration_ms": {"type": "integer"}, "calls": {"type": "integer"}, "steps": {"type": "integer"},
                "retrieval_calls": {"type": "integer"}, "unique_queries": {"type": "integer"},
                "rerank_calls": {"type": "integer"}, "context_tokens": {"type": "integer"},
                "completion_tokens": {"type": "integer"}, "cost_usd": {"type": "number"},
                "cache_hits": {"type": "integer"},
                "rejections": {"type": "object", "additionalProperties": {"type": "integer"}},
                "exhausted": {"type": ["string", "null"]},
                "outcome": {"type": ["object", "null"], "properties": {"correct": {"type": "boolean"}}},
                "end_reason": {"enum": ["explicit", "idle", "call", "shutdown"]}}},
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/admin/tasks/{task_id}": {"get": {
            "summary": "A task's budget ledger", "parameters": [_TASK_ID],
            "responses": {"200": {"description": "the ledger", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Ledger"}}}},
                "401": {"description": "missing or wrong token", "content": {"application/json": {"schema": _ERROR}}},
                "404": {"description": "no active task", "content": {"application/json": {"schema": _ERROR}}}}}},
        "/admin/tasks/{task_id}/end": {"post": {
            "summary": "End a task; its record is appended to the task record sink", "parameters": [_TASK_ID],
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "properties": {"correct": {"type": "boolean"}}}}}},
            "responses": {"200": {"description": "the task record", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/TaskRecord"}}}},
                "400": {"description": "invalid body", "content": {"application/json": {"schema": _ERROR}}},
                "401": {"description": "missing or wrong token", "content": {"application/json": {"schema": _ERROR}}},
                "404": {"description": "no active task", "content": {"application/json": {"schema": _ERROR}}}}}},
        "/admin/tasks/{task_id}/outcome": {"post": {
            "summary": "Record whether a task's answer was correct (running or ended task); appended to the "
                       "record sink as an outcome entry that `ragtoll report` applies", "parameters": [_TASK_ID],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "required": ["correct"],
                "properties": {"correct": {"type": "boolean"}}}}}},
            "responses": {"200": {"description": "the outcome entry written"},
                "400": {"description": "invalid body", "content": {"application/json": {"schema": _ERROR}}},
                "401": {"description": "missing or wrong token", "content": {"application/json": {"schema": _ERROR}}},
                "404": {"description": "no running or recently ended task",
                        "content": {"application/json": {"schema": _ERROR}}},
                "413": {"description": "body too large", "content": {"application/json": {"schema": _ERROR}}},
                "503": {"description": "the store or the sink failed", "content": {"application/json": {"schema": _ERROR}}}}}},
        "/admin/sources/{name}/version": {"post": {
            "summary": "A source's new version (the ingestion pipeline's push): older evidence cache entries "
                       "become unreachable; pushing the current version again confirms it (a heartbeat)",
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["version"], "properties": {
                    "version": {"type": ["string", "integer"], "description": "1-128 printable ASCII, or a 64-bit integer",
                                "minimum": -(2**63), "maximum": 2**63 - 1}}}}}},
            "responses": {"200": {"description": "the version now in force", "content": {"application/json": {
                "schema": {"type": "object", "properties": {"source": {"type": "string"},
                                                            "version": {"type": "string"}}}}}},
                "400": {"description": "invalid version or body", "content": {"application/json": {"schema": _ERROR}}},
                "401": {"description": "missing or wrong token", "content": {"application/json": {"schema": _ERROR}}},
                "404": {"description": "no evidence cache is configured", "content": {"application/json": {"schema": _ERROR}}},
                "409": {"description": "the source has moved past this version",
                        "content": {"application/json": {"schema": _ERROR}}}}}},
        "/admin/openapi.json": {"get": {"summary": "This description", "security": [],
                                        "responses": {"200": {"description": "OpenAPI 3.1"}}}},
    },
}
