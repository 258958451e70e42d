"""A principal is named by the credential the route's upstream authenticates by, canonically: spelling
the same key another way, or adding a credential-looking header the upstream ignores, gains no new
budget; in jwt mode a token that fails is a 401, never a fall back; anonymous callers are known by
their address, or refused where `principals.anonymous: refuse`. Over loopback, on memory and Redis."""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx
import jwt
import pytest
from conftest import ProxyFactory, Upstream
from test_budgets import CHAT, upstreams
from test_budgets_principals import rotate, settings

SECRET = "canonical-principal-secret-canonical-0"


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    return "memory" if request.param == "memory" else str(request.getfixturevalue("redis_url"))


def spellings(key: str) -> list[dict[str, str]]:
    """Twenty spellings of one OpenAI credential (`Bearer <key>`) the upstream reads as the same."""
    out: list[dict[str, str]] = []
    for i in range(5):
        out.append({"authorization": f"Bearer {key}", "x-api-key": f"sk-{uuid.uuid4().hex}"})
        out.append({"authorization": f"Bearer {key}", "api-key": f"sk-{uuid.uuid4().hex}"})
        out.append({"authorization": f"{('bearer', 'BEARER', 'BeArEr')[i % 3]} {key}"})
        # leading and trailing whitespace never reaches ragtoll (the HTTP parser strips it): inner runs do
        out.append({"authorization": f"Bearer{(' ', chr(9))[i % 2] * (i + 2)}{key}"})
    return out


def test_spellings_of_one_key_share_one_principal(proxy: ProxyFactory, upstream: Upstream, store: str) -> None:
    key = f"sk-{uuid.uuid4().hex}"
    variants = spellings(key)
    cfg = settings(store, {"default": {"max_new_tasks_per_minute": 5}})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base:
        answers = rotate(base, len(variants), lambda i: {**variants[i], "x-ragtoll-task-id": f"sp-{uuid.uuid4().hex}"})
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 5 and codes.count(429) == 15, codes
    assert upstream.app.state.calls[CHAT] == 5
    assert len({a.json()["error"]["principal"] for a in answers if a.status_code == 429}) == 1


def test_anthropic_principal_is_its_api_key(proxy: ProxyFactory, upstream: Upstream, store: str) -> None:
    """Anthropic authenticates by `x-api-key`: a random Authorization header beside it changes nothing.
    (The loopback upstream has no Messages API: an admitted call is its 404, a refused one ragtoll's 429.)"""
    key = f"sk-ant-{uuid.uuid4().hex}"
    cfg = settings(store, {"default": {"max_new_tasks_per_minute": 3}})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=30) as http:
        answers = [http.post(f"{base}/anthropic/v1/messages", headers={
            "x-api-key": key, "authorization": f"Bearer {uuid.uuid4().hex}", "anthropic-version": "2023-06-01",
            "x-ragtoll-task-id": f"an-{uuid.uuid4().hex}"}, json={
            "model": "claude-3-5-haiku-latest", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
        ) for _ in range(8)]
    codes = [a.status_code for a in answers]
    assert codes.count(429) == 5 and 429 not in codes[:3], codes
    assert len({a.json()["error"]["principal"] for a in answers if a.status_code == 429}) == 1


def test_a_credential_header_sent_twice_is_refused(proxy: ProxyFactory, upstream: Upstream) -> None:
    cfg = settings("memory", {"default": {"max_new_tasks_per_minute": 5}})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=30) as http:
        r = http.post(f"{base}/openai{CHAT}", headers=[("authorization", "Bearer sk-a"),
                                                       ("authorization", f"Bearer {uuid.uuid4().hex}")],
                      json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    assert "authorization" in r.json()["error"]["message"]
    assert upstream.app.state.calls.get(CHAT, 0) == 0


def token(**claims: Any) -> str:
    return jwt.encode({"sub": "alice", "exp": int(time.time()) + 300, **claims}, SECRET, algorithm="HS256")


def test_jwt_mode_refuses_bad_tokens_with_401(proxy: ProxyFactory, upstream: Upstream, store: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGTOLL_JWT_SECRET", SECRET)
    forged = [jwt.encode({"sub": "alice", "exp": int(time.time()) + 300}, f"forged-{i}-" * 6, algorithm="HS256")
              for i in range(10)]
    bad = [*forged, token(exp=int(time.time()) - 60), "not.a.jwt",
           jwt.encode({"sub": "alice", "exp": int(time.time()) + 300}, None, algorithm="none")]
    cfg = settings(store, {"default": {"max_new_tasks_per_minute": 5}}, identity={"mode": "jwt"})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base:
        answers = rotate(base, len(bad), lambda i: {"authorization": f"Bearer {bad[i]}",
                                                    "x-ragtoll-task-id": f"jw-{uuid.uuid4().hex}"})
        good = rotate(base, 2, lambda i: {"authorization": f"Bearer {token()}", "x-ragtoll-task-id": f"ok-{i}"})
    assert [a.status_code for a in answers] == [401] * len(bad)
    errors = [a.json()["error"] for a in answers]
    assert {e["code"] for e in errors} == {"unauthorized"} and {e["type"] for e in errors} == {"authentication_error"}
    assert {e["reason"] for e in errors} >= {"identity:signature", "identity:expired", "identity:invalid"}
    assert [g.status_code for g in good] == [200, 200]
    assert upstream.app.state.calls[CHAT] == 2  # no refused token reached the upstream


def test_anonymous_callers_are_known_by_address_or_refused(proxy: ProxyFactory, upstream: Upstream) -> None:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    cfg = settings("memory", {"default": {"max_new_tasks_per_minute": 2}})
    with proxy(upstreams=upstreams(upstream.url), **cfg) as base, httpx.Client(timeout=30) as http:
        codes = [http.post(f"{base}/openai{CHAT}", json=body, headers={"x-ragtoll-task-id": f"a-{i}"})
                 for i in range(3)]
    assert [c.status_code for c in codes] == [200, 200, 429]
    assert codes[2].json()["error"]["principal"] == "addr:127.0.0.1"
    refuse = settings("memory", {"default": {"max_new_tasks_per_minute": 2}, "anonymous": "refuse"})
    with proxy(upstreams=upstreams(upstream.url), **refuse) as base, httpx.Client(timeout=30) as http:
        anon = http.post(f"{base}/openai{CHAT}", json=body, headers={"x-ragtoll-task-id": "anon"})
        blank = http.post(f"{base}/openai{CHAT}", json=body, headers={"x-ragtoll-task-id": "b", "authorization": ""})
        keyed = http.post(f"{base}/openai{CHAT}", json=body,
                          headers={"x-ragtoll-task-id": "k", "authorization": "Bearer sk-k"})
    for r in (anon, blank):
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert "anonymous" in r.json()["error"]["message"]
    assert keyed.status_code == 200
    assert upstream.app.state.calls[CHAT] == 3
