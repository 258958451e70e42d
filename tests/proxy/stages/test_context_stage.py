"""The context stage's per-route policy: which routes get a prompt_cache_key, and in which mode."""

from __future__ import annotations

from ragtoll.proxy import config
from ragtoll.proxy.stages.context import ContextStage


def _stage(context: dict[str, object] | None = None) -> ContextStage:
    ups = [{"name": "oai", "kind": "llm", "api": "openai", "url": "https://api.openai.com", "prefix": "/oai"},
           {"name": "vllm", "kind": "llm", "api": "openai", "url": "http://127.0.0.1:8000", "prefix": "/vllm"},
           {"name": "claude", "kind": "llm", "api": "anthropic", "url": "https://api.anthropic.com", "prefix": "/c"}]
    return ContextStage(config.parse({"upstreams": ups, "context": context or {}}))


def test_auto_sets_a_per_task_key_on_openai_only() -> None:
    """OpenAI takes prompt_cache_key; an OpenAI-compatible server may refuse a field it does not know."""
    assert _stage().keys == {"oai": "task", "vllm": "off", "claude": "off"}


def test_a_route_can_choose_its_key_mode_or_none() -> None:
    stage = _stage({"prompt_cache_key": "off", "routes": {"vllm": {"prompt_cache_key": "system"}}})
    assert stage.keys == {"oai": "off", "vllm": "system", "claude": "off"}
