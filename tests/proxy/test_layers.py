"""The rooms of ragtoll.proxy and the direction of their imports: every import between packages
points down the layer list (or stays within a layer), and no two packages import each other,
however indirectly. Read from the source (every import, lazy and type-only ones included), so a
new upward import fails here before it tangles the house."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parents[2] / "proxy"
# lowest first: a room may import from its own layer and the ones before it, never after
LAYERS: list[set[str]] = [
    {"__init__", "errors", "model", "data", "redact"},  # the version, errors, value types, data, redaction
    {"config"},  # the typed configuration (knows no adapter)
    {"core"},  # pure domain logic: budgets, pricing, progress, verification, tokens
    {"adapters", "secrets"},  # one module per upstream API; secrets named by config
    {"stores"},  # budget, principal and evidence stores
    {"cache"},  # the evidence cache: partitions, ACLs, versions, audit, embedders
    {"tasks"},  # task records, the admin API
    {"request"},  # the request path: exchange, caller, pipeline, forwarder, the one client
    {"stages"},  # one concern each, over the exchange
    {"app", "server", "gate"},  # the ASGI app (its lifespan makes every resource), how it is served, its gate
    {"tools"},  # offline: report, recommend, demo
    {"cli", "__main__"},
]
RANK = {room: n for n, layer in enumerate(LAYERS) for room in layer}


def room_of(path: Path) -> str:
    parts = path.relative_to(PROXY).with_suffix("").parts
    return parts[0]


def imported_rooms(path: Path, source: str | None = None) -> set[str]:
    """The rooms of ragtoll.proxy that `path` (or `source` read as that file) imports from."""
    package = list(path.relative_to(PROXY).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)]
            if node.module:
                found.add((base + node.module.split("."))[0] if base else node.module.split(".")[0])
            else:  # `from . import x` / `from .. import x`: x is a module of that package, or a name in it
                found.update(base[:1] if base else [a.name if (PROXY / a.name).exists() or
                                                     (PROXY / f"{a.name}.py").exists() else "__init__"
                                                     for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ragtoll.proxy."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("ragtoll.proxy."))
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for path in PROXY.rglob("*.py"):
        src = room_of(path)
        edges.setdefault(src, set()).update(r for r in imported_rooms(path) if r != src)
    return edges


@pytest.mark.slow
def test_every_room_has_a_layer() -> None:
    assert set(graph()) <= set(RANK), f"rooms without a layer: {sorted(set(graph()) - set(RANK))}"


@pytest.mark.slow
def test_imports_point_down() -> None:
    upward = sorted((src, dst) for src, dsts in graph().items() for dst in dsts if RANK[dst] > RANK[src])
    assert upward == [], f"imports that point up the layer list: {upward}"


@pytest.mark.slow
def test_no_cycle_between_packages() -> None:
    edges = graph()
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(edges.get(node, ())):
            if nxt in path:
                cycles.append(path[path.index(nxt):] + [nxt])
            elif len(path) < len(edges):
                visit(nxt, [*path, nxt])

    for start in sorted(edges):
        visit(start, [start])
    assert cycles == [], f"import cycles between packages: {cycles[:5]}"


@pytest.mark.parametrize(("source", "line"), [
    ("core/progress.py", "from ..cache.verify import features"),  # the domain reaching up into the cache
    ("config.py", "from . import adapters"),  # config knowing the adapters
    ("stores/__init__.py", "from ..cache.entry import EvidenceStore"),  # a store room importing the cache
    ("tasks/admin.py", "from ..request.identify import TASK_ID_PATTERN"),
    ("core/budget.py", "from ragtoll.proxy.stores.base import Decision"),
])
def test_the_scan_sees_an_upward_import(source: str, line: str) -> None:
    """The checks can fail: each upward import this house once had is caught when written back."""
    planted = PROXY / source
    src = room_of(planted)
    rooms = imported_rooms(planted, planted.read_text() + "\n" + line + "\n")
    assert any(RANK[r] > RANK[src] for r in rooms if r != src), f"{line!r} in {source} went unnoticed"
