"""Config engines measured: ragtoll's dataclass builder, msgspec Structs and pydantic v2 models.

    python bench/bench_config.py            # 7 fresh processes per engine (~15 s)
    python bench/bench_config.py --runs 3   # quicker

Each engine runs in fresh interpreters that first import what every engine shares (yaml, orjson,
ragtoll's errors and adapter registry), then time (a) importing the engine and defining the schema,
(b) the first load of the docs' "fuller file" (docs/configuration.md) and (c) warm loads of it and of a file with 20
upstreams and 10 profiles. Then (d) each engine's message for a handful of bad values, raw and after
a generic translation (one function per engine that reads the library's error path, value and
reason; no code per field). The msgspec and pydantic schemas are derived from ragtoll's dataclasses
(same fields, types and defaults; lists as tuples) with the numeric bounds of CONSTRAINTS, so they
check what the dataclass builder checks. Rules that span fields (prefix overlap, profile names) are
the same plain Python whatever the engine and are not part of the candidates' numbers.
msgspec is not a dependency: `pip install msgspec` to measure it (the row is skipped without it).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("dataclasses", "msgspec", "pydantic")


def fuller_file() -> str:
    """The docs' "fuller file" (docs/configuration.md), so the bench follows the docs."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    match = re.search(r"A fuller file:\n\n```yaml\n(.*?)```", text, re.DOTALL)
    assert match, "docs/configuration.md no longer has its 'A fuller file:' block"
    return match.group(1)


def twenty_upstreams() -> dict[str, Any]:
    apis = [("llm", "openai"), ("retrieval", "json"), ("rerank", "cohere"), ("embeddings", "tei"), ("other", "passthrough")]
    ups: list[dict[str, Any]] = []
    for i in range(20):
        kind, api = apis[i % len(apis)]
        up: dict[str, Any] = {"name": f"up{i:02d}", "kind": kind, "api": api, "url": f"http://svc{i}.internal:8080",
                              "timeouts": {"connect": 2, "read": 60}, "limits": {"max_connections": 100},
                              "trusted": i % 2 == 0}
        if api == "json":
            up["fields"] = {"query": "q", "top_k": "k", "results": "hits", "id": "id", "text": "body", "score": "s"}
        ups.append(up)
    profiles = {f"p{i}": {"max_steps": 4 + i, "max_retrieval_calls": 2 + i, "max_cost_usd": 0.01 * (i + 1),
                          "max_latency_ms": 10000 + 1000 * i, "mode": "shadow" if i % 3 == 0 else "enforce"}
                for i in range(10)}
    return {
        "server": {"port": 8787, "max_connections": 2048},
        "upstreams": ups,
        "budgets": {"default_profile": "p0", "profiles": profiles,
                    "classes": {"simple_fact": "p1", "procedural": "p2", "multi_hop": "p3"},
                    "rules": [{"route": f"up{i:02d}", "profile": f"p{i % 10}"} for i in range(0, 20, 4)]},
        "pricing": {f"model-{i}": {"input_per_mtok": 0.1 * i, "output_per_mtok": 0.4 * i} for i in range(10)},
        "cache": {"embedder": "upstream:up03", "sources": {"up01": "v1", "up06": "v2"}},
    }


