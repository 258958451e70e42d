"""The chart's Grafana dashboard and PrometheusRule watch series ragtoll really exports.

The exported names come from a real run, not a list: `ragtoll serve` (what the chart's container
runs) in front of the loopback fake upstream, called until every series exists (a call, a budget
rejection, a cache miss and hit, an upstream that is down, idle tasks ending), and two whose Redis
store is unreachable, with `on_store_error: closed` (503 store_unavailable) and `open` (a call
admitted without the store). Their
`/metrics` is scraped and parsed with prometheus_client's parser. Every PromQL expression of the
dashboard and the rules is parsed by promql-parser (a port of Prometheus' own parser); each
selector's metric, the label names it matches, groups or joins on, and each value it matches
exactly must appear in the scrape. The PrometheusRule is checked against the CRD's schema
(helm_render.prometheus_rule_validator).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from helm_render import ci_values, documents, find, lint, notes, prometheus_rule_validator, render, validate
from prometheus_client.parser import text_string_to_metric_families
from support.poll import wait_until
from support.servers import free_port, serve_in_thread
from support.upstream import UpstreamApp

# Labels a Prometheus adds to every series it scrapes from Kubernetes (the Prometheus Operator's
# ServiceMonitor/PodMonitor discovery): not in ragtoll's /metrics, but there to select on.
TARGET_LABELS = frozenset({"namespace"})
# Grafana's built-in interval variables, given a value so the expressions parse as PromQL.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is our refund policy?"}]}


@dataclass
class Exported:
    """What ragtoll's /metrics held: sample name -> label name -> the values seen."""

    series: dict[str, dict[str, set[str]]] = field(default_factory=dict)

    def add(self, text: str) -> None:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = self.series.setdefault(sample.name, {})
                for key, value in sample.labels.items():
                    labels.setdefault(key, set()).add(value)

    @property
    def label_names(self) -> set[str]:
        return {key for labels in self.series.values() for key in labels}


def ended_tasks(text: str) -> int:
    """How many tasks ended, as /metrics counts them (the task cost histogram's observations)."""
    return int(sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name.startswith("ragtoll_task_cost") and sample.name.endswith("_count")))


