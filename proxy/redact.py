"""Credentials out of what ragtoll says: a URL's password and the values of credential-like query
parameters are masked before any text reaches a log line, a span attribute, an error body or the
console. Pure, imports nothing of ragtoll, so every room may use it.
"""

from __future__ import annotations

import re

MASK = "REDACTED"
# scheme://user:password@ -> scheme://user:REDACTED@ (a password alone: scheme://:password@)
_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/?#@:]*):(?P<secret>[^\s/?#@]+)@")
# ?key=... &api_key=... &access_token=... (the parameter names providers and stores authenticate by)
_QUERY = re.compile(
    r"(?P<head>[?&;](?:[a-z0-9_.-]*[_.-])?(?:key|apikey|token|secret|password|passwd|pwd|sig|signature|auth"
    r"|authorization|credential|credentials|code)=)(?P<secret>[^&#\s'\"]+)", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` (a URL, or a message holding URLs) with every credential in a URL masked."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['head']}{MASK}", text)
