"""Budgets across tasks, the pure part: principal ids, units, the admit rule and the windows."""

from __future__ import annotations

import hashlib

from ragtoll.proxy.core import principals as pc
from ragtoll.proxy.core.principals import Standing


def test_principal_id_prefers_verified_identity_then_credential_then_address() -> None:
    cred = pc.canonical_credential({"authorization": "Bearer sk-1"})
    assert cred == "authorization:bearer sk-1"
    assert pc.principal_id("alice", "acme", cred, "10.0.0.1") == "sub:acme/alice"
    assert pc.principal_id("alice", "", cred, "10.0.0.1") == "sub:alice"
    key = pc.principal_id(None, "", cred, "10.0.0.1")
    assert key == "key:" + hashlib.sha256(cred.encode()).hexdigest()[:32] and "sk-1" not in key
    assert pc.principal_id(None, "", pc.canonical_credential({}), "10.0.0.1") == "addr:10.0.0.1"  # none sent
    assert pc.principal_id(None, "", "", "") == "addr:unknown"


def test_the_credential_is_canonical_and_the_upstreams_own() -> None:
    key = pc.canonical_credential({"authorization": "Bearer sk-1"})
    for spelled in ("bearer sk-1", "BEARER sk-1", "  Bearer   sk-1 ", "Bearer\tsk-1"):
        assert pc.canonical_credential({"authorization": spelled}) == key
    # a header the upstream does not authenticate by changes nothing; its own order decides
    openai = ("authorization", "api-key")
    assert pc.canonical_credential({"authorization": "Bearer sk-1", "x-api-key": "junk", "api-key": "junk"},
                                   openai) == key
    assert pc.canonical_credential({"api-key": " az-1 ", "x-api-key": "junk"}, openai) == "api-key:az-1"
    anthropic = ("x-api-key", "authorization")
    assert pc.canonical_credential({"x-api-key": "sk-ant", "authorization": "Bearer junk"}, anthropic) == \
        "x-api-key:sk-ant"
    assert pc.canonical_credential({"authorization": "   "}) == ""  # blank is none
    assert pc.canonical_credential({"x-api-key": "sk-KEY"}) != pc.canonical_credential({"x-api-key": "sk-key"})


def test_a_limit_of_n_admits_n_and_count_limits_bind_only_new_tasks() -> None:
    limits = pc.to_units({"max_new_tasks_per_minute": 3, "max_concurrent_tasks": 2, "max_cost_usd_per_hour": 0.5})
    assert limits["max_cost_usd_per_hour"] == 500_000_000
    assert pc.first_exceeded(limits, Standing(live_tasks=1, new_tasks=2), new_task=True) is None
    assert pc.first_exceeded(limits, Standing(live_tasks=1, new_tasks=3), new_task=True) == "max_new_tasks_per_minute"
    assert pc.first_exceeded(limits, Standing(live_tasks=2, new_tasks=0), new_task=True) == "max_concurrent_tasks"
    assert pc.first_exceeded(limits, Standing(live_tasks=2, new_tasks=3), new_task=False) is None  # goes on
    over = Standing(cost_hour=500_000_000)
    assert pc.first_exceeded(limits, over, new_task=False) == "max_cost_usd_per_hour"  # cost binds every call
    assert pc.used_value("max_cost_usd_per_hour", over) == 0.5 and pc.limit_value("max_cost_usd_per_hour", 5) == 5e-9


def test_window_sum_takes_the_last_width_buckets() -> None:
    buckets = {10: 1, 11: 2, 40: 4, 70: 8, 71: 16}
    assert pc.window_sum(buckets, 70, 60) == 2 + 4 + 8  # (10, 70]
    assert pc.window_sum(buckets, 71, 60) == 4 + 8 + 16  # (11, 71]
    assert pc.minute_of(pc.HOUR_MS) == 60 and pc.hour_of(pc.HOUR_MS * 25 - 1) == 24
