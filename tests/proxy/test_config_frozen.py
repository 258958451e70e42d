"""Frozen config holds no mutable containers: a loaded Settings is immutable all the way down."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import re
from pathlib import Path
from typing import Any

import pytest
from ragtoll.proxy import config
from ragtoll.proxy.config import BudgetsConfig, FrozenMap, JwtConfig, Profile, ProfileRule, UpstreamConfig

CONFIG_DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"  # has the fuller file

# every container field of every section holds something
FULL = """
upstreams:
  - {name: openai, kind: llm, api: openai, url: https://api.openai.com, prefix: /openai}
  - name: docs
    kind: retrieval
    api: json
    url: http://retriever:8080
    fields: {query: q, results: hits}
budgets:
  default_profile: tight
  classes: {simple_fact: tight}
  rules: [{route: docs, profile: tight}, {header: x-tier, equals: gold, profile: bounded}]
  profiles: {tight: {max_steps: 2}, bounded: {max_steps: 8}}
pricing: {gpt-4o-mini: {input_per_mtok: 0.15}, default: {output_per_mtok: 15}}
cache: {sources: {docs: v3}}
identity: {jwt: {algorithms: [RS256, ES256]}}
"""


def mutable_fields(obj: Any, where: str = "settings") -> list[str]:
    """Paths of every list, dict, set or other mutable container reachable from `obj`."""
    found: list[str] = []
    if dataclasses.is_dataclass(obj):
        assert type(obj).__dataclass_params__.frozen, f"{where}: {type(obj).__name__} is not frozen"  # type: ignore[attr-defined]
        for f in dataclasses.fields(obj):
            found += mutable_fields(getattr(obj, f.name), f"{where}.{f.name}")
    elif isinstance(obj, (list, dict, set, bytearray)):
        found.append(f"{where} is a {type(obj).__name__}")
    elif isinstance(obj, FrozenMap):
        for key, value in obj.items():
            found += mutable_fields(value, f"{where}.{key}")
    elif isinstance(obj, tuple):
        for i, value in enumerate(obj):
            found += mutable_fields(value, f"{where}[{i}]")
    elif not isinstance(obj, (str, int, float, bool, type(None))):
        found.append(f"{where} is a {type(obj).__name__}, not a known immutable value")
    return found


def readme_fuller_file() -> str:
    match = re.search(r"A fuller file:\n\n```yaml\n(.*?)```", CONFIG_DOCS.read_text(encoding="utf-8"), re.DOTALL)
    assert match
    return match.group(1)


@pytest.mark.parametrize("text", [FULL, readme_fuller_file(), ""], ids=["every-container", "readme", "defaults"])
def test_every_field_of_every_section_of_a_loaded_settings_is_immutable(tmp_path: Path, text: str) -> None:
    path = tmp_path / "ragtoll.yaml"
    path.write_text(text)
    settings = config.load({"RAGTOLL_CACHE__SOURCES__OPENAI": "7"}, str(path))
    assert mutable_fields(settings) == []
    hash(settings)  # hashable all the way down: nothing inside can change


def test_the_walk_finds_a_mutable_container() -> None:
    """The check above can fail: a section smuggled a dict past the constructor."""
    up = UpstreamConfig(name="a", kind="llm", url="http://x")
    object.__setattr__(up, "fields", {"query": "q"})
    assert mutable_fields(up, "up") == ["up.fields is a dict"]


def test_containers_are_tuples_and_frozen_maps_that_compare_like_lists_and_dicts(tmp_path: Path) -> None:
    path = tmp_path / "ragtoll.yaml"
    path.write_text(FULL)
    s = config.load({}, str(path))
    assert s.budgets.classes == {"simple_fact": "tight"} and {"simple_fact": "tight"} == s.budgets.classes
    assert s.budgets.profiles.get("tight") == Profile(max_steps=2) and s.budgets.profiles.get("nope") is None
    assert list(s.budgets.profiles) == ["tight", "bounded"]  # the file's order
    assert s.upstreams[1].fields == {"query": "q", "results": "hits"}
    assert s.identity.jwt.algorithms == ("RS256", "ES256")
    assert [r.profile for r in s.budgets.rules] == ["tight", "bounded"]
    assert isinstance(s.upstreams, tuple) and isinstance(s.pricing, FrozenMap)
    with pytest.raises(TypeError):
        s.budgets.classes["other"] = "bounded"  # type: ignore[index]
    with pytest.raises(AttributeError):
        s.budgets.classes._data = {}  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        s.upstreams.append(s.upstreams[0])  # type: ignore[attr-defined]


def test_replace_equality_pickle_and_deepcopy_still_work(tmp_path: Path) -> None:
    path = tmp_path / "ragtoll.yaml"
    path.write_text(FULL)
    s = config.load({}, str(path))
    again = config.load({}, str(path))
    assert s == again and hash(s) == hash(again)
    moved = dataclasses.replace(s, server=dataclasses.replace(s.server, port=9000))
    assert moved.server.port == 9000 and moved.budgets is s.budgets and moved != s
    assert pickle.loads(pickle.dumps(s)) == s
    assert copy.deepcopy(s) == s


def test_sections_built_in_code_freeze_the_lists_and_dicts_they_are_given() -> None:
    """Tests and the demo build sections directly; the caller's containers are copied, not shared."""
    profiles = {"bounded": Profile(max_steps=8)}
    rules = [ProfileRule(profile="bounded", route="docs")]
    cfg = BudgetsConfig(profiles=profiles, rules=rules)  # type: ignore[arg-type]
    profiles["bounded"] = Profile(max_steps=1)
    rules.clear()
    assert cfg.profiles["bounded"].max_steps == 8 and len(cfg.rules) == 1
    assert mutable_fields(cfg) == []
    assert JwtConfig(algorithms=["RS256"]).algorithms == ("RS256",)  # type: ignore[arg-type]
    assert mutable_fields(config.Settings(upstreams=[UpstreamConfig(  # type: ignore[arg-type]
        name="a", kind="llm", url="http://x", fields={"q": "query"})])) == []


def test_frozen_map_equality_and_hash_follow_the_items() -> None:
    a = FrozenMap({"x": 1, "y": 2})
    assert a == FrozenMap({"y": 2, "x": 1}) and hash(a) == hash(FrozenMap({"y": 2, "x": 1}))
    assert a != {"x": 1} and a != FrozenMap({"x": 1, "y": 3})
    assert dict(a) == {"x": 1, "y": 2} and {**a} == {"x": 1, "y": 2}
    assert repr(FrozenMap({"x": 1})) == "FrozenMap({'x': 1})"
