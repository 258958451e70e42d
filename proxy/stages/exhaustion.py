"""What a budget does at its limit besides refusing, per profile: climb to a larger profile
(`escalate_to`), make the model answer now (`on_exhausted: finish`), answer a refused search with
no results (`on_exhausted_retrieval: empty`). Decisions over a call and its reservation; the budget
stage (stages/budget.py) acts on them.
"""

from __future__ import annotations

from ..config import Profile
from ..core import budget as bm
from ..request.exchange import Exchange
from ..stores.base import Decision


def escalation(profile: Profile, refusal: Decision, shadow: bool) -> str | None:
    """The profile a refused task climbs to: `escalate_to`, when a count or amount (not a progress
    limit) refused it and its last retrieval was fruitful evidence for its question (new top
    results for a query that asks for the question or what its evidence named: core/progress.py),
    not mere novelty. The store checks that again as it moves the task, once; every limit of the
    larger profile then applies (config requires it to bound model calls or cost, and searches)."""
    if profile.escalate_to is None or shadow or refusal.dimension in (None, *bm.PROGRESS_DIMENSIONS):
        return None
    return profile.escalate_to if refusal.ledger.used("last_evidence") == 1 else None


def finishes(ex: Exchange, profile: Profile, shadow: bool) -> bool:
    """`on_exhausted: finish` applies to this call: an LLM call read whole, enforced (shadow
    changes nothing)."""
    return (profile.on_exhausted == "finish" and ex.body is not None and not shadow
            and ex.call.operation in bm.LLM_OPERATIONS)


def may_finish(ex: Exchange, profile: Profile, refusal: Decision, shadow: bool) -> bool:
    """A refused LLM call may be finished past its limit (within the profile's finish allowance)
    when that limit is not its own prompt's size, this is the task's first refusal (the store
    counted it: one per task, across replicas), and the task has had a model call within its
    limits: never its first call, so a task id made up per call never gets a finish."""
    return (finishes(ex, profile, shadow) and refusal.dimension != "max_prompt_tokens"
            and sum(refusal.ledger.rejections.values()) == 1 and refusal.ledger.used("steps") >= 1)


def rewrite(ex: Exchange, profile: Profile) -> bool:
    """Rewrite the call to answer now (tools disabled); False when its API cannot be asked that."""
    assert ex.body is not None
    body = ex.route.adapter.finish(ex.target.split("?", 1)[0], ex.body, profile.finish_note)
    if body is not None:
        ex.body = body
    return body is not None


def empty_result(ex: Exchange, profile: Profile) -> bytes | None:
    """`on_exhausted_retrieval: empty`: a refused search or rerank answers with no results."""
    if ex.call.operation not in ("retrieval", "rerank") or profile.on_exhausted_retrieval != "empty":
        return None
    return ex.route.adapter.empty_result(ex.target.split("?", 1)[0])
