"""Configuration: YAML + RAGTOLL_* overrides, validated with messages naming key, value and fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from ragtoll.proxy import adapters, cli, config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.errors import ConfigError

GOOD = """
server: {host: 127.0.0.1, port: 8899}
store: memory
upstreams:
  - {name: openai, kind: llm, prefix: /openai, url: https://api.openai.com, api: openai}
  - name: docs
    kind: retrieval
    url: http://retriever:8080
    trusted: true
    timeouts: {read: 10}
budgets:
  default_profile: tight
  profiles:
    tight: {max_steps: 2, max_cost_usd: 0.01}
"""


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "ragtoll.yaml"
    p.write_text(text)
    return str(p)


def test_good_file_loads_with_defaults_filled(tmp_path: Path) -> None:
    s = config.load({}, write(tmp_path, GOOD))
    assert s.server.port == 8899
    assert [u.route_prefix for u in s.upstreams] == ["/openai", "/docs"]
    docs = s.upstreams[1]
    assert docs.trusted is True and docs.timeouts.read == 10.0 and docs.timeouts.connect == 5.0
    assert s.budgets.profiles["tight"].limits() == {"max_steps": 2, "max_cost_usd": 0.01}


def test_no_file_serves_the_embedded_openai_route() -> None:
    s = config.load({})
    assert [(u.name, u.route_prefix, u.url) for u in s.upstreams] == [("openai", "/openai", "https://api.openai.com")]
    assert s.server.host == "127.0.0.1" and s.server.port == 8787 and s.store == "memory"


def test_env_upstreams_and_overrides() -> None:
    env = {
        "RAGTOLL_UPSTREAM_LLM": "llm:openai:http://127.0.0.1:9000",
        "RAGTOLL_UPSTREAM_MY_DOCS": "retrieval:passthrough:http://127.0.0.1:9001/base",
        "RAGTOLL_SERVER__PORT": "9999",
        "RAGTOLL_ON_STORE_ERROR": "closed",
        "RAGTOLL_ADMIN_TOKEN": "secret",  # not a config key: ignored by the loader
        "RAGTOLL_BUDGETS__PROFILES__BOUNDED__MAX_STEPS": "3",
    }
    s = config.load(env)
    assert {(u.name, u.kind, u.route_prefix) for u in s.upstreams} == {
        ("llm", "llm", "/llm"), ("my-docs", "retrieval", "/my-docs")}
    assert s.server.port == 9999 and s.on_store_error == "closed"
    assert s.budgets.profiles["bounded"].max_steps == 3


def test_env_overrides_a_file(tmp_path: Path) -> None:
    s = config.load({"RAGTOLL_SERVER__PORT": "7000"}, write(tmp_path, GOOD))
    assert s.server.port == 7000


@pytest.mark.parametrize(("text", "needle"), [
    ("upstreams: [{name: a, kind: llmm, url: 'http://x'}]",
     "Config 'upstreams[0].kind' has value 'llmm'. Expected one of: llm, embeddings, retrieval, rerank, other."),
    ("upstreams: [{name: a, kind: llm, url: 'ftp://x'}]", "Config 'upstreams[0].url' has value 'ftp://x'"),
    ("upstreams: [{name: a, kind: llm, url: 'http://u:pw@x'}]",
     "Config 'upstreams[0].url' has value 'http://u:REDACTED@x'. Expected an absolute http:// or https:// URL "
     "without credentials"),
    ("store: 'redis+sentinel://u:pw@x'", "Config 'store' has value 'redis+sentinel://u:REDACTED@x'"),
    ("upstreams: [{name: a, kind: llm, url: 'http://x', prefix: /admin}]", "reserved /admin"),
    ("upstreams: [{name: a, kind: llm, url: 'http://x', prefix: /a}, {name: b, kind: llm, url: 'http://y', prefix: /a/b}]",
     "does not overlap '/a'"),
    ("upstreams: [{name: a, kind: llm, url: 'http://x'}, {name: a, kind: llm, url: 'http://y', prefix: /z}]",
     "a name not used by another upstream"),
    ("server: {port: eighty}", "Config 'server.port' has value 'eighty'. Expected an integer."),
    ("server: {prot: 1}", "Config 'server.prot' is not a known key. Expected one of:"),
    ("serverr: {}", "Config 'serverr' is not a known key"),
    ("store: mysql://x", "Config 'store' has value 'mysql://x'"),
    ("on_store_error: maybe", "Config 'on_store_error' has value 'maybe'. Expected one of: open, closed."),
    ("budgets: {default_profile: nope}", "Config 'budgets.default_profile' has value 'nope'. Expected one of the profiles: bounded."),
    ("budgets: {profiles: {p: {max_steps: -1}}, default_profile: p}", "budgets.profiles.p.max_steps"),
    ("budgets: {classes: {simple_fact: ghost}}", "Config 'budgets.classes.simple_fact' has value 'ghost'"),
    ("telemetry: {capture_content: 'yes'}", "Expected true or false"),
    ("cache: {embedder: 'upstream:nope'}", "Config 'cache.embedder'"),
    ("cache: {max_error: 0}", "Config 'cache.max_error' has value 0.0. Expected a probability in (0, 1]"),
    ("cache: {max_error: 1.5}", "Config 'cache.max_error' has value 1.5"),
    ("cache: {reach: 0.9}", "Config 'cache.reach' has value 0.9. Expected a similarity margin in [0, similarity)"),
    ("- just\n- a list\n", "must hold a mapping at the top"),
    ("a: [unclosed", "is not valid YAML"),
    ("budgets: {default_profile: p, profiles: {p: {escalate_to: nope}}}",
     "Config 'budgets.profiles.p.escalate_to' has value 'nope'. Expected another profile"),
    ("budgets: {default_profile: p, profiles: {p: {escalate_to: p}}}", "'budgets.profiles.p.escalate_to'"),
    ("budgets: {default_profile: p, profiles: {p: {on_exhausted_retrieval: drop}}}",
     "'budgets.profiles.p.on_exhausted_retrieval' has value 'drop'. Expected one of: reject, empty"),
    # a climbed task is bounded by the larger profile's ceilings: it must have some
    ("budgets: {default_profile: p, profiles: {p: {escalate_to: q}, q: {max_retrieval_calls: 9}}}",
     "'q' sets none of max_steps, max_calls, max_cost_usd"),
    ("budgets: {default_profile: p, profiles: {p: {escalate_to: q}, q: {max_steps: 9}}}",
     "'q' sets none of max_retrieval_calls, max_unique_queries, max_calls"),
    ("budgets: {default_profile: p, profiles: {p: {finish_max_output_tokens: 0}}}",
     "'budgets.profiles.p.finish_max_output_tokens' has value 0"),
    ("budgets: {output_ceilings: {my-llm: 0}}", "'budgets.output_ceilings.my-llm' has value 0"),
])
def test_bad_config_names_key_value_and_fix(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load({}, write(tmp_path, text))
    assert needle in str(info.value)


@pytest.mark.parametrize(("text", "needle"), [
    ("upstreams: [{name: a, kind: llm, url: 'http://x', api: nope}]",
     "Config 'upstreams[0].api' has value 'nope'. Expected one of the adapters: anthropic,"),
    ("upstreams: [{name: a, kind: retrieval, url: 'http://x', api: json, fields: {qery: q}}]",
     "Config 'upstreams[0].fields.qery' has value 'q'. Expected a field of json: one of"),
])
def test_adapter_keys_are_checked_by_the_adapter_registry(tmp_path: Path, text: str, needle: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, text)
    settings = config.load({}, path)  # config itself knows no adapter (it imports none)
    with pytest.raises(ConfigError) as info:
        adapters.check(settings.upstreams)
    assert needle in str(info.value)
    with pytest.raises(ConfigError, match=re.escape(needle)):  # the app refuses to start
        build_app(settings)
    with pytest.raises(SystemExit) as exited:  # and check-config (and serve) say so
        cli.main(["check-config", path])
    assert exited.value.code == 2 and needle in capsys.readouterr().err


def test_bad_env_upstream_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="RAGTOLL_UPSTREAM_X.*<kind>:<api>:<url>"):
        config.load({"RAGTOLL_UPSTREAM_X": "http://nope"})


def test_missing_file_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        config.load({}, "/nonexistent/ragtoll.yaml")


def test_check_config_cli_exit_codes(tmp_path: Path) -> None:
    good = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "check-config", write(tmp_path, GOOD)],
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0 and "/openai -> https://api.openai.com" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("server: {port: 0}\n")
    out = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "check-config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Config 'server.port' has value 0. Expected a TCP port between 1 and 65535." in out.stderr


def test_serve_with_bad_config_exits_nonzero(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstreams: [{name: a, kind: llm, url: 'http://x', api: nope}]\n")
    out = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "serve", "--config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "upstreams[0].api" in out.stderr


@pytest.mark.parametrize(("text", "needle"), [
    ("budgets: {default_profile: p, profiles: {p: {max_cost_usd: .nan}}}", "a finite number >= 0"),
    ("budgets: {default_profile: p, profiles: {p: {max_cost_usd: .inf}}}", "a finite number >= 0"),
    ("store_timeout_ms: 0", "Config 'store_timeout_ms' has value 0. Expected a positive number of milliseconds"),
    ("upstreams: [{name: a, kind: llm, url: 'http://x', timeouts: {read: -1}}]",
     "Config 'upstreams[0].timeouts.read' has value -1.0. Expected a positive number of seconds."),
])
def test_limits_and_timeouts_must_be_finite_and_positive(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load({}, write(tmp_path, text))
    assert needle in str(info.value)


def test_check_config_says_how_the_evidence_cache_treats_each_retrieval_route() -> None:
    from ragtoll.proxy.cli import _cache_summary

    docs = {"name": "docs", "kind": "retrieval", "api": "json", "url": "http://127.0.0.1:1",
            "fields": {"version_header": "x-index-version"}}
    header = config.parse({"identity": {"mode": "header"}, "upstreams": [
        {**docs, "cache": {"max_staleness_s": 60, "probe": {"path": "/version"}}},
        {**docs, "name": "kb", "cache": {"filters_by_caller": False}}]})
    assert _cache_summary(header) == [
        "evidence cache: identity header (trusted gateway; a groups-only header is a principal, a repeated one a 400)",
        "  /docs: per caller view, served up to 60 s old without a confirmed version, probe GET /version",
        "  /kb: shared by ACL, served up to 300 s old without a confirmed version, no probe"]
    assert _cache_summary(config.parse({"upstreams": [docs], "cache": {"enabled": False}})) == []


def test_the_finish_allowance_is_small_by_default() -> None:
    assert config.Profile().finish_allowance() == (1024, 0.05)
    assert config.Profile(max_cost_usd=0.01).finish_allowance() == (1024, 0.001)  # a tenth of the limit
    assert config.Profile(max_cost_usd=0.01, finish_max_cost_usd=0.5, finish_max_output_tokens=64).finish_allowance() \
        == (64, 0.5)


def test_the_embedded_default_bounds_searches_and_the_prompt() -> None:
    bounded = config.parse({}).budgets.profiles["bounded"]
    assert (bounded.max_retrieval_calls, bounded.max_prompt_tokens, bounded.max_steps, bounded.max_cost_usd) \
        == (40, 128_000, 40, 1.0)
