"""`ragtoll principal-id`: the id the proxy gives a subject, credential or address, for overrides."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ragtoll.proxy", "principal-id", *args], check=False,
                          capture_output=True, text=True, timeout=60, input=stdin, env=dict(os.environ))


@pytest.mark.slow
def test_prints_the_id_of_each_kind() -> None:
    assert run("--subject", "alice", "--tenant", "acme").stdout == "sub:acme/alice\n"
    assert run("--subject", "alice").stdout == "sub:alice\n"
    key = "key:" + hashlib.sha256(b"authorization:bearer sk-1").hexdigest()[:32]
    assert run("--authorization", "Bearer sk-1").stdout.strip() == key
    assert run("--authorization", "-", stdin="Bearer sk-1\n").stdout.strip() == key  # kept out of argv
    assert run("--authorization", "  BEARER  sk-1").stdout.strip() == key  # canonical, as the proxy reads it
    other = run("--x-api-key", "sk-1").stdout.strip()
    assert other.startswith("key:") and other != key  # the header it came in is part of the credential
    assert run("--address", "10.1.2.3").stdout == "addr:10.1.2.3\n"


def test_two_credential_headers_exit_2() -> None:
    out = run("--authorization", "Bearer sk-1", "--x-api-key", "sk-2")
    assert out.returncode == 2 and "one credential header" in out.stderr


def test_nothing_to_identify_exits_2() -> None:
    out = run()
    assert out.returncode == 2 and "--subject" in out.stderr
