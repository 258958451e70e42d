"""Who the principal of a call is (the caller the pipeline resolved once: `ex.caller.id`): the
verified identity (JWT subject, the gateway's headers), else the credential's hash, else the client
address; and the principal stage's limits and store failures."""

from __future__ import annotations

import time

import jwt
import pytest
from ragtoll.proxy.errors import BudgetExceeded, StoreUnavailable, Unauthorized
from ragtoll.proxy.request.exchange import Exchange
from ragtoll.proxy.stages.principal import PrincipalStage
from ragtoll.proxy.stores.principals import MemoryPrincipalStore, RedisPrincipalStore
from ragtoll.proxy.stores.redis import RedisStore
from support.exchanges import Exchanges

SECRET = "s3cret-s3cret-s3cret-s3cret-s3cret-0"


def stage(ex: Exchanges) -> PrincipalStage:
    return PrincipalStage(ex.settings, MemoryPrincipalStore(60_000))


def principal_of(ex: Exchange) -> str:
    assert ex.caller is not None
    return ex.caller.id


def test_jwt_subject_and_a_forged_token_is_refused_not_a_credential() -> None:
    ex = Exchanges(env={"RAGTOLL_JWT_SECRET": SECRET}, identity={"mode": "jwt"},
                   principals={"default": {"max_concurrent_tasks": 5}})
    token = jwt.encode({"sub": "alice", "tenant": "acme", "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    assert principal_of(ex(headers={"authorization": f"Bearer {token}"})) == "sub:acme/alice"
    forged = jwt.encode({"sub": "alice", "exp": int(time.time()) + 60}, "x" * 40, algorithm="HS256")
    caller = ex(headers={"authorization": f"Bearer {forged}"}).caller
    assert caller is not None and isinstance(caller.refusal, Unauthorized)  # never a fall back to its hash
    assert caller.refusal.status == 401 and caller.refusal.details["reason"] == "identity:signature"
    assert "alice" not in caller.id


async def test_the_stage_counts_the_callers_principal() -> None:
    xs = Exchanges(identity={"mode": "header"}, principals={"default": {"max_new_tasks_per_minute": 1}})
    s = stage(xs)
    first = xs(headers={"x-auth-subject": "bob"}, task="t1")
    assert await s.on_request(first) is None and first.charged_principal == "sub:bob"
    with pytest.raises(BudgetExceeded) as refused:  # bob's second new task this minute
        await s.on_request(xs(headers={"x-auth-subject": "bob"}, task="t2"))
    assert refused.value.details["principal"] == "sub:bob"
    carol = xs(headers={"x-auth-subject": "carol"}, task="t3")  # another caller: its own window
    assert await s.on_request(carol) is None and carol.charged_principal == "sub:carol"


def test_gateway_header_only_in_header_mode_else_address() -> None:
    headers = {"x-auth-subject": "bob"}
    trusted = Exchanges(identity={"mode": "header"}, principals={"default": {"max_concurrent_tasks": 5}})
    assert principal_of(trusted(headers=headers)) == "sub:bob"
    plain = Exchanges(principals={"default": {"max_concurrent_tasks": 5}})
    assert principal_of(plain(headers=headers, client="192.0.2.7")) == "addr:192.0.2.7"  # the header proves nothing


def test_overrides_replace_only_the_keys_they_set() -> None:
    ex = Exchanges(principals={"default": {"max_concurrent_tasks": 5, "max_cost_usd_per_day": 1.0},
                               "overrides": {"sub:alice": {"max_cost_usd_per_day": 20}}})
    s = stage(ex)
    assert s.limits("sub:alice") == {"max_concurrent_tasks": 5, "max_cost_usd_per_day": 20_000_000_000}
    assert s.limits("sub:bob") == {"max_concurrent_tasks": 5, "max_cost_usd_per_day": 1_000_000_000}


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_an_unreachable_store_forwards_degraded_or_answers_503(mode: str) -> None:
    ex = Exchanges(store="redis://127.0.0.1:9", on_store_error=mode, store_timeout_ms=200,  # nothing listens
                   principals={"default": {"max_new_tasks_per_minute": 5}})
    budget = RedisStore(ex.settings.store, timeout_s=0.2)
    s = PrincipalStage(ex.settings, RedisPrincipalStore(budget, stale_ms=60_000, owner_ttl_s=60))
    try:
        call = ex()
        if mode == "closed":
            with pytest.raises(StoreUnavailable):
                await s.on_request(call)
        else:
            assert await s.on_request(call) is None
            assert call.degraded is not None and call.degraded.startswith("principal store failed")
        again = ex()  # within the retry window the store is not asked again: no second wait
        if mode == "open":
            assert await s.on_request(again) is None and "moments ago" in (again.degraded or "")
    finally:
        await budget.aclose()
