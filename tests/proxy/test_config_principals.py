"""`principals:` config: limits per principal; errors name the key and the fix."""

from __future__ import annotations

import pytest
from ragtoll.proxy import config
from ragtoll.proxy.errors import ConfigError


def test_section_parses_and_is_off_without_limits() -> None:
    assert not config.parse({}).principals.enabled
    s = config.parse({"principals": {"default": {"max_new_tasks_per_minute": 30, "max_cost_usd_per_hour": 2},
                                     "overrides": {"sub:alice": {"max_cost_usd_per_hour": 10}}}})
    assert s.principals.enabled
    assert s.principals.limits_for("sub:alice") == {"max_new_tasks_per_minute": 30, "max_cost_usd_per_hour": 10}


@pytest.mark.parametrize(("raw", "key", "fix"), [
    ({"default": {"max_new_tasks_per_minute": -1}}, "principals.default.max_new_tasks_per_minute", ">= 0"),
    ({"default": {"max_concurrent_tasks": 2.5}}, "principals.default.max_concurrent_tasks", "an integer"),
    ({"default": {"max_cost_usd_per_day": float("inf")}}, "principals.default.max_cost_usd_per_day", "finite"),
    ({"default": {"max_tasks": 3}}, "principals.default.max_tasks", "max_concurrent_tasks"),
    ({"overrides": {"alice": {"max_concurrent_tasks": 3}}}, "principals.overrides.alice", "ragtoll principal-id"),
    ({"overrides": {"sub:alice": {"max_cost_usd_per_hour": -2}}},
     "principals.overrides.sub:alice.max_cost_usd_per_hour", ">= 0"),
])
def test_errors_name_the_field_and_the_fix(raw: dict, key: str, fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.parse({"principals": raw})
    assert info.value.details["key"] == key and f"'{key}'" in info.value.message
    assert fix in info.value.message


def test_env_override() -> None:
    s = config.load({"RAGTOLL_PRINCIPALS__DEFAULT__MAX_CONCURRENT_TASKS": "4"})
    assert s.principals.limits_for("addr:1.2.3.4") == {"max_concurrent_tasks": 4}
