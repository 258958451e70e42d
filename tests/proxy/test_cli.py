"""The command line: `ragtoll sign-budget` and `sign-outcome` output verifies with the proxy's own verifiers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from ragtoll.proxy.core.signing import signed_profile, verify_budget_baggage, verify_outcome
from ragtoll.proxy.request.identify import parse_baggage

KEY = "operator-secret-key-0123456789"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ragtoll.proxy", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_sign_budget_prints_baggage_that_verifies() -> None:
    out = run("sign-budget", "--task-id", "job-1", "max_steps=40", "max_cost_usd=0.5",
              env={"RAGTOLL_BUDGET_HMAC_KEY": KEY})
    assert out.returncode == 0, out.stderr
    members, notes = parse_baggage(out.stdout.strip())
    assert notes == []
    limits, why = verify_budget_baggage(dict(members), "job-1", KEY.encode(), time.time())
    assert limits == {"max_steps": 40, "max_cost_usd": 0.5}, why
    other, _ = verify_budget_baggage(dict(members), "job-2", KEY.encode(), time.time())
    assert other == {}  # bound to its task


def test_sign_budget_without_key_or_with_bad_limit_exits_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAGTOLL_BUDGET_HMAC_KEY"}
    out = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "sign-budget", "--task-id", "t", "max_steps=4"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2 and "no HMAC key" in out.stderr
    bad = run("sign-budget", "--task-id", "t", "max_steps", env={"RAGTOLL_BUDGET_HMAC_KEY": KEY})
    assert bad.returncode == 2 and "DIMENSION=VALUE" in bad.stderr


@pytest.mark.slow
def test_serve_on_a_taken_port_exits_3_without_saying_it_listens() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("serve", "--port", str(port), env={"OTEL_SDK_DISABLED": "true"})
    assert out.returncode == 3, out.stderr
    assert "cannot listen on 127.0.0.1:" in out.stderr
    assert "listening" not in out.stderr.replace("cannot listen", "")


def test_sign_budget_profile_and_sign_outcome_print_baggage_that_verifies() -> None:
    env = {"RAGTOLL_BUDGET_HMAC_KEY": KEY}
    grant = run("sign-budget", "--task-id", "job-1", "--profile", "generous", env=env)
    assert grant.returncode == 0, grant.stderr
    members = dict(parse_baggage(grant.stdout.strip())[0])
    assert members["ragtoll.budget.profile"] == "generous"
    assert signed_profile(members, "job-1", KEY.encode(), time.time())
    assert not signed_profile({**members, "ragtoll.budget.profile": "other"}, "job-1", KEY.encode(), time.time())
    assert not signed_profile(members, "job-2", KEY.encode(), time.time())
    verdict = run("sign-outcome", "--task-id", "job-1", "incorrect", env=env)
    assert verdict.returncode == 0, verdict.stderr
    members = dict(parse_baggage(verdict.stdout.strip())[0])
    assert verify_outcome(members, "job-1", KEY.encode()) == (False, "")
    assert verify_outcome(members, "job-2", KEY.encode())[0] is None
