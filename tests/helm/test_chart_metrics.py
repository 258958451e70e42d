"""Scrapeable everywhere: the metrics port, the PodMonitor and ServiceMonitor, and the alert and
panel on calls admitted without the budget store.

Rendered offline (helm_render.render); Kubernetes objects validated with kubernetes-validate, the
Prometheus Operator's with their CRDs' schemas (helm_render.operator_validator). The wiring is
checked the way the cluster resolves it: a monitor's selector must match the labels of the pods
(or the Service) it means, and the port it names must be a named port there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python as helm
import promql_parser
import pytest
import yaml
from helm_render import (
    EXAMPLE,
    by_name,
    ci_values,
    containers,
    documents,
    find,
    lint,
    notes,
    operator_validator,
    ragtoll_config,
    render,
    validate,
)

AGENT = {"agent": {"image": {"repository": "registry.example.com/acme/rag-agent"}}}
DEGRADED = "ragtoll_budget_degraded_admissions_total"


def ragtoll_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = find(docs, "Deployment")["spec"]["template"]["spec"]
    return by_name(list(containers(spec)), "ragtoll")


def pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = find(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


def port_names(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def test_sidecar_metrics_port_is_on_the_pod_address_and_the_proxy_stays_on_loopback() -> None:
    docs = documents(render(ci_values("sidecar-metrics")))
    server = ragtoll_config(docs)["server"]
    assert (server["host"], server["port"]) == ("127.0.0.1", 8787)
    assert (server["metrics_host"], server["metrics_port"]) == ("0.0.0.0", 9464)
    assert port_names(ragtoll_container(docs)) == {"ragtoll": 8787, "metrics": 9464}
    # the probes still run inside the container: the proxy port is not reachable from outside
    assert "exec" in ragtoll_container(docs)["readinessProbe"]


def test_pod_monitor_scrapes_the_sidecars_metrics_port() -> None:
    docs = documents(render(ci_values("sidecar-metrics")))
    monitor = find(docs, "PodMonitor", "demo-ragtoll")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels(docs).items()  # it selects this release's pods
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["agents"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    assert endpoint["port"] in port_names(ragtoll_container(docs))
    # the NetworkPolicy lets only the monitoring namespace reach the metrics port
    policy = find(docs, "NetworkPolicy", "demo-ragtoll")
    to_metrics = [
        rule for rule in policy["spec"]["ingress"] if {"port": 9464, "protocol": "TCP"} in rule["ports"]
    ]
    assert to_metrics == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"port": 9464, "protocol": "TCP"}],
        }
    ]
    assert not any({"port": 8787, "protocol": "TCP"} in rule["ports"] for rule in policy["spec"]["ingress"])


@pytest.mark.slow
def test_service_monitor_scrapes_the_gateways_metrics_port() -> None:
    docs = documents(render(ci_values("gateway-servicemonitor")))
    service = find(docs, "Service", "demo-ragtoll")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["metrics"]["port"] == 9464 and ports["metrics"]["targetPort"] == "metrics"
    assert port_names(ragtoll_container(docs))["metrics"] == 9464
    monitor = find(docs, "ServiceMonitor", "demo-ragtoll")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["agents"]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "5s"}
    # without its own port, the gateway's /metrics on the serving port
    docs = documents(render({"mode": "gateway", "metrics": {"serviceMonitor": {"enabled": True}}}))
    assert find(docs, "ServiceMonitor")["spec"]["endpoints"][0]["port"] == "ragtoll"
    assert "metrics" not in {p["name"] for p in find(docs, "Service")["spec"]["ports"]}
    assert validate(docs, "1.33") == []


@pytest.mark.parametrize("name", ["sidecar-metrics", "gateway-servicemonitor"])
def test_monitors_are_valid_for_their_crds_and_the_check_is_strict(name: str) -> None:
    docs = documents(render(ci_values(name)))
    assert validate(docs, "1.33") == []
    kind = "PodMonitor" if name.startswith("sidecar") else "ServiceMonitor"
    broken = json.loads(json.dumps(find(docs, kind)))
    endpoints = broken["spec"]["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
    endpoints[0]["interval"] = "30 seconds"
    endpoints[0]["prot"] = endpoints[0].pop("port")
    messages = sorted(e.message for e in operator_validator(kind).iter_errors(broken))
    assert len(messages) == 2, messages
    assert messages[0].startswith("'30 seconds' does not match")
    assert "('prot' was unexpected)" in messages[1]


def test_metrics_and_monitors_are_off_by_default() -> None:
    for values in (AGENT, {"mode": "gateway"}):
        docs = documents(render(values))
        assert not [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor")]
        assert "metrics_port" not in ragtoll_config(docs)["server"]
        assert set(port_names(ragtoll_container(docs))) == {"ragtoll"}
    text = notes(render({**AGENT, "prometheusRule": {"enabled": True}}))
    assert (
        "[WARNING] In sidecar mode ragtoll listens on 127.0.0.1, where Prometheus cannot scrape /metrics. "
        "Set metrics.enabled=true" in text
    )


def test_library_chart_exposes_the_metrics_port(tmp_path: Path) -> None:
    docs = documents(render({"ragtoll": {"metricsPort": 9464}}, chart=EXAMPLE))
    spec = find(docs, "Deployment", "demo-agent")["spec"]["template"]["spec"]
    assert port_names(by_name(list(containers(spec)), "ragtoll")) == {"ragtoll": 8787, "metrics": 9464}
    docs = documents(render({}, chart=EXAMPLE))
    spec = find(docs, "Deployment", "demo-agent")["spec"]["template"]["spec"]
    assert port_names(by_name(list(containers(spec)), "ragtoll")) == {"ragtoll": 8787}


REFUSED = [
    (
        {**AGENT, "metrics": {"serviceMonitor": {"enabled": True}}},
        "[ERROR] metrics.serviceMonitor needs mode=gateway: in sidecar mode ragtoll has no Service of its own.",
    ),
    (
        {**AGENT, "metrics": {"podMonitor": {"enabled": True}}},
        "[ERROR] metrics.podMonitor in sidecar mode needs metrics.enabled=true",
    ),
    (
        {**AGENT, "metrics": {"enabled": True, "port": 8787}},
        "[ERROR] metrics.port (server.metrics_port) is 8787, the port ragtoll serves calls on",
    ),
    (
        {
            "agent": {"image": {"repository": "a"}, "ports": [{"name": "prom", "containerPort": 9464}]},
            "metrics": {"enabled": True},
        },
        "[ERROR] agent.ports 'prom' uses port 9464, which ragtoll's metrics listener uses in the same pod",
    ),
]


@pytest.mark.parametrize(("values", "message"), REFUSED)
def test_metrics_values_that_cannot_work_are_refused_by_install_and_lint(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    assert message in str(caught.value)
    assert any(message in f for f in lint(values))


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"metrics": {"port": 0}}, "/metrics/port"),
        ({"metrics": {"podMonitor": {"interval": "30 seconds"}}}, "/metrics/podMonitor/interval"),
        ({"metrics": {"serviceMonitor": {"enable": True}}}, "/metrics/serviceMonitor"),
    ],
)
def test_schema_rejects_bad_metrics_values(values: dict[str, Any], where: str) -> None:
    assert any(f"at '{where}'" in f for f in lint({**AGENT, **values})), lint({**AGENT, **values})


def test_alert_on_calls_admitted_without_the_store() -> None:
    values = {
        **ci_values("prometheus-rule"),
        "prometheusRule": {
            **ci_values("prometheus-rule")["prometheusRule"],
            "degradedAdmissions": {"for": "5m", "severity": "page"},
        },
    }
    docs = documents(render(values))
    assert validate(docs, "1.33") == []
    rules = {r["alert"]: r for g in find(docs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    rule = rules["RagtollBudgetsNotEnforced"]
    assert rule["expr"] == (
        f'sum by (namespace, ragtoll_budget_degraded_bound) (rate({DEGRADED}{{namespace="agents"}}[5m])) > 0'
    )
    ast = promql_parser.parse(rule["expr"])
    assert isinstance(ast, promql_parser.BinaryExpr)
    assert (rule["for"], rule["labels"]) == ("5m", {"severity": "page", "team": "agents"})
    assert "{{ $labels.ragtoll_budget_degraded_bound }}" in rule["annotations"]["summary"]
    assert "on_store_error" in rule["annotations"]["runbook"] and len(rule["annotations"]["runbook"]) > 200
    # on by default with the PrometheusRule, critical; and it can be turned off alone
    default = find(
        documents(render({"mode": "gateway", "prometheusRule": {"enabled": True}})), "PrometheusRule"
    )
    default_rules = {r["alert"]: r for g in default["spec"]["groups"] for r in g["rules"]}
    assert default_rules["RagtollBudgetsNotEnforced"]["labels"]["severity"] == "critical"
    off = find(
        documents(
            render(
                {
                    "mode": "gateway",
                    "prometheusRule": {"enabled": True, "degradedAdmissions": {"enabled": False}},
                }
            )
        ),
        "PrometheusRule",
    )
    assert "RagtollBudgetsNotEnforced" not in {r["alert"] for g in off["spec"]["groups"] for r in g["rules"]}


def test_dashboard_panel_on_calls_admitted_without_the_store() -> None:
    cm = find(documents(render(ci_values("grafana-dashboard"))), "ConfigMap", "demo-ragtoll-dashboard")
    dashboard = json.loads(cm["data"]["ragtoll.json"])
    (panel,) = [
        p for p in dashboard["panels"] if p["title"] == "Calls admitted without the budget store (per second)"
    ]
    (target,) = panel["targets"]
    assert target["expr"] == (
        f'sum by (ragtoll_budget_degraded_bound) (rate({DEGRADED}{{namespace=~"$namespace"}}'
        "[$__rate_interval]))"
    )
    assert target["legendFormat"] == "bound: {{ragtoll_budget_degraded_bound}}"
    promql_parser.parse(target["expr"].replace("$__rate_interval", "5m").replace("$namespace", ".*"))
    # below the store row's panels, overlapping none
    store_row = next(p for p in dashboard["panels"] if p["type"] == "row" and p["title"] == "Budget store")
    assert panel["gridPos"]["y"] > store_row["gridPos"]["y"]
    boxes = [
        (p["gridPos"]["x"], p["gridPos"]["y"], p["gridPos"]["w"], p["gridPos"]["h"])
        for p in dashboard["panels"]
    ]
    for i, (x, y, w, h) in enumerate(boxes):
        for x2, y2, w2, h2 in boxes[i + 1 :]:
            assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y, (boxes[i], (x2, y2, w2, h2))


def test_chart_values_document_the_metrics_keys() -> None:
    values = yaml.safe_load((Path(__file__).parents[2] / "helm" / "ragtoll" / "values.yaml").read_text())
    assert values["metrics"]["enabled"] is False
    assert (
        values["metrics"]["serviceMonitor"]["enabled"] is False
        and values["metrics"]["podMonitor"]["enabled"] is False
    )
    assert values["prometheusRule"]["degradedAdmissions"]["enabled"] is True
