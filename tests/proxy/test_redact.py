"""Credentials in URLs are masked wherever ragtoll writes text; everything else is left as it is."""

from __future__ import annotations

import pytest
from ragtoll.proxy.redact import redact


@pytest.mark.parametrize(("text", "masked"), [
    ("redis://user:s3cret@127.0.0.1:6379/0", "redis://user:REDACTED@127.0.0.1:6379/0"),
    ("rediss://:s3cret@cache:6380", "rediss://:REDACTED@cache:6380"),
    ("redis+cluster://default:s3cret@seed:7000", "redis+cluster://default:REDACTED@seed:7000"),
    ("Error connecting to redis://default:s3cret@10.0.0.1:6379.", "Error connecting to redis://default:REDACTED@10.0.0.1:6379."),
    ("https://gen.example/v1/models?key=AIzaS3cret&alt=sse", "https://gen.example/v1/models?key=REDACTED&alt=sse"),
    ("/search?api_key=s3cret&q=refunds", "/search?api_key=REDACTED&q=refunds"),
    ("/blob?sig=s3cret", "/blob?sig=REDACTED"),
    ("/x?X-Goog-Signature=s3cret", "/x?X-Goog-Signature=REDACTED"),
    ("/x?access_token=s3cret#frag", "/x?access_token=REDACTED#frag"),
])
def test_credentials_are_masked(text: str, masked: str) -> None:
    assert redact(text) == masked
    assert "s3cret" not in redact(text) and "AIzaS3cret" not in redact(text)


@pytest.mark.parametrize("text", [
    "redis://127.0.0.1:6379/0", "http://docs:8080/search?q=key=value", "/search?monkey=1&top_k=3",
    "memory", "plain text with = signs", "user@example.com",
])
def test_text_without_credentials_is_unchanged(text: str) -> None:
    assert redact(text) == text
