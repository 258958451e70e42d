"""`server.metrics_port`: GET /metrics on a port of its own, apart from the proxy's.

In a sidecar the proxy listens on loopback, out of a scraper's reach; the metrics listener may bind
the pod's address instead (the chart sets 0.0.0.0; here loopback, as every test). It serves the
same exposition as the proxy's own GET /metrics, and only that: no route of the proxy is on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from ragtoll.proxy.config import parse
from ragtoll.proxy.errors import ConfigError
from support.process import RagtollProcess
from support.servers import free_port


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.slow
def test_the_metrics_port_serves_what_get_metrics_serves(tmp_path: Path, upstream: Any) -> None:
    metrics_port = free_port()
    config = {
        "server": {"metrics_port": metrics_port, "metrics_host": "127.0.0.1"},
        "upstreams": [
            {"name": "echo", "kind": "other", "api": "passthrough", "url": upstream.url, "prefix": "/echo"}
        ],
    }
    # the SDK on (RagtollProcess turns it off by default), no exporter: metrics only for the scrape
    with (
        RagtollProcess(tmp_path, config, env={"OTEL_SDK_DISABLED": "false"}) as rt,
        httpx.Client(timeout=10) as client,
    ):
        assert client.post(f"{rt.base}/echo/echo/x", json={"q": "x"}).status_code == 200
        proxy_side = client.get(f"{rt.base}/metrics")
        own_port = client.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert proxy_side.status_code == own_port.status_code == 200
        assert own_port.headers["content-type"].startswith("text/plain")
        assert "ragtoll_calls_total" in own_port.text  # the call above, counted
        assert families(own_port.text) == families(proxy_side.text)
        # OpenMetrics when the scraper asks for it, as on the proxy's port
        om = client.get(
            f"http://127.0.0.1:{metrics_port}/metrics",
            headers={"accept": "application/openmetrics-text; version=1.0.0"},
        )
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        # nothing of the proxy is on the metrics port: any path there is the exposition
        assert upstream.app.state.calls.get("/echo/x") == 1
        assert "ragtoll_calls_total" in client.get(f"http://127.0.0.1:{metrics_port}/echo/echo/x").text
        assert upstream.app.state.calls.get("/echo/x") == 1
    assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in rt.log.read_text()


@pytest.mark.slow
def test_a_taken_metrics_port_is_named_at_start(tmp_path: Path, upstream: Any) -> None:
    with RagtollProcess(tmp_path, {"upstreams": []}) as taken:  # any listening port
        config = {"server": {"metrics_port": taken.port}}
        rt = RagtollProcess(tmp_path, config)
        with pytest.raises(RuntimeError, match=r"exited 3"):
            rt.start()
        assert f"cannot listen on 127.0.0.1:{taken.port} (server.metrics_port)" in rt.log.read_text()


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"port": 8787, "metrics_port": 8787}, "server.metrics_port"),
        ({"metrics_port": 0}, "server.metrics_port"),
        ({"metrics_port": 9464, "metrics_host": ""}, "server.metrics_host"),
    ],
)
def test_bad_metrics_listener_config_names_the_field(server: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse({"server": server})
