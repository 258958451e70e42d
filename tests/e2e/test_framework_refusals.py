"""One request per refusal in the frameworks people use (issue 31 item 3), at their default
settings: each framework makes one model call through ragtoll whose budget refuses it; ragtoll
must see exactly one request (no retry), the upstream none, and the framework must raise an error
that names the budget.

Each framework runs in a process of its own (support/framework_calls.py): the async ones own
their event loop there. llama-index's OpenAI LLM declares `openai<3` (it runs on openai 3), so it is
not in the test extra, which would pull the SDK down: the session installs its pinned release
without dependencies into a directory of its own, on that process's path only. The measurement behind the 402 default is kept too: llama-index retries
a 429 whatever `x-should-retry` says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from conftest import ProxyFactory, Telemetry, Upstream
from opentelemetry.trace import SpanKind
from ragtoll.instrumentation import semconv as sc

HARNESS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "support", "framework_calls.py")
FRAMEWORKS = [
    "openai",
    "openai-responses",
    "anthropic",
    "langchain-openai",
    "langchain-anthropic",
    "llama-index-openai",
    "llama-index-agent",
    "openai-agents-chat",
    "openai-agents-responses",
]
# not here: llama-index-llms-anthropic 0.12 with anthropic 2.x fails before it sends anything
# (TypeError: Cannot instantiate typing.Union, in its messages_to_anthropic_messages); litellm and
# haystack-ai are not installed with the test extra
REFUSE = {"default_profile": "p", "profiles": {"p": {"max_steps": 0}}}
LLAMA_INDEX_OPENAI = "llama-index-llms-openai==0.8.3"


@pytest.fixture(scope="session")
def framework_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A directory with llama-index's OpenAI LLM (its dependencies are the test extra's)."""
    target = tmp_path_factory.mktemp("llama-index-openai")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                           "--target", str(target), LLAMA_INDEX_OPENAI], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    yield str(target)


def routes(url: str, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"name": "openai", "kind": "llm", "api": "openai", "url": url, "prefix": "/openai", **extra},
        {"name": "claude", "kind": "llm", "api": "anthropic", "url": url, "prefix": "/anthropic", **extra},
    ]


def call(framework: str, base: str, path: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([path, *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, HARNESS, framework, base], capture_output=True, timeout=180, env=env, check=False
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def requests_seen(telemetry: Telemetry) -> int:
    return sum(1 for s in telemetry.spans() if s.kind == SpanKind.SERVER)


@pytest.mark.slow
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_refusal_is_one_request_and_a_clear_error(
    framework: str, proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry, framework_path: str
) -> None:
    with proxy(upstreams=routes(upstream.url), budgets=REFUSE) as base:
        out = call(framework, base, framework_path)
    assert requests_seen(telemetry) == 1, out  # no retry, by the SDK or the framework around it
    assert sum(upstream.app.state.calls.values()) == 0
    assert "error_type" in out, out
    assert "budget exhausted: max_steps" in out["message"], out
    statuses = {
        s.attributes.get(sc.HTTP_RESPONSE_STATUS_CODE) for s in telemetry.spans() if s.kind == SpanKind.SERVER
    }
    assert statuses == {402}


@pytest.mark.slow
def test_why_llm_routes_refuse_with_402_not_429(
    proxy: ProxyFactory, upstream: Upstream, telemetry: Telemetry, framework_path: str
) -> None:
    """The measurement behind the default: llama-index wraps the openai SDK and retries its
    RateLimitError (429) whatever x-should-retry says; an operator who asks for 429 gets that."""
    with proxy(upstreams=routes(upstream.url, reject_status=429), budgets=REFUSE) as base:
        out = call("llama-index-openai", base, framework_path)
    assert "budget exhausted: max_steps" in out["message"]
    assert requests_seen(telemetry) > 1
    assert sum(upstream.app.state.calls.values()) == 0
