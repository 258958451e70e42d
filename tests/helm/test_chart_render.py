"""The ragtoll chart renders, lints strictly and validates against real Kubernetes schemas, offline.

Each helm/ragtoll/ci/*-values.yaml is rendered by Helm v4 (helm-python-sdk, in-process) and every
document is checked by kubernetes-validate's strict schemas for 1.29, 1.33 and the newest bundled
version. Bad values are rejected by values.schema.json or by the checks in _validate.tpl, under
`helm template` and `helm lint` alike, with a message that names the key and the fix.
"""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml
from helm_render import (
    CHART,
    CI_VALUES,
    GOLDEN,
    KUBE_VERSIONS,
    ROOT,
    ci_values,
    documents,
    golden_files,
    lint,
    render,
    validate,
)

CI_NAMES = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]


def test_every_feature_has_a_ci_values_file() -> None:
    assert set(CI_NAMES) >= {"sidecar-native", "sidecar-classic", "gateway-redis", "jaeger", "networkpolicy",
                             "records-rotation", "grafana-dashboard", "prometheus-rule"}


@pytest.mark.parametrize("name", CI_NAMES)
def test_ci_values_lint_strict_clean(name: str) -> None:
    assert lint(ci_values(name)) == []


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", CI_NAMES)
def test_ci_values_validate_against_kubernetes(name: str, version: str) -> None:
    docs = documents(render(ci_values(name)))
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ConfigMap", "ServiceAccount"} <= kinds
    assert validate(docs, version) == []


def test_newest_schema_is_newer_than_the_named_versions() -> None:
    # KUBE_VERSIONS[-1] comes from the installed kubernetes-validate; make sure it is a real third version.
    newest = tuple(int(p) for p in KUBE_VERSIONS[-1].split(".")[:2])
    assert newest > (1, 33)


def test_native_sidecar_is_rejected_by_kubernetes_1_27_and_classic_is_not() -> None:
    native = validate(documents(render(ci_values("sidecar-native"))), "1.27")
    expected = (
        "Deployment/demo-ragtoll: spec/template/spec/initContainers/0: "
        "Additional properties are not allowed ('restartPolicy' was unexpected)"
    )
    assert native == [expected]
    assert validate(documents(render(ci_values("sidecar-classic"))), "1.27") == []


