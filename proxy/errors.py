"""Every error ragtoll raises on purpose, and the one renderer that turns them into JSON.

    RagtollError
     ├── ConfigError                 bad configuration; names the key, the value and the fix
     ├── Rejected(status, code)      answered locally, the upstream is never called
     │    ├── BudgetExceeded         a task limit is used up (429, x-should-retry: false)
     │    ├── AclDenied              identity refused (401/403)
     │    ├── TaskRequired           untracked call while `tasks.untracked: reject` (400)
     │    ├── NotFound               no configured route for the path (404)
     │    ├── BadRequest             a request ragtoll will not forward as it is (400)
     │    │    └── UnreadableBody     a budgeted call whose body ragtoll cannot read (400)
     │    ├── RequestTimeout         the body did not arrive within `server.body_timeout_s` (408)
     │    └── BodyTooLarge           request body above `server.max_body_bytes` (413)
     ├── UpstreamError               the upstream exchange failed
     │    ├── UpstreamTimeout        504
     │    └── UpstreamUnavailable    502 (refused, reset, protocol garbage)
     ├── StoreUnavailable            the budget store could not answer in time (503 when closed)
     └── ShuttingDown                the process is draining after SIGTERM (503)

This module imports nothing from the rest of ragtoll.
"""

from __future__ import annotations

from typing import Any

import orjson


class RagtollError(Exception):
    """Base of every ragtoll error. `code` is stable and machine-readable."""

    status = 500
    code = "ragtoll_error"
    type = "ragtoll_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class ConfigError(RagtollError):
    code = "config_invalid"
    type = "config_error"


class Rejected(RagtollError):
    """A local answer: the call never reaches the upstream."""

    status = 400
    code = "rejected"
    type = "invalid_request_error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None, **details: Any):
        super().__init__(message, **details)
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class BudgetExceeded(Rejected):
    status = 429
    code = "budget_exceeded"
    type = "budget_exceeded"


class AclDenied(Rejected):
    status = 403
    code = "access_denied"
    type = "permission_error"


class Unauthorized(Rejected):
    """The caller's identity was presented and failed verification (a JWT that is invalid, expired
    or forged), or it presented none where `principals.anonymous: refuse` requires one."""

    status = 401
    code = "unauthorized"
    type = "authentication_error"


class TaskRequired(Rejected):
    status = 400
    code = "task_required"


class NotFound(Rejected):
    status = 404
    code = "route_not_found"
    type = "not_found_error"


class BadRequest(Rejected):
    status = 400
    code = "bad_request"


class UnreadableBody(BadRequest):
    """A budgeted call's body could not be read, so it could not be budgeted
    (`budgets.on_unreadable: reject`); `reason` says why."""

    code = "unreadable_body"


class RequestTimeout(Rejected):
    status = 408
    code = "request_timeout"


class BodyTooLarge(Rejected):
    status = 413
    code = "body_too_large"


class UpstreamError(RagtollError):
    status = 502
    code = "upstream_error"
    type = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamUnavailable(UpstreamError):
    status = 502
    code = "upstream_unavailable"


class StoreUnavailable(RagtollError):
    status = 503
    code = "store_unavailable"
    type = "store_error"


class ShuttingDown(RagtollError):
    status = 503
    code = "shutting_down"
    type = "server_error"


def render(error: RagtollError, *, style: str = "openai") -> bytes:
    """The JSON body for `error`, in the shape the endpoint's own clients parse.

    `style` is the route's error dialect: `openai` (`{"error": {"message", "type", "code", ...}}`),
    `anthropic` (`{"type": "error", "error": {"type", "message"}}`) or `plain` (same as openai).
    Details (dimension, limit, used, task id, ...) ride beside the message in every style.
    """
    inner: dict[str, Any] = {"type": error.type, "code": error.code, "message": error.message}
    inner.update(error.details)
    if style == "anthropic":
        return orjson.dumps({"type": "error", "error": inner})
    return orjson.dumps({"error": inner})
