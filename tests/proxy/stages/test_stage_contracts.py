"""Stage contracts: each stage names the exchange fields it reads and writes per phase, the
contracts name every field the stage's code touches, and an order that cannot serve a read fails
loudly when the pipeline is made (not silently in production)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from conftest import default_upstreams
from opentelemetry.sdk.trace import TracerProvider
from ragtoll.proxy import config
from ragtoll.proxy.app import build_stages
from ragtoll.proxy.request.caller import CallerResolver
from ragtoll.proxy.request.exchange import FIELDS, ContractError, Stage, check_contracts
from ragtoll.proxy.request.identify import Identifier
from ragtoll.proxy.request.pipeline import Pipeline
from ragtoll.proxy.request.routing import Router
from ragtoll.proxy.request.upstream import UpstreamClient
from ragtoll.proxy.stages.budget import BudgetStage
from ragtoll.proxy.stages.cache import CacheStage, evidence_cache
from ragtoll.proxy.stages.context import ContextStage
from ragtoll.proxy.stages.evidence import EvidenceStage
from ragtoll.proxy.stages.outcome import OutcomeStage
from ragtoll.proxy.stages.principal import PrincipalStage
from ragtoll.proxy.stages.span import SpanStage
from ragtoll.proxy.stores import open_stores
from ragtoll.proxy.stores.principals import open_principal_store
from ragtoll.proxy.tasks.records import TaskEnder, open_sink

STAGES = Path(__file__).resolve().parents[3] / "proxy" / "stages"
# the modules whose functions a stage hands its exchange to
MODULES = {
    CacheStage: ["cache"], PrincipalStage: ["principal"], EvidenceStage: ["evidence"], SpanStage: ["span"],
    OutcomeStage: ["outcome"], ContextStage: ["context"], BudgetStage: ["budget", "budget_span", "stream_guard", "exhaustion"],
}


@pytest.fixture
async def stages() -> list[Stage]:
    """The app's stage list with every stage on (cache, principals, budgets), as its lifespan builds it."""
    settings = config.parse({"upstreams": default_upstreams("http://127.0.0.1:9"),
                             "principals": {"default": {"max_concurrent_tasks": 5}}})
    stores = open_stores(settings)
    client = UpstreamClient(settings.upstreams)
    ender = TaskEnder(stores.budget, open_sink(stores.budget, None), 60)
    principals = open_principal_store(settings, stores.budget)
    assert principals is not None
    cache = CacheStage(settings, evidence_cache(settings, stores.evidence, client), client)
    built = build_stages(settings, stores=stores, cache=cache, env={}, ender=ender,
                         principal=PrincipalStage(settings, principals))
    yield built
    await client.aclose()
    await stores.aclose()


def touched(stage: type[Stage]) -> set[str]:
    """Exchange fields the stage's modules read or write through a variable named `ex`."""
    found: set[str] = set()
    for name in MODULES[stage]:
        tree = ast.parse((STAGES / f"{name}.py").read_text())
        found |= {node.attr for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ex"
                  and node.attr in FIELDS}
    return found


async def test_the_apps_stage_order_serves_every_contract(stages: list[Stage]) -> None:
    # the context stage rewrites the body before the budget charges the prompt as it will be sent
    assert [type(s) for s in stages] == [CacheStage, ContextStage, PrincipalStage, BudgetStage, EvidenceStage,
                                         SpanStage, OutcomeStage]
    check_contracts(stages)
    # a stage switched off (no cache, no principals) leaves its fields at their defaults: still served
    check_contracts([s for s in stages if not isinstance(s, CacheStage | PrincipalStage)])


@pytest.mark.parametrize("stage", list(MODULES))
def test_a_contract_names_every_field_its_code_touches(stage: type[Stage]) -> None:
    assert touched(stage) - stage.contract.fields() == set()
    assert stage.contract.fields() <= FIELDS


@pytest.mark.parametrize(("first", "then", "why"), [
    (BudgetStage, CacheStage, "BudgetStage.on_request reads ['proposal']"),
    (BudgetStage, PrincipalStage, "PrincipalStage.on_end reads ['settlement']"),
    (EvidenceStage, BudgetStage, "EvidenceStage.on_chunk/on_response reads ['new_chunks']"),
])
async def test_an_order_that_cannot_serve_a_read_fails_loudly(stages: list[Stage], first: type[Stage],
                                                               then: type[Stage], why: str) -> None:
    """Moving a stage before the one whose writes it reads: check_contracts, and so the pipeline
    (made in the app's lifespan), refuse the list, naming the stage, the phase and the field."""
    order = [s for s in stages if type(s) is not first]
    order.insert(next(i for i, s in enumerate(order) if type(s) is then), next(s for s in stages if type(s) is first))
    with pytest.raises(ContractError, match=__import__("re").escape(why)):
        check_contracts(order)
    settings = config.parse({"upstreams": default_upstreams("http://127.0.0.1:9")})
    client = UpstreamClient(settings.upstreams)
    try:
        with pytest.raises(ContractError):
            Pipeline(settings, Router(settings.upstreams), client, order, Identifier(settings.tasks),
                     CallerResolver(settings.identity, {}), TracerProvider().get_tracer("t"))
    finally:
        await client.aclose()


async def test_every_reordering_is_either_served_or_refused(stages: list[Stage]) -> None:
    """Of the 720 orders of the six stages, the contracts accept exactly those that keep what each
    reads behind what writes it: the cache before principal and budget (the proposal, the
    settlement charged in reverse), the budget before evidence (its new-chunk count). (The context
    stage reads only what the pipeline sets: no order refuses it.)"""
    stages = [s for s in stages if not isinstance(s, ContextStage)]
    kinds = [type(s) for s in stages]
    accepted = 0
    for order in itertools.permutations(stages):
        pos = {type(s): n for n, s in enumerate(order)}
        expected = pos[CacheStage] < pos[BudgetStage] and pos[PrincipalStage] < pos[BudgetStage] \
            and pos[BudgetStage] < pos[EvidenceStage]
        try:
            check_contracts(list(order))
            served = True
        except ContractError:
            served = False
        assert served == expected, [k.__name__ for k in (type(s) for s in order)]
        accepted += served
    assert 0 < accepted < 720 and len(kinds) == 6
