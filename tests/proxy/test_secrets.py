"""Secrets named by config (proxy/secrets.py): one reader, file before variable, weak keys refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.errors import ConfigError
from ragtoll.proxy.secrets import admin_token, hmac_key, read_secret


def test_hmac_key_prefers_the_file_and_strips_newlines(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_bytes(b"file-key-0123456789abcdef\n")
    env = {"K": "env-key-0123456789abcdef"}
    assert hmac_key(env, "K", str(secret)) == b"file-key-0123456789abcdef"
    assert hmac_key(env, "K", None) == b"env-key-0123456789abcdef"
    assert hmac_key({}, "K", None) is None
    assert hmac_key(env, None, None) is None


def test_hmac_key_refuses_weak_or_unreadable_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="environment variable K.*holds a 5-byte HMAC key"):
        hmac_key({"K": "short"}, "K", None)
    with pytest.raises(ConfigError, match=r"budgets.hmac_key_file.*cannot be read"):
        hmac_key({}, "K", os.fspath(tmp_path / "missing"))


def test_every_secret_is_read_from_the_env_the_app_was_given(tmp_path: Path) -> None:
    """build_app(env=...) is where secrets come from, never os.environ behind the caller's back."""
    settings = config.parse({"upstreams": [{"name": "a", "kind": "llm", "api": "openai", "url": "http://a"}],
                             "budgets": {"hmac_key_env": "RT_TEST_HMAC"}, "admin": {"token_env": "RT_TEST_ADMIN"}})
    assert "RT_TEST_HMAC" not in os.environ
    with pytest.raises(ConfigError, match="RT_TEST_HMAC"):  # the weak key in `env`, not os.environ, is seen
        build_app(settings, env={"RT_TEST_HMAC": "short"})
    app = build_app(settings, env={"RT_TEST_HMAC": "k" * 32, "RT_TEST_ADMIN": "token-1"})
    assert admin_token(app.settings, app.env) == b"token-1"


def test_read_secret_names_the_config_key_of_an_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="admin.token_file"):
        read_secret({}, None, os.fspath(tmp_path / "nope"), key="admin.token_file")
