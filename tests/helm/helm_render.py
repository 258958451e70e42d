"""Offline chart tooling for the Helm tests: render and lint with helm-python-sdk (Helm v4's Go SDK
loaded in-process through ctypes; no helm binary, no cluster, no network) and validate each rendered
document with kubernetes-validate's bundled OpenAPI schemas (strict: unknown fields are errors), or,
for the Prometheus Operator's PrometheusRule, ServiceMonitor and PodMonitor, with their CRDs' schemas.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate.utils as kv
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ragtoll"
EXAMPLE = ROOT / "helm" / "examples" / "agent-with-ragtoll"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# Golden renders of each ci values file, so a template change shows its rendered effect in review.
GOLDEN = ROOT / "helm" / "examples" / "golden"
RELEASE = "demo"
NAMESPACE = "agents"
# The versions the issue names, plus the newest schema the installed kubernetes-validate ships.
KUBE_VERSIONS = ("1.29", "1.33", kv.latest_version())

helm.disable_logging()


@functools.cache
def _chart(path: Path) -> helm.Chart:
    return helm.Chart.load(path)


def ci_values(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def render(values: dict[str, Any] | None = None, chart: Path = CHART) -> dict[str, str]:
    """Template path -> rendered text, exactly as `helm template demo <chart> -n agents` would."""
    return _chart(chart).render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def lint(values: dict[str, Any] | None = None, chart: Path = CHART) -> list[str]:
    """`helm lint --strict`: every warning or error message (info-level hints are not findings)."""
    report = helm.lint(chart, values or {}, strict=True, namespace=NAMESPACE, kube_version="v1.33.0")
    return [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2] + list(
        report["errors"]
    )


def documents(rendered: dict[str, str]) -> list[dict[str, Any]]:
    """All Kubernetes objects of a rendering (NOTES.txt excluded), in template-path order."""
    docs: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(rendered[path]) if d)
    return docs


def notes(rendered: dict[str, str]) -> str:
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def validate(docs: list[dict[str, Any]], version: str) -> list[str]:
    """kubernetes-validate errors ("<kind>/<name>: <path>: <message>") against one Kubernetes version;
    a Prometheus Operator object is checked against its CRD's schema instead (the same for every version)."""
    problems: list[str] = []
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] in OPERATOR_KINDS:
            errors = operator_validator(doc["kind"]).iter_errors(doc)
            problems.extend(f"{name}: {'/'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in errors)
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            problems.append(f"{name}: {where}: {exc.message}")
    return problems


OPERATOR_KINDS = ("PrometheusRule", "ServiceMonitor", "PodMonitor")


def prometheus_rule_validator() -> jsonschema.protocols.Validator:
    return operator_validator("PrometheusRule")


@functools.cache
def operator_validator(kind: str) -> jsonschema.protocols.Validator:
    """The monitoring.coreos.com/v1 schema of `kind` (PrometheusRule, ServiceMonitor, PodMonitor), as
    cloudcoil-models-prometheus-operator (PyPI) generates it from the prometheus-operator CRD's
    openAPIV3Schema (operator v0.80.1): same fields, required keys and duration patterns. No
    registry package ships the CRD's YAML itself. Made strict the way `kubectl apply` (strict field
    validation) treats the object: an unknown field or a null where the CRD has none is an error,
    not silently pruned."""
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, kind)
    schema = _strict(model.model_json_schema(by_alias=True, mode="validation"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)  # type: ignore[no-any-return]


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _strict(v) for k, v in node.items() if k not in ("default", "title")}
    if "anyOf" in node:  # pydantic's Optional[X]: X | null
        options = [o for o in node.pop("anyOf") if o != {"type": "null"}]
        if len(options) == 1:
            node.update(options[0])
        else:
            node["anyOf"] = options
    if node.get("type") == "object" and "properties" in node and "additionalProperties" not in node:
        node["additionalProperties"] = False
    if str(node.get("pattern", "")).startswith("^(?i)"):  # Go's regexp takes a flag mid-pattern; Python's not
        node["pattern"] = "(?i)^" + node["pattern"][5:]
    return node


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def containers(pod_spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod_spec.get("initContainers", [])
    yield from pod_spec["containers"]


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(i for i in items if i["name"] == name)


def env_values(container: dict[str, Any]) -> dict[str, Any]:
    """name -> value (or the valueFrom mapping) of a container's env."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def ragtoll_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = find(docs, "ConfigMap", f"{RELEASE}-ragtoll")
    loaded = yaml.safe_load(cm["data"]["ragtoll.yaml"])
    assert isinstance(loaded, dict)
    return loaded


def golden_files(name: str) -> dict[str, str]:
    """file name -> text: `manifests.yaml` (helm template style, `# Source:` headers) and `NOTES.txt`."""
    rendered = render(ci_values(name))
    header = f"# Generated by `python tests/helm/helm_render.py` from helm/ragtoll/ci/{name}-values.yaml; do not edit.\n"
    parts = [
        f"# Source: {path}\n{text.strip()}\n"
        for path, text in sorted(rendered.items())
        if text.strip() and not path.endswith("NOTES.txt")
    ]
    return {"manifests.yaml": header + "---\n".join(parts), "NOTES.txt": notes(rendered).strip() + "\n"}


if __name__ == "__main__":
    for values_file in CI_VALUES:
        ci_name = values_file.name.removesuffix("-values.yaml")
        (GOLDEN / ci_name).mkdir(parents=True, exist_ok=True)
        for file_name, text in golden_files(ci_name).items():
            (GOLDEN / ci_name / file_name).write_text(text)
        print(f"wrote {GOLDEN / ci_name}/")
