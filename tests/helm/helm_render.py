"""Offline chart tooling for the Helm tests: render and lint with helm-python-sdk (Helm v4's Go SDK
loaded in-process through ctypes; no helm binary, no cluster, no network) and validate each rendered
document with kubernetes-validate's bundled OpenAPI schemas (strict: unknown fields are errors).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate.utils as kv
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "ragtoll"
EXAMPLE = ROOT / "helm" / "examples" / "agent-with-ragtoll"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
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
    return [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2] + list(report["errors"])


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
    """kubernetes-validate errors ("<kind>/<name>: <path>: <message>") against one Kubernetes version."""
    problems: list[str] = []
    for doc in docs:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {where}: {exc.message}")
    return problems


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
