"""The admin API as the fault tests read it: the token they configure, and a task's ledger."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

ADMIN_TOKEN = "reliability-admin-token"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def ledger(http: httpx.Client, base: str, task: str) -> dict[str, Any]:
    """GET /admin/tasks/{task}: the task's ledger (asserts it exists)."""
    r = http.get(f"{base}/admin/tasks/{quote(task, safe='')}", headers=ADMIN_HEADERS)
    assert r.status_code == 200, r.text
    return dict(r.json())
