"""Each config section validates itself; Settings keeps only the rules that span sections."""

from __future__ import annotations

from typing import Any

import pytest
from ragtoll.proxy import config
from ragtoll.proxy.errors import ConfigError

UP = {"name": "a", "kind": "llm", "url": "http://x"}


def error(raw: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        config.parse(raw)
    return info.value


@pytest.mark.parametrize(("section", "where", "key", "message"), [
    (config.Timeouts(read=-1), "upstreams[2].timeouts", "upstreams[2].timeouts.read",
     "Config 'upstreams[2].timeouts.read' has value -1. Expected a positive number of seconds."),
    (config.Limits(keepalive_s=0), "upstreams[0].limits", "upstreams[0].limits.keepalive_s",
     "Config 'upstreams[0].limits.keepalive_s' has value 0. Expected a positive number of seconds (default 15)."),
    (config.TlsConfig(key_file=None, ca_file="/nonexistent/ca.pem"), "upstreams[3].tls", "upstreams[3].tls.ca_file",
     "Config 'upstreams[3].tls.ca_file' has value '/nonexistent/ca.pem'. Expected the path of a readable PEM file."),
    (config.UpstreamConfig(name="A", kind="llm", url="http://x"), "upstreams[1]", "upstreams[1].name",
     "Config 'upstreams[1].name' has value 'A'. Expected lowercase letters, digits"),
    (config.ServerConfig(port=0), "server", "server.port",
     "Config 'server.port' has value 0. Expected a TCP port between 1 and 65535."),
    (config.ServerConfig(max_event_bytes=10**9), "server", "server.max_event_bytes",
     "Expected between 1024 and server.max_inspect_bytes (8388608)"),
    (config.TasksConfig(header="x task"), "tasks", "tasks.header",
     "Config 'tasks.header' has value 'x task'. Expected an HTTP header name."),
    (config.Profile(max_steps=-1), "budgets.profiles.p", "budgets.profiles.p.max_steps",
     "Config 'budgets.profiles.p.max_steps' has value -1. Expected a finite number >= 0 (omit the key for no limit)."),
    (config.ProfileRule(profile="p"), "budgets.rules[0]", "budgets.rules[0]",
     "Expected a rule with `route`, `header` + `equals`, or both."),
    (config.BudgetsConfig(default_profile="nope"), "budgets", "budgets.default_profile",
     "Config 'budgets.default_profile' has value 'nope'. Expected one of the profiles: bounded."),
    (config.CacheConfig(similarity=0.0), "cache", "cache.similarity",
     "Config 'cache.similarity' has value 0.0. Expected a cosine similarity in (0, 1]."),
    (config.PriceEntry(per_call=-0.01), "pricing.docs", "pricing.docs.per_call",
     "Config 'pricing.docs.per_call' has value -0.01. Expected a price in USD >= 0"),
    (config.IdentityConfig(header=config.HeaderIdentityConfig(groups="x groups")), "identity",
     "identity.header.groups", "Config 'identity.header.groups' has value 'x groups'. Expected an HTTP header name."),
    (config.TelemetryConfig(content_max_chars=-1), "telemetry", "telemetry.content_max_chars",
     "Config 'telemetry.content_max_chars' has value -1. Expected at least 0 (default 2048)."),
])
def test_a_section_validates_itself_under_the_key_it_is_given(section: Any, where: str, key: str,
                                                              message: str) -> None:
    with pytest.raises(ConfigError) as info:
        section.validate(where)
    assert message in str(info.value)
    assert info.value.details["key"] == key


@pytest.mark.parametrize("section", [
    config.ServerConfig(), config.AdminConfig(), config.Timeouts(), config.Limits(), config.TlsConfig(),
    config.UpstreamConfig(name="a", kind="llm", url="http://x"), config.TasksConfig(), config.Profile(),
    config.ProfileRule(profile="bounded", route="a"), config.BudgetsConfig(), config.PriceEntry(), config.CacheConfig(),
    config.JwtConfig(), config.HeaderIdentityConfig(), config.IdentityConfig(), config.TelemetryConfig(),
], ids=lambda s: type(s).__name__)
def test_every_section_has_its_own_validate_and_its_defaults_pass(section: Any) -> None:
    section.validate("x")


# The cache stage used to check these only when it was built (stages/cache.py `_validate`); they are
# the cache section's own rules now, so `check-config` and `load` report them.
@pytest.mark.parametrize(("cache", "message"), [
    ({"similarity": 1.5}, "Config 'cache.similarity' has value 1.5. Expected a cosine similarity in (0, 1]."),
    ({"ttl_s": 0}, "Config 'cache.ttl_s' has value 0. Expected at least 1 second."),
    ({"candidates": 0}, "Config 'cache.candidates' has value 0. Expected an integer >= 1."),
    ({"max_partition_entries": -5}, "Config 'cache.max_partition_entries' has value -5. Expected an integer >= 1."),
    ({"audit_fraction": 2}, "Config 'cache.audit_fraction' has value 2.0. Expected a fraction in [0, 1]."),
    ({"audit_target": 0}, "Config 'cache.audit_target' has value 0.0. Expected a fraction in (0, 1]."),
    ({"authz_url": "ftp://x"}, "Config 'cache.authz_url' has value 'ftp://x'. Expected an http:// or https:// URL."),
    ({"acl_public": ""}, "Config 'cache.acl_public' has value ''. Expected a non-empty marker such as public."),
    ({"min_top_margin": -1}, "Config 'cache.min_top_margin' has value -1.0. Expected a number >= 0"),
])
def test_cache_rules_are_checked_when_the_config_loads(cache: dict[str, Any], message: str) -> None:
    assert message in str(error({"cache": cache}))


@pytest.mark.parametrize(("raw", "message"), [
    ({"upstreams": [UP, {**UP, "url": "http://y", "prefix": "/b"}]},
     "Config 'upstreams[1].name' has value 'a'. Expected a name not used by another upstream."),
    ({"upstreams": [{**UP, "prefix": "/a"}, {**UP, "name": "b", "url": "http://y", "prefix": "/a/b"}]},
     "Expected a prefix that does not overlap '/a' of upstream 'a'."),
    ({"upstreams": [UP, {**UP, "name": "b", "url": "http://X/v1", "engine": "httpx"}]},
     ("Config 'upstreams[1].engine' has value 'httpx'. Expected the same engine as upstreams[0] ('a'), "
     "which has the same origin http://x.")),
    ({"upstreams": [UP], "cache": {"embedder": "upstream:b"}},
     ("Config 'cache.embedder' has value 'upstream:b'. Expected none, local, or upstream:<name> with a configured "
     "upstream (a).")),
])
def test_rules_across_sections_stay_with_settings(raw: dict[str, Any], message: str) -> None:
    assert message in str(error(raw))


@pytest.mark.parametrize(("raw", "message"), [
    # a header rule without `equals` matched every request lacking the header
    ({"budgets": {"rules": [{"header": "x-tier", "profile": "bounded"}]}},
     "Config 'budgets.rules[0].header' has value 'x-tier'. Expected `header` and `equals` together"),
    ({"budgets": {"rules": [{"route": "a", "equals": "gold", "profile": "bounded"}]}},
     "Config 'budgets.rules[0].equals' has value 'gold'. Expected `header` and `equals` together"),
    ({"budgets": {"default_max_output_tokens": 0}}, "Config 'budgets.default_max_output_tokens' has value 0."),
    ({"tasks": {"idle_timeout_s": 0}}, "Config 'tasks.idle_timeout_s' has value 0.0. Expected a positive number"),
    ({"pricing": {"gpt-4o": {"input_per_mtok": -1}}}, "Config 'pricing.gpt-4o.input_per_mtok' has value -1.0."),
    ({"identity": {"jwt": {"leeway_s": -5}}}, "Config 'identity.jwt.leeway_s' has value -5.0."),
    ({"cache": {"authz_timeout_s": 0}}, "Config 'cache.authz_timeout_s' has value 0.0. Expected a positive number"),
    ({"upstreams": [{**UP, "limits": {"max_keepalive_connections": -1}}]},
     "Config 'upstreams[0].limits.max_keepalive_connections' has value -1. Expected at least 0 (default 50)."),
    # `$` let a trailing newline through
    ({"upstreams": [{**UP, "url": "http://x\n"}]}, "Config 'upstreams[0].url' has value 'http://x\\n'."),
    ({"tasks": {"header": "x-task\n"}}, "Config 'tasks.header' has value 'x-task\\n'. Expected an HTTP header name."),
    # float() of a huge integer raised OverflowError, not a ConfigError
    ({"server": {"body_timeout_s": 10**400}}, "Config 'server.body_timeout_s' has value 1000"),
])
def test_rules_that_were_missing(raw: dict[str, Any], message: str) -> None:
    assert message in str(error(raw))


def test_profile_limits_of_any_size_are_checked_without_overflow() -> None:
    s = config.parse({"budgets": {"profiles": {"bounded": {"max_context_tokens": 10**400}}}})
    assert s.budgets.profiles["bounded"].max_context_tokens == 10**400


@pytest.mark.parametrize(("context", "key"), [
    ({"depth_gap": 1.5}, "context.depth_gap"),
    ({"depth_floor": -0.1}, "context.depth_floor"),
    ({"min_chunk_chars": 10}, "context.min_chunk_chars"),
    ({"prompt_cache_key": "always"}, "context.prompt_cache_key"),
    ({"routes": {"a": {"depth_floor": 2}}}, "context.routes.a.depth_floor"),
    ({"routes": {"nope": {}}}, "context.routes.nope"),
])
def test_context_section_names_the_bad_key(context: dict[str, Any], key: str) -> None:
    assert f"'{key}'" in str(error({"upstreams": [UP], "context": context}))


def test_context_route_overrides_resolve_over_the_defaults() -> None:
    s = config.parse({"upstreams": [UP], "context": {"depth": True, "routes": {"a": {"depth_gap": 0.5,
                                                                                      "evidence_once": False}}}})
    p = s.context.for_route("a")
    assert (p.depth, p.depth_gap, p.depth_floor, p.evidence_once, p.prompt_cache_key) == (True, 0.5, 0.0, False, "auto")
