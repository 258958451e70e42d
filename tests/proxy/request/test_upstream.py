"""The upstream client (proxy/request/upstream.py) on real sockets: TLS with a private CA and with a client
certificate, HTTP/2, and the request head ragtoll writes. (Broken upstreams: tests/reliability.)"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from ragtoll.proxy import config
from ragtoll.proxy.app import build_app
from ragtoll.proxy.errors import ConfigError
from support import raw_http
from support.servers import serve_granian_in_thread, serve_in_thread
from support.upstream import UpstreamApp

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A private CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    tmp = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    paths = {name: str(tmp / f"{name}.pem") for name in ("ca", "server", "client_cert", "client_key")}
    ca.cert_pem.write_to_path(paths["ca"])
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(paths["server"])
    client = ca.issue_cert("ragtoll-client")
    client.cert_chain_pems[0].write_to_path(paths["client_cert"])
    client.private_key_pem.write_to_path(paths["client_key"])
    return paths


def _proxy(telemetry: Any, tmp_path: Path, url: str, **upstream: Any) -> Any:
    settings = config.parse({
        "tasks": {"untracked": "per-call"}, "budgets": {"records_file": str(tmp_path / "r.jsonl")},
        "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": url, "prefix": "/openai", **upstream}],
    })
    return serve_in_thread(build_app(settings, tracer_provider=telemetry.tracer_provider,
                                     meter_provider=telemetry.meter_provider))


@pytest.fixture(scope="module")
def tls_upstream(pki: dict[str, str]) -> Iterator[str]:
    with serve_in_thread(UpstreamApp(), ssl_certfile=pki["server"]) as url:
        yield url.replace("http://", "https://")


@pytest.fixture(scope="module")
def mtls_upstream(pki: dict[str, str]) -> Iterator[str]:
    with serve_in_thread(UpstreamApp(), ssl_certfile=pki["server"], ssl_ca_certs=pki["ca"],
                         ssl_cert_reqs=ssl.CERT_REQUIRED) as url:
        yield url.replace("http://", "https://")


def test_a_private_ca_is_trusted_only_where_configured(tls_upstream: str, pki: dict[str, str], telemetry: Any,
                                                       tmp_path: Path) -> None:
    with _proxy(telemetry, tmp_path, tls_upstream, tls={"ca_file": pki["ca"]}) as base:
        assert httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT).status_code == 200
    with _proxy(telemetry, tmp_path, tls_upstream) as base:  # the system's CAs do not know it
        r = httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "upstream_unavailable"
    assert "certificate" in r.json()["error"]["message"].lower()


def test_a_client_certificate_opens_an_mtls_upstream(mtls_upstream: str, pki: dict[str, str], telemetry: Any,
                                                     tmp_path: Path) -> None:
    tls = {"ca_file": pki["ca"], "cert_file": pki["client_cert"], "key_file": pki["client_key"]}
    with _proxy(telemetry, tmp_path, mtls_upstream, tls=tls) as base:
        assert httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT).status_code == 200
    with _proxy(telemetry, tmp_path, mtls_upstream, tls={"ca_file": pki["ca"]}) as base:
        r = httpx.post(f"{base}/openai/v1/chat/completions", json=CHAT)
    assert r.status_code == 502


def test_http2_upstreams_are_spoken_to_in_http2(pki: dict[str, str], telemetry: Any, tmp_path: Path) -> None:
    app = UpstreamApp()
    with serve_granian_in_thread(app, ssl_cert=Path(pki["server"]), ssl_key=Path(pki["server"])) as url:
        url = url.replace("http://", "https://")
        with _proxy(telemetry, tmp_path, url, engine="httpx", http2=True, tls={"ca_file": pki["ca"]}) as base:
            r = httpx.post(f"{base}/openai/echo", json={"x": 1})
    assert r.status_code == 200
    assert r.json()["http_version"] == "2"


def test_tls_files_that_do_not_exist_are_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.tls\.ca_file"):
        config.parse({"upstreams": [{"name": "a", "kind": "llm", "api": "openai", "url": "https://a",
                                     "tls": {"ca_file": str(tmp_path / "missing.pem")}}]})
    with pytest.raises(ConfigError, match=r"upstreams\[0\]\.http2"):
        config.parse({"upstreams": [{"name": "a", "kind": "llm", "api": "openai", "url": "https://a", "http2": True}]})
    with pytest.raises(ConfigError, match=r"upstreams\[1\]\.engine"):  # one origin, one transport
        config.parse({"upstreams": [{"name": "a", "kind": "llm", "api": "openai", "url": "https://a"},
                                    {"name": "b", "kind": "llm", "api": "openai", "url": "https://a/v2",
                                     "engine": "httpx"}]})


@pytest.mark.parametrize(("framing", "body_head"), [
    (b"Content-Length: 5\r\n", b"hello"),
    (b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),
    (b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"),  # both: ambiguous
])
async def test_the_request_head_sent_upstream_has_exactly_one_framing(
        framing: bytes, body_head: bytes, telemetry: Any, tmp_path: Path) -> None:
    import asyncio

    async with raw_http.Server() as up:
        settings = config.parse({
            "tasks": {"untracked": "per-call"}, "budgets": {"records_file": str(tmp_path / "r.jsonl")},
            "upstreams": [{"name": "raw", "kind": "other", "api": "passthrough", "url": f"http://127.0.0.1:{up.port}",
                           "prefix": "/raw"}]})
        with serve_in_thread(build_app(settings, tracer_provider=telemetry.tracer_provider)) as base:
            port = int(base.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /raw/x HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + body_head)
            await writer.drain()
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(answer.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            answer += await asyncio.wait_for(reader.readexactly(length), 10)
            writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert b"got 5 bytes" in answer  # the upstream read the body whole, by the one framing it was given
    head = b"".join(up.recvs).split(b"\r\n\r\n", 1)[0].lower()
    assert (b"content-length:" in head) != (b"transfer-encoding:" in head), head