def bad_cases(ca_dir: str) -> list[tuple[str, dict[str, Any]]]:
    base = twenty_upstreams()

    def with_(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        raw = copy.deepcopy(base)
        edit(raw)
        return raw

    return [
        ("wrong type", with_(lambda r: r["server"].__setitem__("port", "eighty"))),
        ("bad enum", with_(lambda r: r["upstreams"][0].__setitem__("kind", "llmm"))),
        ("unknown key", with_(lambda r: r["server"].__setitem__("prot", 1))),
        ("nested key", with_(lambda r: r["upstreams"][3].__setitem__("tls", {"ca_file": f"{ca_dir}/missing.pem"}))),
        ("negative limit", with_(lambda r: r["budgets"]["profiles"]["p3"].__setitem__("max_steps", -1))),
        ("strict bool", with_(lambda r: r.__setitem__("telemetry", {"capture_content": "yes"}))),
    ]


# --- the candidates' schemas, derived from ragtoll's dataclasses --------------------------------------

# (dataclass, field) -> bounds, as the dataclass builder's validate() checks them
CONSTRAINTS: dict[tuple[str, str], dict[str, float]] = {
    ("ServerConfig", "port"): {"ge": 1, "le": 65535},
    ("ServerConfig", "max_body_bytes"): {"ge": 1024},
    ("ServerConfig", "max_connections"): {"ge": 1},
    ("ServerConfig", "body_timeout_s"): {"gt": 0},
    **{("Timeouts", n): {"gt": 0} for n in ("connect", "read", "write", "pool")},
    ("Limits", "max_connections"): {"ge": 1},
    ("Limits", "keepalive_s"): {"gt": 0},
    **{("Profile", n): {"ge": 0} for n in ("max_steps", "max_calls", "max_retrieval_calls", "max_unique_queries",
                                          "max_rerank_calls", "max_context_tokens", "max_prompt_tokens",
                                          "max_completion_tokens", "max_cost_usd", "max_latency_ms",
                                          "max_stalled_retrievals")},
    ("BudgetsConfig", "reject_status"): {"ge": 400, "le": 599},
    ("BudgetsConfig", "warn_fraction"): {"gt": 0, "le": 1},
    ("BudgetsConfig", "task_ttl_s"): {"ge": 60},
    ("CacheConfig", "similarity"): {"gt": 0, "le": 1},
    ("CacheConfig", "ttl_s"): {"ge": 1},
    ("CacheConfig", "candidates"): {"ge": 1},
    ("Settings", "store_timeout_ms"): {"gt": 0},
}
FILE_FIELDS = {("TlsConfig", "ca_file"), ("TlsConfig", "cert_file"), ("TlsConfig", "key_file")}


def _check_file(value: str | None) -> str | None:
    if value is not None and not os.path.isfile(value):
        raise ValueError("Expected the path of a readable PEM file")
    return value


def _fields(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _default(f: dataclasses.Field[Any]) -> tuple[bool, Any]:
    """(is a factory, default) for a dataclass field; MISSING when required. A mapping default (a
    FrozenMap) becomes a factory of plain data, converted into the candidate's own types."""
    if f.default_factory is not dataclasses.MISSING:
        return True, f.default_factory
    if dataclasses.is_dataclass(f.default):
        return True, None  # the nested section's own defaults
    if isinstance(f.default, Mapping):
        return True, lambda: f.default
    return False, f.default


def _plain(value: Any) -> Any:
    """A default as JSON-able data (mappings and sections included)."""
    return json.loads(json.dumps(value, default=lambda o: dict(o) if isinstance(o, Mapping) else dataclasses.asdict(o)))


def msgspec_schema() -> tuple[Any, Callable[[dict[str, Any]], Any], Callable[[Exception, dict[str, Any]], str]]:
    import msgspec
    from ragtoll.proxy import config

    made: dict[type[Any], Any] = {}

    def struct(cls: type[Any]) -> Any:
        if cls in made:
            return made[cls]
        fields: list[Any] = []
        for f, tp in _fields(cls):
            tp = typ(tp, cls.__name__, f.name)
            factory, default = _default(f)
            if factory and default is None:
                fields.append((f.name, tp, msgspec.field(default_factory=tp)))
            elif factory:
                raw = _plain(default())
                fields.append((f.name, tp, msgspec.field(default_factory=lambda raw=raw, tp=tp: msgspec.convert(raw, tp))))
            elif default is dataclasses.MISSING:
                fields.append((f.name, tp))
            else:
                fields.append((f.name, tp, default))
        ns: dict[str, Any] = {}
        if cls is config.TlsConfig:
            def __post_init__(self: Any) -> None:
                for name in ("ca_file", "cert_file", "key_file"):
                    _check_file(getattr(self, name))
            ns["__post_init__"] = __post_init__
        made[cls] = msgspec.defstruct(cls.__name__, fields, namespace=ns, frozen=True, forbid_unknown_fields=True)
        return made[cls]

    def typ(tp: Any, owner: str, name: str) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return typing.Union[tuple(typ(a, owner, name) for a in args)]  # noqa: UP007
        if origin in (list, tuple):
            return tuple[typ(args[0], owner, name), ...]  # type: ignore[misc]
        if origin in (dict, Mapping):
            return dict[str, typ(args[1], owner, name)]  # type: ignore[misc]
        if dataclasses.is_dataclass(tp):
            return struct(tp)  # type: ignore[arg-type]
        if (owner, name) in CONSTRAINTS and tp in (int, float):
            return typing.Annotated[tp, msgspec.Meta(**CONSTRAINTS[owner, name])]
        return tp

    top = struct(config.Settings)

    def load(raw: dict[str, Any]) -> Any:
        return msgspec.convert(raw, top)

    def translate(exc: Exception, raw: dict[str, Any]) -> str:
        text = str(exc)
        reason, _, where = text.rpartition(" - at `$")
        path = where.rstrip("`").lstrip(".")
        unknown = re.match(r"Object contains unknown field `(.*)`", reason)
        if unknown:
            path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
            return f"Config '{path}' is not a known key. Expected one of: {', '.join(known_keys(path))}."
        if reason.startswith("Invalid enum value"):
            reason = "Expected one of: " + ", ".join(valid_literals(path))
        return f"Config '{path}' has value {value_at(raw, path)!r}. {reason}."

    return msgspec, load, translate


def pydantic_schema() -> tuple[Any, Callable[[dict[str, Any]], Any], Callable[[Exception, dict[str, Any]], str]]:
    import pydantic
    from pydantic import ConfigDict, Field, StrictBool, StrictInt, field_validator
    from ragtoll.proxy import config

    made: dict[type[Any], Any] = {}
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    def model(cls: type[Any]) -> Any:
        if cls in made:
            return made[cls]
        fields: dict[str, Any] = {}
        for f, tp in _fields(cls):
            tp = typ(tp, cls.__name__, f.name)
            factory, default = _default(f)
            if factory and default is None:
                fields[f.name] = (tp, Field(default_factory=tp))
            elif factory:
                raw = _plain(default())
                fields[f.name] = (tp, Field(default_factory=lambda raw=raw, tp=tp: pydantic.TypeAdapter(tp)
                                            .validate_python(raw)))
            elif default is dataclasses.MISSING:
                fields[f.name] = (tp, ...)
            else:
                fields[f.name] = (tp, default)
        validators: dict[str, Any] = {}
        if cls is config.TlsConfig:
            validators["files"] = field_validator("ca_file", "cert_file", "key_file")(
                classmethod(lambda _cls, v: _check_file(v)))
        made[cls] = pydantic.create_model(cls.__name__, __config__=model_config, __validators__=validators, **fields)
        return made[cls]

    def typ(tp: Any, owner: str, name: str) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            return typing.Union[tuple(typ(a, owner, name) for a in args)]  # noqa: UP007
        if origin in (list, tuple):
            return tuple[typ(args[0], owner, name), ...]  # type: ignore[misc]
        if origin in (dict, Mapping):
            return dict[str, typ(args[1], owner, name)]  # type: ignore[misc]
        if dataclasses.is_dataclass(tp):
            return model(tp)  # type: ignore[arg-type]
        base = {bool: StrictBool, int: StrictInt}.get(tp, tp)
        if (owner, name) in CONSTRAINTS and tp in (int, float):
            return typing.Annotated[base, Field(**CONSTRAINTS[owner, name])]
        return base

    top = model(config.Settings)

    def load(raw: dict[str, Any]) -> Any:
        return top.model_validate(raw)

    def translate(exc: Exception, raw: dict[str, Any]) -> str:
        err = exc.errors(include_url=False)[0]  # type: ignore[attr-defined]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        if err["type"] == "extra_forbidden":
            return f"Config '{path}' is not a known key. Expected one of: {', '.join(known_keys(path))}."
        reason = err["msg"].removeprefix("Value error, ")
        return f"Config '{path}' has value {err['input']!r}. {reason}."

    return pydantic, load, translate


def _walk(path: str) -> list[Any]:
    """The dataclass types along a key path (what the candidates' schemas were derived from)."""
    from ragtoll.proxy import config

    tp: Any = config.Settings
    out = [tp]
    for part in re.findall(r"[^.\[\]]+", path):
        while typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if dataclasses.is_dataclass(tp):
            tp = typing.get_type_hints(tp).get(part)
        elif typing.get_origin(tp) in (list, dict, tuple, Mapping):
            tp = typing.get_args(tp)[0 if typing.get_origin(tp) in (list, tuple) else -1]
        out.append(tp)
    return out


def known_keys(path: str) -> list[str]:
    parent = _walk(path)[-2]
    return sorted(f.name for f in dataclasses.fields(parent))


def valid_literals(path: str) -> list[str]:
    tp = _walk(path)[-1]
    return [str(a) for a in typing.get_args(tp)] if typing.get_origin(tp) is Literal else []


def value_at(raw: Any, path: str) -> Any:
    """The input at `path`; msgspec writes a mapping's key as `[...]`, which cannot be followed."""
    try:
        for part in re.findall(r"[^.\[\]]+", path):
            raw = raw[int(part)] if isinstance(raw, list) else raw[part]
    except (KeyError, IndexError, ValueError, TypeError):
        return Unknown()
    return raw


class Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


# --- one engine in a fresh process ------------------------------------------------------------------


def child(engine: str) -> dict[str, Any]:
    import orjson  # noqa: F401  (shared by every engine: the env overrides)
    from ragtoll.instrumentation import semconv  # noqa: F401
    from ragtoll.proxy import adapters, errors  # noqa: F401

    fuller = yaml.safe_load(fuller_file())
    big = twenty_upstreams()
    t0 = time.perf_counter()
    if engine == "dataclasses":
        from ragtoll.proxy import config

        def load(raw: dict[str, Any]) -> Any:
            return config.parse(raw)

        def translate(exc: Exception, raw: dict[str, Any]) -> str:
            return str(exc)
        lib: Any = None
        failure: type[Exception] = errors.ConfigError
    else:
        lib, load, translate = msgspec_schema() if engine == "msgspec" else pydantic_schema()
        failure = lib.ValidationError
    t1 = time.perf_counter()
    load(fuller)
    t2 = time.perf_counter()
    warm: dict[str, float] = {}
    for name, raw in (("fuller", fuller), ("20up", big)):
        n = 200
        start = time.perf_counter()
        for _ in range(n):
            load(raw)
        warm[name] = (time.perf_counter() - start) / n * 1e6
    messages: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory() as ca_dir:
        for label, raw in bad_cases(ca_dir):
            try:
                load(raw)
                messages[label] = ("(accepted)", "(accepted)")
            except failure as exc:
                messages[label] = (" ".join(str(exc).split()), translate(exc, raw))
    return {"import_ms": (t1 - t0) * 1e3, "cold_ms": (t2 - t1) * 1e3, "warm_fuller_us": warm["fuller"],
            "warm_20up_us": warm["20up"], "messages": messages,
            "version": "(ragtoll)" if lib is None else getattr(lib, "__version__", "") or str(lib.VERSION)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--child", choices=ENGINES)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    results: dict[str, list[dict[str, Any]]] = {}
    for engine in ENGINES:
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, __file__, "--child", engine], capture_output=True, text=True,
                                 check=False)
            if out.returncode:
                print(f"{engine}: skipped ({out.stderr.strip().splitlines()[-1]})", file=sys.stderr)
                break
            results.setdefault(engine, []).append(json.loads(out.stdout))
    print(f"median of {args.runs} fresh processes each; Python {sys.version.split()[0]}")
    print(f"{'engine':<22}{'import+schema ms':>17}{'first load ms':>15}{'warm fuller us':>16}{'warm 20up us':>14}")
    for engine, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in ("import_ms", "cold_ms", "warm_fuller_us",
                                                                   "warm_20up_us")}
        label = f"{engine} {runs[0]['version']}".strip()
        print(f"{label:<22}{med['import_ms']:>17.1f}{med['cold_ms']:>15.2f}{med['warm_fuller_us']:>16.0f}"
              f"{med['warm_20up_us']:>14.0f}")
    for label in results["dataclasses"][0]["messages"]:
        print(f"\n[{label}]")
        for engine, runs in results.items():
            raw, translated = runs[0]["messages"][label]
            if raw == translated:
                print(f"  {engine:<12} {raw}")
            else:
                print(f"  {engine:<12} raw:        {raw}\n  {'':<12} translated: {translated}")


if __name__ == "__main__":
    main()
