"""The context stage's per-route policy: which routes get a prompt_cache_key, and in which mode."""

from __future__ import annotations

import re
from typing import Any

import pytest
from ragtoll.proxy import config
from ragtoll.proxy.stages.context import ContextStage
from support.exchanges import Exchanges


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


def test_widening_and_the_note_are_off_by_default_and_per_route() -> None:
    stage = _stage({"routes": {"vllm": {"widen": True, "widen_top_k": 20, "budget_note": True}}})
    assert not stage.policies["oai"].widen and not stage.policies["oai"].budget_note
    assert stage.policies["vllm"].widen and stage.policies["vllm"].widen_top_k == 20 and stage.notes


@pytest.mark.parametrize(("context", "field"), [
    ({"widen_top_k": 0}, "context.widen_top_k"), ({"widen_top_k": 500}, "context.widen_top_k"),
    ({"widen_margin": 2}, "context.widen_margin"), ({"widen_floor": -1}, "context.widen_floor"),
    ({"routes": {"vllm": {"widen_top_k": 51}}}, "context.routes.vllm.widen_top_k"),
    ({"breakpoint_models": ["gpt-5.6", " "]}, "context.breakpoint_models[1]")])
def test_a_bad_setting_names_its_field(context: dict[str, object], field: str) -> None:
    """A widened search's worst case is bounded by config (top_k at most 50, shares in [0, 1]), and
    an empty model prefix, which would put breakpoints on every model, is refused."""
    with pytest.raises(config.ConfigError, match=re.escape(field)):
        _stage(context)


async def test_a_calls_rewrites_go_on_the_exchange_and_the_record_prefers_the_ledgers_sums() -> None:
    """What a call's rewrites did goes on the exchange (`tallies`, settled into the task's ledger
    by the budget) as well as into this process's tally; at the task's end a `context` object
    already in the record (the ledger's: every replica's calls) stands, else this process's."""
    xs = Exchanges(context={"prompt_cache_key": "task"})
    stage = ContextStage(xs.settings)
    ex = xs("openai", {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    await stage.on_request(ex)
    assert ex.tallies.cache_keys_set == 1 and ex.tallies.ledger_counts() == (("context.cache_keys_set", 1),)
    whole: dict[str, Any] = {"task_id": "task-1", "context": {"llm_calls": 7, "cache_keys_set": 7}}
    stage.annotate(whole)
    assert whole["context"] == {"llm_calls": 7, "cache_keys_set": 7}
    own: dict[str, Any] = {"task_id": "task-1"}
    stage.annotate(own)
    assert own["context"]["cache_keys_set"] == 1 and own["context"]["cached_input_share"] is None