def test_validation_catches_a_broken_manifest() -> None:
    # The validator is not a rubber stamp: a typo'd field in a rendered object is reported.
    docs = documents(render(ci_values("gateway-redis")))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    problems = validate(docs, "1.33")
    assert len(problems) == 1 and "'imagePullPolcy' was unexpected" in problems[0]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"mode": "daemonset"}, "at '/mode': value must be one of 'sidecar', 'gateway'"),
        ({"replicas": 3}, "at '': additional properties 'replicas' not allowed"),
        (
            {"agent": {"image": {"repository": "a", "tagg": "1"}}},
            "at '/agent/image': additional properties 'tagg' not allowed",
        ),
        ({"sidecar": {"native": "yes"}}, "at '/sidecar/native': got string, want boolean"),
        (
            {"otel": {"protocol": "http/json"}},
            "at '/otel/protocol': value must be one of 'http/protobuf', 'grpc'",
        ),
        ({"config": {"store": "mongodb://db"}}, "at '/config/store': 'mongodb://db' does not match pattern"),
        (
            {"config": {"upstreams": [{"name": "x", "kind": "llmm", "url": "https://x"}]}},
            "at '/config/upstreams/0/kind': value must be one of 'llm', 'embeddings', 'retrieval', 'rerank', 'other'",
        ),
        (
            {"networkPolicy": {"enabeld": True}},
            "at '/networkPolicy': additional properties 'enabeld' not allowed",
        ),
        (
            {"config": {"budgets": {"records_max_bytes": 1000}}},
            "at '/config/budgets/records_max_bytes': minimum: got 1,000, want 65,536",
        ),
    ],
)
def test_schema_rejects_bad_values_with_the_key(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render({**ci_values("sidecar-native"), **values})
    assert message in str(caught.value)
    # `helm lint --strict` reports the same violation.
    assert any(message in finding for finding in lint({**ci_values("sidecar-native"), **values}))


AGENT = {"agent": {"image": {"repository": "registry.example.com/agent"}}}

# Value sets the chart refuses (templates/_validate.tpl), each with the start of its message.
REFUSED = [
    (
        {"mode": "sidecar"},
        "[ERROR] mode=sidecar renders your agent's Deployment and needs agent.image.repository",
    ),
    (
        {"mode": "gateway", "replicaCount": 2},
        "[ERROR] mode=gateway with several replicas (replicaCount > 1 or autoscaling.enabled) needs a shared store",
    ),
    (
        {"mode": "gateway", "autoscaling": {"enabled": True}},
        "[ERROR] mode=gateway with several replicas (replicaCount > 1 or autoscaling.enabled) needs a shared store",
    ),
    (
        {**AGENT, "redis": {"enabled": True}, "externalRedis": {"url": "redis://elsewhere:6379/0"}},
        "[ERROR] redis.enabled starts a built-in Redis, but an external store is also set",
    ),
    (
        {**AGENT, "redis": {"enabled": True}, "config": {"store": "redis+cluster://redis-0.redis:6379"}},
        "[ERROR] redis.enabled starts a built-in Redis, but an external store is also set",
    ),
    (
        {**AGENT, "externalRedis": {"url": "redis://r:6379/0", "existingSecret": "redis-url"}},
        "[ERROR] externalRedis.url and externalRedis.existingSecret are both set",
    ),
    (
        {"mode": "gateway", "config": {"server": {"host": "127.0.0.1"}}},
        "[ERROR] mode=gateway needs ragtoll to accept connections from its Service, but config.server.host is 127.0.0.1",
    ),
    (
        {**AGENT, "jaeger": {"enabled": True}, "otel": {"endpoint": "http://collector:4318"}},
        "[ERROR] jaeger.enabled points OTLP export at the built-in Jaeger, but otel.endpoint is also set",
    ),
    (
        {**AGENT, "configMap": {"create": True, "existingName": "mine"}},
        "[ERROR] configMap.create=true and configMap.existingName are both set",
    ),
    (
        {"agent": {"image": {"repository": "a"}, "envFromRoutes": {"dcos": "RETRIEVER_URL"}}},
        "[ERROR] agent.envFromRoutes names upstream 'dcos', which is not in config.upstreams (openai)",
    ),
    (
        {"agent": {"image": {"repository": "a"}, "ports": [{"name": "http", "containerPort": 8787}]}},
        "[ERROR] agent.ports 'http' uses port 8787, which ragtoll listens on in the same pod",
    ),
    (
        {**AGENT, "configMap": {"create": False}},
        "[ERROR] configMap.create=false needs configMap.existingName",
    ),
    (
        {**AGENT, "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}},
        "[ERROR] autoscaling.minReplicas is greater than autoscaling.maxReplicas.",
    ),
    (
        {**AGENT, "podDisruptionBudget": {"enabled": True, "minAvailable": 1, "maxUnavailable": 1}},
        "[ERROR] podDisruptionBudget sets both minAvailable and maxUnavailable",
    ),
]


@pytest.mark.parametrize(("values", "message"), REFUSED)
def test_contradictory_values_fail_with_the_fix(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    assert message in str(caught.value)


@pytest.mark.parametrize(("values", "message"), REFUSED)
def test_contradictory_values_fail_helm_lint(values: dict[str, Any], message: str) -> None:
    # Helm's `fail` is a no-op under `helm lint`; ragtoll-sidecar.fail makes lint report it too.
    findings = lint(values)
    assert any(message in f for f in findings), findings


@pytest.mark.parametrize(("values", "message"), REFUSED)
def test_a_refusal_reads_as_the_same_one_line_in_helm_install_and_helm_lint(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    line = str(caught.value)
    assert line.startswith("execution error at (ragtoll/templates/deployment.yaml:") and message in line
    assert "\n" not in line
    findings = lint(values)
    assert findings == [f"templates/: {line}", line]  # the lint message, and the error it reports


def test_default_values_refusal_names_the_value_to_set() -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render({})
    assert str(caught.value) == (
        "execution error at (ragtoll/templates/deployment.yaml:2:4): [ERROR] mode=sidecar renders your agent's "
        "Deployment and needs agent.image.repository (your agent's image). Set it, or use mode=gateway to run "
        "ragtoll alone.")
    assert lint({})[-1] == str(caught.value)


def test_the_install_takes_your_own_image_as_a_value() -> None:
    # the --set string docs/kubernetes.md passes, parsed as helm parses it
    values = helm.parse_set_string("image.repository=registry.example.com/acme/ragtoll,image.tag=0.1.0-acme")
    values["agent"] = {"image": {"repository": "registry.example.com/acme/rag-agent"}}
    docs = documents(render(values))
    spec = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    ragtoll = next(c for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] == "ragtoll")
    assert ragtoll["image"] == "registry.example.com/acme/ragtoll:0.1.0-acme"


def test_the_image_workflow_builds_the_dockerfile_and_pushes_it() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "image.yml").read_text())
    steps = workflow["jobs"]["image"]["steps"]
    build = next(s for s in steps if s.get("uses", "").startswith("docker/build-push-action@"))
    assert (build["with"]["context"], build["with"]["file"], build["with"]["push"]) == (".", "Dockerfile", True)
    assert (ROOT / build["with"]["file"]).is_file()
    meta = next(s for s in steps if s.get("uses", "").startswith("docker/metadata-action@"))
    assert meta["with"]["images"] == "ghcr.io/${{ github.repository_owner }}/ragtoll"
    assert workflow["permissions"]["packages"] == "write"


def test_gateway_with_redis_and_several_replicas_is_fine() -> None:
    render({"mode": "gateway", "replicaCount": 3, "redis": {"enabled": True}})
    render({"mode": "gateway", "replicaCount": 3, "externalRedis": {"existingSecret": "redis-url"}})
    render({"mode": "gateway", "replicaCount": 3, "config": {"store": "redis+cluster://redis:6379"}})


def test_chart_metadata() -> None:
    chart = helm.Chart.load(CHART)
    assert chart.metadata["apiVersion"] == "v2"
    assert chart.metadata["type"] == "application"
    assert [d["name"] for d in chart.dependencies] == ["ragtoll-sidecar"]
    schema = chart.schema
    assert schema is not None and schema["additionalProperties"] is False


@pytest.mark.parametrize("name", CI_NAMES)
def test_golden_renders_are_current(name: str) -> None:
    for file_name, text in golden_files(name).items():
        golden = GOLDEN / name / file_name
        assert golden.exists(), f"{golden} is missing: run `python tests/helm/helm_render.py`"
        assert golden.read_text() == text, (
            f"{golden} differs from the chart's rendering: review the change, then regenerate with "
            "`python tests/helm/helm_render.py`"
        )
