"""Who is calling is resolved once per call: with the evidence cache (ACLs by principal) and
budgets across tasks (limits by principal) both on, a call's JWT is verified exactly once, and both
stages see the same caller. Counted on PyJWT's own `decode`, over the real server and wire."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import jwt
import pytest
from conftest import Telemetry, Upstream
from ragtoll.instrumentation import semconv as sc
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from support.servers import serve_in_thread
from support.spans import call_spans

SECRET = "identity-once-secret-identity-once-0"


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every JWT PyJWT decodes (and so verifies) while the test runs."""
    seen: list[str] = []
    real = jwt.decode

    def counting(token: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(token)
        return real(token, *args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting)
    yield seen


def test_one_jwt_verification_per_call(upstream: Upstream, telemetry: Telemetry, decodes: list[str]) -> None:
    raw = {
        "upstreams": [
            {"name": "openai", "kind": "llm", "api": "openai", "url": upstream.url, "prefix": "/openai"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream.url, "prefix": "/docs"},
        ],
        "identity": {"mode": "jwt"},
        "principals": {"default": {"max_new_tasks_per_minute": 100}},
        "cache": {"embedder": "none"},
    }
    app = build_app(config.parse(raw), tracer_provider=telemetry.tracer_provider,
                    meter_provider=telemetry.meter_provider, env={"RAGTOLL_JWT_SECRET": SECRET})
    tok = jwt.encode({"sub": "alice", "groups": ["staff"], "exp": int(time.time()) + 3600}, SECRET, algorithm="HS256")
    headers = {"authorization": f"Bearer {tok}", "x-ragtoll-task-id": "once-1"}
    with serve_in_thread(app) as base:
        calls = [
            httpx.post(f"{base}/docs/search", json={"query": "refund window", "top_k": 3}, headers=headers),
            httpx.post(f"{base}/docs/search", json={"query": "refund window", "top_k": 3}, headers=headers),  # a hit
            httpx.post(f"{base}/openai/v1/chat/completions", headers=headers,
                       json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
        ]
    assert [r.status_code for r in calls] == [200, 200, 200]
    assert calls[1].headers.get("x-ragtoll-cache", "").startswith("hit")  # the cache used the caller
    assert len(decodes) == len(calls)  # one verification per call, not one per stage that needs it
    spans = call_spans(telemetry, 3)
    assert {s.attributes[sc.PRINCIPAL_ID] for s in spans} == {"sub:alice"}  # the principal stage used it too
