"""The docs' span-tree picture is drawn from a real export: an unchanged agent under
`opentelemetry-instrument` and ragtoll both export OTLP/HTTP to one loopback receiver (what Jaeger
would ingest); the decoded spans of the task's trace are rendered and compared with the picture in docs/observability.md.

`RAGTOLL_UPDATE_DOCS=1` rewrites the picture in the docs instead of comparing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Upstream
from ragtoll.instrumentation import setup
from ragtoll.instrumentation.render_trace import render_tree
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.request.identify import derived_trace_id
from support.otlp import OtlpReceiver
from support.servers import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "observability.md"
AGENT = Path(__file__).parent / "agents" / "docs_agent.py"
TASK = "ticket-7"
BEGIN, END = "<!-- trace-picture:begin -->", "<!-- trace-picture:end -->"
_DURATION = re.compile(r"  (?:\d+\.\d ms|\d+\.\d\d s)(?: · |$)")


def settings(upstream_url: str) -> config.Settings:
    return config.parse({
        "upstreams": [
            {"name": "openai", "kind": "llm", "api": "openai", "url": upstream_url, "prefix": "/openai"},
            {"name": "docs", "kind": "retrieval", "api": "json", "url": upstream_url, "prefix": "/docs",
             "fields": {"version_header": "x-index-version"}},
        ],
        "pricing": {"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.60},
                    "docs": {"per_call": 0.0005}},
        "budgets": {"default_profile": "bounded", "profiles": {
            "bounded": {"max_steps": 8, "max_calls": 20},
            "tight": {"max_steps": 4, "max_calls": 8, "max_retrieval_calls": 3, "max_cost_usd": 0.01}}},
    })


def export_task_trace(upstream: Upstream) -> list[dict]:
    receiver = OtlpReceiver()
    with serve_in_thread(receiver) as otlp:
        tp = setup.tracer_provider({"OTEL_EXPORTER_OTLP_ENDPOINT": otlp, "OTEL_SERVICE_NAME": "ragtoll"})
        with serve_in_thread(build_app(settings(upstream.url), tracer_provider=tp)) as base:
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RAGTOLL_", "OPENAI_"))
                   and k not in ("TRACEPARENT", "TRACESTATE", "BAGGAGE")}
            env.update(OPENAI_BASE_URL=f"{base}/openai/v1", OPENAI_API_KEY="sk-test", DOCS_URL=f"{base}/docs",
                       RAGTOLL_TASK_ID=TASK, RAGTOLL_BUDGET_PROFILE="tight",
                       OTEL_SERVICE_NAME="my-agent", OTEL_EXPORTER_OTLP_ENDPOINT=otlp,
                       OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRICS_EXPORTER="none",
                       OTEL_LOGS_EXPORTER="none")
            instrument = str(Path(sys.executable).parent / "opentelemetry-instrument")
            done = subprocess.run([instrument, sys.executable, str(AGENT)], env=env, capture_output=True,
                                  text=True, timeout=120, check=False)
            assert done.returncode == 0, done.stderr
        # ragtoll stops: the task it holds ends, and its summary span is the trace's root
        tp.shutdown()
    trace_id = f"{derived_trace_id(TASK):032x}"
    return [s for s in receiver.spans if s["trace_id"] == trace_id]


@pytest.mark.slow
def test_docs_picture_matches_a_real_export(upstream: Upstream) -> None:
    spans = export_task_trace(upstream)
    by_id = {s["span_id"]: s for s in spans}
    roots = [s for s in spans if s["parent_span_id"] not in by_id]
    assert [r["name"] for r in roots] == ["ragtoll.task"] and roots[0]["parent_span_id"] == ""
    assert {s["resource"]["service.name"] for s in spans} == {"my-agent", "ragtoll"}
    picture = render_tree(spans)
    if os.environ.get("RAGTOLL_UPDATE_DOCS") == "1":
        text = DOCS.read_text()
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOCS.write_text(f"{head}{BEGIN}\n```text\n{picture}\n```\n{END}{tail}")
    documented = DOCS.read_text().split(BEGIN, 1)[1].split(END, 1)[0]
    documented = documented.strip().removeprefix("```text").removesuffix("```").strip("\n")
    assert without_durations(documented) == without_durations(render_tree(spans, durations=True))


def without_durations(text: str) -> str:
    return "\n".join(_DURATION.sub("  ", line).rstrip() for line in text.splitlines())
