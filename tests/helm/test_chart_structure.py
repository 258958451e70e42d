"""What the rendered ragtoll chart means: the sidecar is there and ready before the agent, the agent's
env points at it, probes and ports follow `config.server.port`, pods are hardened, secrets are only
referenced, trace context is not sent upstream by default, and the ConfigMap's config is accepted by
`ragtoll check-config` itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import (
    CHART,
    CI_VALUES,
    EXAMPLE,
    by_name,
    ci_values,
    containers,
    documents,
    env_values,
    find,
    lint,
    notes,
    ragtoll_config,
    render,
    validate,
)

CI_NAMES = [p.name.removesuffix("-values.yaml") for p in CI_VALUES]


def pod_spec(
    docs: list[dict[str, Any]], kind: str = "Deployment", name: str = "demo-ragtoll"
) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, kind, name)["spec"]["template"]["spec"]
    return spec


def check_config(config: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "ragtoll.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGTOLL_")}
    return subprocess.run(
        [sys.executable, "-m", "ragtoll.proxy", "check-config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_native_sidecar_starts_ready_before_the_agent() -> None:
    spec = pod_spec(documents(render(ci_values("sidecar-native"))))
    [sidecar] = spec["initContainers"]
    assert sidecar["name"] == "ragtoll"
    assert sidecar["restartPolicy"] == "Always"
    # The kubelet starts the agent only once the sidecar's startupProbe passed.
    assert sidecar["startupProbe"]["exec"]["command"][-1].endswith(
        "'http://127.0.0.1:8787/readyz', timeout=2)"
    )
    assert [c["name"] for c in spec["containers"]] == ["agent"]


def test_classic_sidecar_is_first_and_holds_the_agent_until_ready() -> None:
    spec = pod_spec(documents(render(ci_values("sidecar-classic"))))
    assert "initContainers" not in spec
    ragtoll, agent = spec["containers"]
    assert (ragtoll["name"], agent["name"]) == ("ragtoll", "agent")
    assert "restartPolicy" not in ragtoll
    wait = ragtoll["lifecycle"]["postStart"]["exec"]["command"]
    assert wait[:2] == ["python", "-c"] and "http://127.0.0.1:8787/readyz" in wait[2]
    compile(wait[2], "postStart", "exec")  # the hook is valid Python
    # The agent's own secret env is kept, next to the wired env.
    assert env_values(agent)["OPENAI_API_KEY"] == {"secretKeyRef": {"name": "openai", "key": "api-key"}}


def test_agent_env_points_at_the_sidecar_routes() -> None:
    docs = documents(render(ci_values("sidecar-native")))
    agent = by_name(pod_spec(docs)["containers"], "agent")
    env = env_values(agent)
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8787/openai/v1"
    assert env["RAGTOLL_OPENAI_URL"] == "http://127.0.0.1:8787/openai"
    assert env["RAGTOLL_DOCS_URL"] == "http://127.0.0.1:8787/docs"
    assert env["RETRIEVER_URL"] == "http://127.0.0.1:8787/docs"  # agent.envFromRoutes
    assert env["OTEL_PROPAGATORS"] == "tracecontext,baggage"
    names = [e["name"] for e in agent["env"]]
    assert len(names) == len(set(names))


def test_agent_env_follows_prefixes_anthropic_and_the_agents_own_overrides() -> None:
    values = {
        "agent": {
            "image": {"repository": "a"},
            "env": [{"name": "OPENAI_BASE_URL", "value": "http://mine/v1"}],
        },
        "config": {
            "upstreams": [
                {
                    "name": "oai",
                    "kind": "llm",
                    "api": "openai",
                    "url": "https://api.openai.com",
                    "prefix": "/llm/oai",
                },
                {"name": "claude", "kind": "llm", "api": "anthropic", "url": "https://api.anthropic.com"},
                {"name": "rerank-v2", "kind": "rerank", "api": "passthrough", "url": "http://rerank:80"},
            ]
        },
    }
    agent = by_name(pod_spec(documents(render(values)))["containers"], "agent")
    env = env_values(agent)
    assert env["OPENAI_BASE_URL"] == "http://mine/v1"
    assert [e["name"] for e in agent["env"]].count("OPENAI_BASE_URL") == 1
    assert env["RAGTOLL_OAI_URL"] == "http://127.0.0.1:8787/llm/oai"
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8787/claude"
    assert env["RAGTOLL_RERANK_V2_URL"] == "http://127.0.0.1:8787/rerank-v2"


@pytest.mark.parametrize("mode", ["sidecar", "gateway"])
def test_ports_probes_and_env_follow_config_server_port(mode: str) -> None:
    values: dict[str, Any] = {"mode": mode, "config": {"server": {"port": 9100}}}
    if mode == "sidecar":
        values["agent"] = {"image": {"repository": "a"}}
    docs = documents(render(values))
    spec = pod_spec(docs)
    ragtoll = by_name(list(containers(spec)), "ragtoll")
    assert ragtoll["ports"] == [{"name": "ragtoll", "containerPort": 9100, "protocol": "TCP"}]
    assert ragtoll_config(docs)["server"]["port"] == 9100
    for probe, path in [
        ("startupProbe", "/readyz"),
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
    ]:
        handler = ragtoll[probe]
        if mode == "sidecar":
            # loopback bind: the kubelet cannot reach it, so the probe runs inside the container
            assert ragtoll_config(docs)["server"]["host"] == "127.0.0.1"
            assert f"'http://127.0.0.1:9100{path}'" in handler["exec"]["command"][2]
        else:
            assert ragtoll_config(docs)["server"]["host"] == "0.0.0.0"
            assert handler["httpGet"] == {"path": path, "port": "ragtoll"}
    if mode == "sidecar":
        assert (
            env_values(by_name(spec["containers"], "agent"))["OPENAI_BASE_URL"]
            == "http://127.0.0.1:9100/openai/v1"
        )
    else:
        service = find(docs, "Service", "demo-ragtoll")
        assert service["spec"]["ports"] == [
            {"name": "ragtoll", "port": 9100, "targetPort": "ragtoll", "protocol": "TCP"}
        ]
        assert service["spec"]["selector"] == find(docs, "Deployment")["spec"]["selector"]["matchLabels"]


def test_default_values_send_no_trace_context_or_baggage_upstream() -> None:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert defaults["config"]["upstreams"], "the default config should show an upstream"
    assert all(u.get("trusted", False) is False for u in defaults["config"]["upstreams"])
    config = ragtoll_config(documents(render({"agent": {"image": {"repository": "a"}}})))
    assert all(u.get("trusted", False) is False for u in config["upstreams"])
    for name in CI_NAMES:
        config = ragtoll_config(documents(render(ci_values(name))))
        assert not any(u.get("trusted") for u in config.get("upstreams", [])), name


@pytest.mark.parametrize("name", CI_NAMES)
def test_configmap_config_passes_ragtoll_check_config(name: str, tmp_path: Path) -> None:
    result = check_config(ragtoll_config(documents(render(ci_values(name)))), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok: ")


def test_a_config_mistake_the_schema_lets_through_is_caught_by_check_config(tmp_path: Path) -> None:
    docs = documents(
        render({"agent": {"image": {"repository": "a"}}, "config": {"budgets": {"mdoe": "shadow"}}})
    )
    result = check_config(ragtoll_config(docs), tmp_path)
    assert result.returncode == 2
    assert "Config 'budgets.mdoe' is not a known key." in result.stderr


def test_config_change_rolls_the_pods() -> None:
    def checksum(values: dict[str, Any]) -> str:
        annotations = find(documents(render(values)), "Deployment")["spec"]["template"]["metadata"][
            "annotations"
        ]
        return str(annotations["checksum/ragtoll-config"])

    base = ci_values("sidecar-native")
    assert checksum(base) == checksum(base)
    assert checksum(base) != checksum({**base, "config": {**base["config"], "budgets": {"mode": "shadow"}}})


@pytest.mark.parametrize("name", CI_NAMES)
def test_every_container_is_hardened(name: str) -> None:
    docs = documents(render(ci_values(name)))
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        spec = doc["spec"]["template"]["spec"]
        pod = spec.get("securityContext", {})
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"} or all(
            c["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"} for c in containers(spec)
        )
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"] == {"drop": ["ALL"]}, c["name"]
            if c["name"] == "agent":
                continue  # the user's image: only what cannot break an unknown agent
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, c["name"]
            assert c["resources"]["limits"]["memory"], c["name"]


def test_secrets_are_referenced_never_rendered() -> None:
    values = {
        **ci_values("gateway-redis"),
        "config": {"admin": {"token_env": "MY_ADMIN_TOKEN"}, "identity": {"mode": "jwt"}},
        "secrets": {
            "adminToken": {"existingSecret": "admin", "key": "t"},
            "jwtSecret": {"existingSecret": "jwt", "key": "s"},
            "jwks": {"existingSecret": "jwks", "key": "keys.json"},
            "budgetHmacKey": {"existingSecret": "hmac", "key": "k"},
        },
    }
    docs = documents(render(values))
    assert not [d for d in docs if d["kind"] == "Secret"]
    spec = pod_spec(docs)
    env = env_values(by_name(spec["containers"], "ragtoll"))
    assert env["MY_ADMIN_TOKEN"] == {"secretKeyRef": {"name": "admin", "key": "t"}}
    assert env["RAGTOLL_JWT_SECRET"] == {"secretKeyRef": {"name": "jwt", "key": "s"}}
    assert env["RAGTOLL_BUDGET_HMAC_KEY"] == {"secretKeyRef": {"name": "hmac", "key": "k"}}
    assert by_name(spec["volumes"], "ragtoll-jwks")["secret"] == {"secretName": "jwks"}
    assert ragtoll_config(docs)["identity"]["jwt"]["jwks_file"] == "/var/run/secrets/ragtoll/jwks/keys.json"
    assert validate(docs, "1.33") == []


def test_gateway_shares_the_builtin_redis() -> None:
    docs = documents(render(ci_values("gateway-redis")))
    assert ragtoll_config(docs)["store"] == "redis://demo-ragtoll-redis:6379/0"
    redis = find(docs, "StatefulSet", "demo-ragtoll-redis")
    assert redis["spec"]["replicas"] == 1
    assert find(docs, "Service", "demo-ragtoll-redis")["spec"]["ports"][0]["port"] == 6379
    hpa = find(docs, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 6)
    assert "replicas" not in find(docs, "Deployment", "demo-ragtoll")["spec"]  # the HPA owns it
    assert find(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_external_redis_url_from_a_secret_overrides_the_store() -> None:
    docs = documents(render(ci_values("networkpolicy")))
    env = env_values(by_name(pod_spec(docs)["containers"], "ragtoll"))
    assert env["RAGTOLL_STORE"] == {"secretKeyRef": {"name": "ragtoll-redis", "key": "url"}}
    docs = documents(
        render({"mode": "gateway", "externalRedis": {"url": "redis+cluster://redis-0.redis:6379"}})
    )
    env = env_values(by_name(pod_spec(docs)["containers"], "ragtoll"))
    assert env["RAGTOLL_STORE"] == "redis+cluster://redis-0.redis:6379"


def test_jaeger_receives_ragtoll_and_agent_otlp() -> None:
    rendered = render(ci_values("jaeger"))
    docs = documents(rendered)
    endpoint = "http://demo-ragtoll-jaeger.agents.svc:4318"
    spec = pod_spec(docs)
    assert env_values(by_name(spec["initContainers"], "ragtoll"))["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
    assert env_values(by_name(spec["containers"], "agent"))["OTEL_EXPORTER_OTLP_ENDPOINT"] == endpoint
    jaeger = pod_spec(docs, "Deployment", "demo-ragtoll-jaeger")["containers"][0]
    assert jaeger["image"].startswith("jaegertracing/jaeger:2.")
    ports = {p["name"]: p["containerPort"] for p in jaeger["ports"]}
    assert (ports["otlp-grpc"], ports["otlp-http"], ports["ui"]) == (4317, 4318, 16686)
    jaeger_config = yaml.safe_load(find(docs, "ConfigMap", "demo-ragtoll-jaeger")["data"]["config.yaml"])
    assert jaeger_config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    assert "memory" in jaeger_config["extensions"]["jaeger_storage"]["backends"]["memstore"]
    text = notes(rendered)
    assert "kubectl -n agents port-forward svc/demo-ragtoll-jaeger 16686:16686" in text


def test_networkpolicy_opens_only_the_serving_port() -> None:
    docs = documents(render(ci_values("networkpolicy")))
    policy = find(docs, "NetworkPolicy", "demo-ragtoll")
    [rule] = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8787, "protocol": "TCP"}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}]
    assert (
        policy["spec"]["podSelector"]["matchLabels"]
        == find(docs, "Deployment", "demo-ragtoll")["spec"]["selector"]["matchLabels"]
    )
    egress_ports = [p["port"] for r in policy["spec"]["egress"] for p in r["ports"]]
    assert egress_ports[:2] == [53, 53] and {4317, 4318, 443, 6379} <= set(egress_ports)
    jaeger_policy = find(docs, "NetworkPolicy", "demo-ragtoll-jaeger")
    assert jaeger_policy["spec"]["ingress"][0]["ports"] == [
        {"port": 4317, "protocol": "TCP"},
        {"port": 4318, "protocol": "TCP"},
    ]


def test_notes_tell_how_to_reach_agent_and_admin() -> None:
    text = notes(render(ci_values("sidecar-native")))
    assert "OPENAI_BASE_URL=http://127.0.0.1:8787/openai/v1" in text
    assert "kubectl -n agents port-forward deploy/demo-ragtoll 8787:8787" in text
    assert 'curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:8787/admin/tasks/' in text
    text = notes(render(ci_values("gateway-redis")))
    assert "http://demo-ragtoll.agents.svc:8787/openai" in text


@pytest.mark.parametrize("native", [True, False])
def test_library_example_chart(native: bool, tmp_path: Path) -> None:
    docs = documents(render({"ragtoll": {"native": native}}, chart=EXAMPLE))
    spec = pod_spec(docs, "Deployment", "demo-agent")
    ragtoll = by_name(list(containers(spec)), "ragtoll")
    assert (ragtoll.get("restartPolicy") == "Always") is native
    assert ("lifecycle" in ragtoll) is not native
    env = env_values(by_name(spec["containers"], "agent"))
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8787/openai/v1"
    assert env["RETRIEVER_URL"] == "http://127.0.0.1:8787/docs"
    for version in ("1.29", "1.33"):
        assert validate(docs, version) == []
    assert (validate(docs, "1.27") == []) is not native
    config = yaml.safe_load(find(docs, "ConfigMap", "demo-ragtoll")["data"]["ragtoll.yaml"])
    result = check_config(config, tmp_path)
    assert result.returncode == 0, result.stderr


def test_library_and_example_charts_lint_strict_clean() -> None:
    assert lint(chart=EXAMPLE) == []
    assert lint(chart=CHART.parent / "ragtoll-sidecar") == []


def _bytes(quantity: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", quantity).groups()  # type: ignore[union-attr]
    return int(number) * {None: 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}[unit]


@pytest.mark.parametrize(
    ("values", "max_bytes", "keep"),
    [
        ({"agent": {"image": {"repository": "a"}}}, 16 * 1024**2, 3),  # ragtoll's defaults
        (ci_values("records-rotation"), 32 * 1024**2, 5),
        ({"mode": "gateway", "config": {"budgets": {"records_max_bytes": 100_000, "records_keep": 1}}}, 100_000, 1),
    ],
)
def test_records_volume_holds_every_rotated_file(values: dict[str, Any], max_bytes: int, keep: int) -> None:
    docs = documents(render(values))
    spec = pod_spec(docs)
    ragtoll = by_name(list(containers(spec)), "ragtoll")
    records_file = env_values(ragtoll)["RAGTOLL_BUDGETS__RECORDS_FILE"]
    [mount] = [m for m in ragtoll["volumeMounts"] if records_file.startswith(m["mountPath"] + "/")]
    limit = _bytes(by_name(spec["volumes"], mount["name"])["emptyDir"]["sizeLimit"])
    budgets = ragtoll_config(docs).get("budgets", {})
    assert (budgets.get("records_max_bytes", 16 * 1024**2), budgets.get("records_keep", 3)) == (max_bytes, keep)
    # the records file and `keep` rotated files at most max_bytes each, and scratch room besides
    assert (keep + 1) * max_bytes + 16 * 1024**2 <= limit <= (keep + 1) * max_bytes + 64 * 1024**2
