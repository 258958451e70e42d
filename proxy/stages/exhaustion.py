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
    limit) refused it and its last retrieval was fruitful, with at least one fruitful retrieval in
    all (the store lets it climb once)."""
    if profile.escalate_to is None or shadow or refusal.dimension in (None, *bm.PROGRESS_DIMENSIONS):
        return None
    ledger = refusal.ledger
    progressing = ledger.used("stalled") == 0 and ledger.used("retrieval_calls") > ledger.used("fruitless")
    return profile.escalate_to if progressing else None


def finishes(ex: Exchange, profile: Profile, shadow: bool) -> bool:
    """`on_exhausted: finish` applies to this call: an LLM call read whole, enforced (shadow
    changes nothing)."""
    return (profile.on_exhausted == "finish" and ex.body is not None and not shadow
            and ex.call.operation in bm.LLM_OPERATIONS)


def may_finish(ex: Exchange, profile: Profile, refusal: Decision, shadow: bool) -> bool:
    """A refused LLM call is finished past its limit when that limit is not its own prompt's size
    and this is the task's first refusal (the store counted it: one per task, across replicas)."""
    return (finishes(ex, profile, shadow) and refusal.dimension != "max_prompt_tokens"
            and sum(refusal.ledger.rejections.values()) == 1)


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
