"""Secrets named by config: the admin token, the JWT secret and the budget HMAC key.

One reader for all of them: a file (which wins: no environment leaks) or a variable of `env`,
the mapping `build_app(env=...)` was given (default `os.environ`). Surrounding whitespace is
stripped (secret files usually end in a newline). An unreadable file or a weak key is a
ConfigError at startup, naming the key, never a silent "ignore".
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .config import Settings
from .core.signing import MIN_KEY_BYTES
from .errors import ConfigError


def environment(env: Mapping[str, str] | None) -> Mapping[str, str]:
    """Where secrets and `OTEL_*` settings are read: `env` when given (tests, embedding), else the
    process environment. The one place outside config that falls back to `os.environ`."""
    return os.environ if env is None else env


def read_secret(env: Mapping[str, str], env_name: str | None, file_path: str | None, *, key: str) -> bytes | None:
    """The secret in `file_path`, else in `env[env_name]`, else None. `key` names the config key."""
    if file_path:
        try:
            with open(file_path, "rb") as fh:
                value = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"Config '{key}' names {file_path!r}, which cannot be read: {exc.strerror or exc}.",
                              key=key) from exc
        return value or None
    raw = env.get(env_name or "", "").strip()
    return raw.encode("utf-8") if raw else None


def hmac_key(env: Mapping[str, str], env_name: str | None, file_path: str | None) -> bytes | None:
    """The operator's HMAC key for signed budget baggage, at least MIN_KEY_BYTES long, or None
    (signed raises are then ignored, with a note)."""
    source = "budgets.hmac_key_file" if file_path else "budgets.hmac_key_env"
    key = read_secret(env, env_name, file_path, key=source)
    if key is not None and len(key) < MIN_KEY_BYTES:
        where = f"{file_path!r}" if file_path else f"environment variable {env_name}"
        raise ConfigError(f"Config '{source}' ({where}) holds a {len(key)}-byte HMAC key; use at least "
                          f"{MIN_KEY_BYTES} random bytes (e.g. `openssl rand -base64 32`).", key=source)
    return key


def budget_hmac_key(settings: Settings, env: Mapping[str, str]) -> bytes | None:
    return hmac_key(env, settings.budgets.hmac_key_env, settings.budgets.hmac_key_file)


def admin_token(settings: Settings, env: Mapping[str, str]) -> bytes | None:
    return read_secret(env, settings.admin.token_env, settings.admin.token_file, key="admin.token_file")


def jwt_secret(env: Mapping[str, str], env_name: str) -> bytes | None:
    return read_secret(env, env_name, None, key="identity.jwt.secret_env")
