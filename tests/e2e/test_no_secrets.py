"""No secret in what ragtoll says: a run of `ragtoll serve` with a Redis password in its store URL,
access logs on, tracing exported, clients sending API keys in headers and query strings, and
failures (a dead upstream, an unreadable record stream, configs refused for a password in a store
or an upstream URL) — and none of those secrets appears in its console output, its exported spans,
its error bodies or its task records."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.otlp import OtlpReceiver
from support.process import RagtollProcess
from support.redis_server import RedisProcess
from support.servers import free_port, serve_in_thread
from support.upstream import UpstreamApp

STORE_PASSWORD = "s3cretStorePw"
UPSTREAM_PASSWORD = "s3cretUpstreamPw"
CLIENT_KEY = "sk-s3cretClientKey"
QUERY_KEY = "AIzaS3cretQueryKey"
SECRETS = (STORE_PASSWORD, UPSTREAM_PASSWORD, CLIENT_KEY, QUERY_KEY)

pytestmark = pytest.mark.slow


@pytest.fixture
def guarded_redis() -> Iterator[RedisProcess]:
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisProcess(free_port(), tmp, password=STORE_PASSWORD).start()
        try:
            yield server
        finally:
            server.stop()


def leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


def test_a_run_with_secrets_set_never_prints_them(tmp_path: Path, guarded_redis: RedisProcess) -> None:
    store = f"redis://default:{STORE_PASSWORD}@127.0.0.1:{guarded_redis.port}/0"
    receiver = OtlpReceiver()
    with serve_in_thread(UpstreamApp()) as upstream, serve_in_thread(receiver) as otlp:
        host = upstream.split("://", 1)[1]
        upstream_with_password = f"http://user:{UPSTREAM_PASSWORD}@{host}"
        config = {
            "store": store,
            "store_timeout_ms": 2000,  # /readyz pings the store: a loaded test machine is slow
            "server": {"access_log": True},
            "upstreams": [
                {"name": "openai", "kind": "llm", "api": "openai", "url": upstream, "prefix": "/openai"},
                {"name": "dead", "kind": "retrieval", "api": "json", "url": f"http://127.0.0.1:{free_port()}",
                 "prefix": "/dead"},
            ],
            "budgets": {"records_file": str(tmp_path / "records.jsonl")},
        }
        env = {"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": otlp,
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRICS_EXPORTER": "none",
               "OTEL_BSP_SCHEDULE_DELAY": "50"}
        proc = RagtollProcess(tmp_path, config, env=env, ready="/readyz")
        bodies: list[str] = []
        proc.start(timeout=120)  # `with proc:` would start a second process
        try:
            with httpx.Client(base_url=proc.base, timeout=10) as http:
                auth = {"authorization": f"Bearer {CLIENT_KEY}", "x-ragtoll-task-id": "secret-run"}
                chat = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
                for path in ("/openai/v1/chat/completions", f"/openai/v1/chat/completions?key={QUERY_KEY}"):
                    r = http.post(path, json=chat, headers=auth)
                    assert r.status_code == 200, r.text
                    bodies.append(r.text + json.dumps(dict(r.headers)))
                dead = http.post(f"/dead/search?api_key={QUERY_KEY}", json={"query": "q"}, headers=auth)
                assert dead.status_code == 502
                bodies.append(dead.text + json.dumps(dict(dead.headers)))
                assert http.post("/admin/tasks/secret-run/end").status_code == 401  # no token: refused, not ended
        finally:
            proc.stop()
        console = proc.log.read_text()
        spans = json.dumps(receiver.spans)
    assert "listening" in console and "REDACTED" in console  # it did say where the store is, masked
    assert [s["name"] for s in receiver.spans], "no span was exported"
    checked = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "check-config", str(proc.config_path)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stderr
    report = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "report", "--redis-url",
                             f"redis://default:{STORE_PASSWORD}@127.0.0.1:{free_port()}/0"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert report.returncode != 0 and "cannot read stream" in report.stderr
    refused = ""
    for n, (text, key) in enumerate([
            (f"store: 'mysql://root:{STORE_PASSWORD}@db:3306/x'\n", "Config 'store'"),
            (f"upstreams: [{{name: a, kind: llm, api: openai, url: '{upstream_with_password}'}}]\n",
             "Config 'upstreams[0].url'")]):
        bad = tmp_path / f"bad-{n}.yaml"
        bad.write_text(text)
        done = subprocess.run([sys.executable, "-m", "ragtoll.proxy", "check-config", str(bad)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 2 and key in done.stderr and "REDACTED" in done.stderr, done.stderr
        refused += done.stdout + done.stderr
    records = (tmp_path / "records.jsonl").read_text() if (tmp_path / "records.jsonl").exists() else ""
    outputs = {"console": console, "spans": spans, "bodies": "\n".join(bodies), "records": records,
               "check-config": checked.stdout + checked.stderr, "report": report.stdout + report.stderr,
               "config errors": refused}
    assert {name: leaks(text) for name, text in outputs.items() if leaks(text)} == {}