def _serve_and_scrape(config: dict[str, Any], calls: list[tuple[Any, ...]], tmp: Path, ended: int = 0) -> str:
    """Run `ragtoll serve` with `config`, make `calls` (path, JSON body, task id[, more headers]),
    return /metrics once `ended` tasks have ended (idle tasks end within the sweep interval)."""
    port = free_port()
    path = tmp / f"ragtoll-{port}.yaml"
    path.write_text(yaml.safe_dump({**config, "server": {"port": port}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAGTOLL_", "OTEL_"))}
    env["OTEL_TRACES_EXPORTER"] = env["OTEL_METRICS_EXPORTER"] = "none"
    proc = subprocess.Popen([sys.executable, "-m", "ragtoll.proxy", "serve", "--config", str(path)], env=env,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=10) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if http.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, "ragtoll serve did not start"
                time.sleep(0.05)
            statuses = [http.post(base + p, json=body, headers={"x-ragtoll-task-id": task, **extra}).status_code
                        for p, body, task, *more in calls for extra in (more[0] if more else {},)]
            wait_until(lambda: ended_tasks(http.get(f"{base}/metrics").text) >= ended, timeout=15, interval=0.1)
            text = http.get(f"{base}/metrics").text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert statuses, statuses
    return text


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    tmp = tmp_path_factory.mktemp("scrape")
    out = Exported()
    with serve_in_thread(UpstreamApp()) as up:
        working = {
            "upstreams": [
                {"name": "openai", "kind": "llm", "api": "openai", "url": up, "prefix": "/openai"},
                {"name": "docs", "kind": "retrieval", "api": "json", "url": up, "prefix": "/docs"},
                {"name": "down", "kind": "llm", "api": "openai", "url": f"http://127.0.0.1:{free_port()}"},
            ],
            "tasks": {"idle_timeout_s": 0.2},
            "pricing": {"gpt-4o-mini": {"input_per_mtok": 0.15, "output_per_mtok": 0.6}, "docs": {"per_call": 0.0005}},
            "budgets": {"records_file": str(tmp / "records.jsonl"), "default_profile": "one",
                        "profiles": {"one": {"max_steps": 1}}},
        }
        search = {"query": "refund policy", "top_k": 3}
        calls = [("/openai/v1/chat/completions", CHAT, "t1"), ("/openai/v1/chat/completions", CHAT, "t1"),
                 ("/docs/search", search, "t2"), ("/docs/search", search, "t2"),
                 ("/down/v1/chat/completions", CHAT, "t3"),
                 # a search, then an answer its chunk ("chunk 0 about refund policy") backs: graded
                 ("/docs/search", search, "t6"),
                 ("/openai/v1/chat/completions", CHAT, "t6", {"x-test-answer": "Chunk 0 covers the refund."})]
        out.add(_serve_and_scrape(working, calls, tmp, ended=4))
        store_down = {
            "store": f"redis://127.0.0.1:{free_port()}/0", "on_store_error": "closed", "store_timeout_ms": 100,
            "upstreams": [{"name": "openai", "kind": "llm", "api": "openai", "url": up, "prefix": "/openai"}],
        }
        out.add(_serve_and_scrape(store_down, [("/openai/v1/chat/completions", CHAT, "t4")], tmp))
        # on_store_error: open (the default): the call is forwarded, counted as admitted without the store
        store_down_open = {**store_down, "on_store_error": "open"}
        out.add(_serve_and_scrape(store_down_open, [("/openai/v1/chat/completions", CHAT, "t5")], tmp))
        # a records file that cannot be written: the task ends, its record is counted lost
        unwritable = {**working, "budgets": {**working["budgets"], "records_file": str(tmp / "missing" / "r.jsonl")}}
        lost = _serve_and_scrape(unwritable, [("/openai/v1/chat/completions", CHAT, "t7")], tmp, ended=1)
        assert re.search(r"^ragtoll_task_records_lost_total(\{[^}]*\})? 1\.0$", lost, re.MULTILINE), lost
        out.add(lost)
    yield out


def rendered(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The dashboard (parsed from its ConfigMap) and the PrometheusRule of a rendering."""
    docs = documents(render(values))
    dashboard = json.loads(find(docs, "ConfigMap", "demo-ragtoll-dashboard")["data"]["ragtoll.json"])
    return dashboard, find(docs, "PrometheusRule", "demo-ragtoll")


def all_enabled() -> dict[str, Any]:
    return {**ci_values("grafana-dashboard"), "prometheusRule": ci_values("prometheus-rule")["prometheusRule"]}


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable, Grafana variables filled in."""
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":  # label_values(<metric>, <label>): a Grafana function over a selector
            metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"]).groups()  # type: ignore[union-attr]
            queries.append((f"variable {var['name']}", f"count by ({label}) ({metric})"))
    filled = []
    for where, expr in queries:
        for name, value in GRAFANA_INTERVALS.items():
            expr = expr.replace(name, value)
        for name in variables:  # a template variable is a regex over label values
            expr = expr.replace(f"${{{name}}}", ".*").replace(f"${name}", ".*")
        assert "$" not in expr, f"{where}: undefined Grafana variable in {expr}"
        filled.append((where, expr))
    return filled


def rule_queries(rule: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f"rule {r['alert']}", r["expr"]) for g in rule["spec"]["groups"] for r in g["rules"]]


def problems_of(where: str, expr: str, exported: Exported) -> list[str]:
    """What in `expr` ragtoll does not export: metric names, label names, exactly matched values."""
    try:
        ast = promql_parser.parse(expr)
    except ValueError as exc:
        return [f"{where}: not PromQL ({exc}): {expr}"]
    problems: list[str] = []
    known_labels = exported.label_names | TARGET_LABELS

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            labels = exported.series.get(node.name)
            if labels is None:
                problems.append(f"{where}: metric {node.name} is not exported")
                return True
            for m in node.matchers.matchers:
                if m.name in TARGET_LABELS:
                    continue
                if m.name not in labels:
                    problems.append(f"{where}: {node.name} has no label {m.name}")
                    continue
                values = [m.value] if m.op == promql_parser.MatchOp.Equal else (
                    m.value.split("|") if m.op == promql_parser.MatchOp.Re and re.fullmatch(r"[\w|]+", m.value) else [])
                problems.extend(f"{where}: {node.name} never has {m.name}={v!r} (seen: {sorted(labels[m.name])})"
                                for v in values if v not in labels[m.name])
        grouping: list[str] = []
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            grouping = list(node.modifier.labels)
        if isinstance(node, promql_parser.BinaryExpr) and node.modifier is not None:
            if node.modifier.matching is not None:
                grouping += list(node.modifier.matching.labels)
            grouping += list(node.modifier.group_labels or [])  # group_left (...) / group_right (...)
        problems.extend(f"{where}: no exported series has label {name}" for name in grouping
                        if name not in known_labels)
        return True

    promql_parser.walk(ast, visit)
    return problems


def legend_problems(dashboard: dict[str, Any], exported: Exported) -> list[str]:
    known = exported.label_names | TARGET_LABELS
    return [f"panel {p['title']!r}: legend label {name} is not exported"
            for p in dashboard["panels"] for t in p.get("targets", [])
            for name in re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")) if name not in known]


@pytest.mark.slow
def test_the_scrape_is_a_real_one(exported: Exported) -> None:
    # The fixture produced what the checks below rely on; otherwise they would check little.
    assert {"ragtoll_calls_total", "ragtoll_rejections_total", "ragtoll_cost_USD_total",
            "ragtoll_cache_lookups_total", "ragtoll_proxy_overhead_seconds_bucket",
            "ragtoll_task_cost_USD_bucket", "gen_ai_client_operation_duration_seconds_count"} <= set(exported.series)
    assert exported.series["ragtoll_cache_lookups_total"]["ragtoll_cache_result"] == {"hit", "miss"}
    assert {"store_unavailable", "upstream_unavailable"} <= \
        exported.series["gen_ai_client_operation_duration_seconds_count"]["error_type"]


@pytest.mark.slow
def test_every_dashboard_and_rule_query_names_what_ragtoll_exports(exported: Exported) -> None:
    dashboard, rule = rendered(all_enabled())
    queries = dashboard_queries(dashboard) + rule_queries(rule)
    assert len(queries) >= 18
    problems = [p for where, expr in queries for p in problems_of(where, expr, exported)]
    assert problems + legend_problems(dashboard, exported) == []


@pytest.mark.slow
def test_the_check_catches_a_query_ragtoll_does_not_answer(exported: Exported) -> None:
    # Not a rubber stamp: a misspelt metric, a label the metric lacks, a value it never has, bad PromQL.
    assert problems_of("q", "sum(rate(ragtoll_cost_usd_total[5m]))", exported) == [
        "q: metric ragtoll_cost_usd_total is not exported"]
    assert problems_of("q", 'ragtoll_calls_total{ragtoll_budget_mode="enforce"}', exported) == [
        "q: ragtoll_calls_total has no label ragtoll_budget_mode"]
    assert problems_of("q", 'ragtoll_calls_total{ragtoll_outcome="refused"}', exported)[0].startswith(
        "q: ragtoll_calls_total never has ragtoll_outcome='refused'")
    assert problems_of("q", "sum by (ragtoll_task_id) (ragtoll_calls_total)", exported) == [
        "q: no exported series has label ragtoll_task_id"]
    assert problems_of("q", "ragtoll_calls_total / on (pod) group_left (trace_id) ragtoll_calls_total",
                       exported) == ["q: no exported series has label pod", "q: no exported series has label trace_id"]
    assert problems_of("q", "sum(rate(ragtoll_calls_total[5m])", exported)[0].startswith("q: not PromQL")


def test_dashboard_shows_what_an_operator_watches() -> None:
    dashboard, _ = rendered(all_enabled())
    assert dashboard["uid"] and dashboard["title"] == "ragtoll"
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"datasource", "namespace"}
    panels = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in dashboard["panels"]}
    assert all(t["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] for t in p.get("targets", []))
    wanted = {
        "Spend per upstream and model (USD/hour)": "sum by (ragtoll_upstream, gen_ai_request_model) (rate(ragtoll_cost_USD_total",
        "Rejections by dimension (per second)": "sum by (ragtoll_budget_exceeded_dimension, ragtoll_budget_mode) (rate(ragtoll_rejections_total",
        "Cache hit rate": 'ragtoll_cache_lookups_total{ragtoll_cache_result="hit"',
        "Cache lookups by result and tier (per second)": "sum by (ragtoll_cache_result, ragtoll_cache_tier)",
        "Added latency (p50, p95, p99)": "rate(ragtoll_proxy_overhead_seconds_bucket",
        "Calls refused: budget store unavailable (per second)": 'error_type="store_unavailable"',
        "Calls admitted without the budget store (per second)": "ragtoll_budget_degraded_admissions_total",
        "Cached input share": "rate(ragtoll_task_cached_input_tokens_total",
        "Evidence tokens resent": "rate(ragtoll_task_evidence_resent_tokens_total",
        "Groundedness of answers": "rate(ragtoll_task_groundedness_sum",
    }
    for title, fragment in wanted.items():
        assert any(fragment in expr for expr in panels[title]), (title, panels[title])
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_configmap_is_off_by_default_and_configurable() -> None:
    default = documents(render({"agent": {"image": {"repository": "a"}}}))
    assert not [d for d in default if d["kind"] == "PrometheusRule" or d["metadata"]["name"].endswith("-dashboard")]
    cm = find(documents(render(ci_values("grafana-dashboard"))), "ConfigMap", "demo-ragtoll-dashboard")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert json.loads(cm["data"]["ragtoll.json"]) == json.loads(
        (Path(__file__).parents[2] / "helm" / "ragtoll" / "dashboards" / "ragtoll.json").read_text())
    values = {**ci_values("grafana-dashboard"),
              "grafanaDashboard": {"enabled": True, "label": "example.com/dashboard", "labelValue": "ragtoll"}}
    cm = find(documents(render(values)), "ConfigMap", "demo-ragtoll-dashboard")
    assert cm["metadata"]["labels"]["example.com/dashboard"] == "ragtoll" and "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["namespace"] == "agents"
    assert validate(documents(render(values)), "1.33") == []


def test_rules_have_severities_runbooks_and_the_configured_thresholds() -> None:
    _, rule = rendered(all_enabled())
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(rules) == {"RagtollBudgetRejectionsSpike", "RagtollBudgetStoreDegraded", "RagtollBudgetsNotEnforced",
                          "RagtollTaskRecordsLost", "RagtollSpendRateHigh"}
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for name, r in rules.items():
        assert r["labels"]["severity"] in {"warning", "critical"} and r["labels"]["team"] == "agents", name
        assert {"summary", "description", "runbook"} <= set(r["annotations"]), name
        assert len(r["annotations"]["runbook"]) > 200, name  # says what to do, not just what broke
        assert 'namespace="agents"' in r["expr"], name
    assert rules["RagtollBudgetStoreDegraded"]["labels"]["severity"] == "critical"
    assert rules["RagtollBudgetsNotEnforced"]["labels"]["severity"] == "critical"
    assert rules["RagtollSpendRateHigh"]["expr"].endswith("* 3600 > 25")  # prometheusRule.costRate.usdPerHour
    assert ") > 0.2\n" in rules["RagtollBudgetRejectionsSpike"]["expr"]
    assert "20%" in rules["RagtollBudgetRejectionsSpike"]["annotations"]["description"]
    # Prometheus' own templating reaches the rule unexpanded by Helm
    assert "{{ $labels.namespace }}" in rules["RagtollSpendRateHigh"]["annotations"]["summary"]
    assert rules["RagtollTaskRecordsLost"]["expr"] == (
        'sum by (namespace) (increase(ragtoll_task_records_lost_total{namespace="agents"}[10m])) > 0')
    assert rules["RagtollTaskRecordsLost"]["labels"]["severity"] == "warning"

    values = {"mode": "gateway", "prometheusRule": {
        "enabled": True, "seriesSelector": "", "rejectionSpike": {"ratio": 0.05, "minCalls": 100},
        "storeDegraded": {"enabled": False}, "degradedAdmissions": {"enabled": False},
        "recordsLost": {"enabled": False}, "costRate": {"usdPerHour": 2.5, "for": "1h", "severity": "info"}}}
    rule = find(documents(render(values)), "PrometheusRule", "demo-ragtoll")
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(rules) == {"RagtollBudgetRejectionsSpike", "RagtollSpendRateHigh"}
    assert rules["RagtollSpendRateHigh"]["expr"] == \
        "sum by (namespace) (rate(ragtoll_cost_USD_total{}[15m])) * 3600 > 2.5"
    assert (rules["RagtollSpendRateHigh"]["for"], rules["RagtollSpendRateHigh"]["labels"]) == ("1h", {"severity": "info"})
    assert ") > 0.05\n" in rules["RagtollBudgetRejectionsSpike"]["expr"]
    assert rules["RagtollBudgetRejectionsSpike"]["expr"].endswith(">= 100")
    assert "namespace=" not in rules["RagtollBudgetRejectionsSpike"]["expr"]
    for r in rules.values():
        promql_parser.parse(r["expr"])


@pytest.mark.parametrize("version", ["1.29", "1.33"])
def test_prometheus_rule_is_valid_for_the_crd_and_the_check_is_strict(version: str) -> None:
    docs = documents(render(all_enabled()))
    assert validate(docs, version) == []
    rule = find(docs, "PrometheusRule", "demo-ragtoll")
    broken = json.loads(json.dumps(rule))
    first, second, third, *_ = broken["spec"]["groups"][0]["rules"]
    first["for"] = "10 minutes"
    second["anotations"] = second.pop("annotations")
    del third["expr"]
    messages = sorted(e.message for e in prometheus_rule_validator().iter_errors(broken))
    assert messages == [
        "'10 minutes' does not match '^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$'",
        "'expr' is a required property",
        "Additional properties are not allowed ('anotations' was unexpected)",
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prometheusRule": {"costRate": {"usdPerHour": 0}}}, "at '/prometheusRule/costRate/usdPerHour'"),
        ({"prometheusRule": {"rejectionSpike": {"for": "10 minutes"}}}, "at '/prometheusRule/rejectionSpike/for'"),
        ({"prometheusRule": {"storeDegraded": {"severty": "page"}}},
         "at '/prometheusRule/storeDegraded': additional properties 'severty' not allowed"),
        ({"grafanaDashboard": {"label": "not a label"}}, "at '/grafanaDashboard/label'"),
    ],
)
def test_schema_rejects_bad_monitoring_values(values: dict[str, Any], message: str) -> None:
    findings = lint({"agent": {"image": {"repository": "a"}}, **values})
    assert any(message in f for f in findings), findings


def test_notes_say_where_the_dashboard_is_and_how_metrics_reach_prometheus() -> None:
    text = notes(render(ci_values("grafana-dashboard")))
    assert "ConfigMap demo-ragtoll-dashboard in namespace monitoring, labelled grafana_dashboard=1" in text
    assert "[WARNING] In sidecar mode ragtoll listens on 127.0.0.1, where Prometheus cannot scrape /metrics." in text
    text = notes(render(ci_values("prometheus-rule")))
    assert "PrometheusRule demo-ragtoll in namespace agents" in text
    assert 'have Prometheus scrape Service demo-ragtoll, port "ragtoll", path /metrics' in text
