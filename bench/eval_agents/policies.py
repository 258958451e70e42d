"""The scripted model's behaviour per agent style: from a chat transcript to the next tool call or answer.

One OpenAI-compatible LLM serves every style (ragtoll.proxy.tools.demo.services.llm_app); which
policy answers a request is chosen by the request's system prompt, as a real model's behaviour
follows the prompt it was given. Every policy reads the transcript with the demo's reader
(`policy.read_transcript`), answers only with a sentence of the evidence in the transcript
(`best_sentence`, the demo's bar for "found": 3/4 of the question's terms), never sees gold
answers, and honours a request that allows no tool call (`tool_choice: "none"` or no `tools`) by
answering from the transcript's evidence, which is what ragtoll's `on_exhausted: finish` relies on.
A tool error (a budget refusal, an upstream failure) in the transcript makes every policy stop
using tools and answer from what it has, as the demo's does. Pure: no I/O.

* lean: searches with the question, answers as soon as the evidence covers it; up to two more
  searches (keywords, keywords + "details") when it does not, then says it cannot find it.
* corroborator: the demo's policy unchanged (`ragtoll.proxy.tools.demo.policy.decide`): reranks
  every search, keeps searching to corroborate an answer it already has.
* runaway: never trusts its evidence; rewords the one question again and again (synonyms,
  keyword order, filler words), so the results are mostly the same chunks. Only its agent's turn
  limit (or a budget) stops it; then it answers from the evidence.
* multihop: decomposes "Who leads the team that owns the service that X?" (3 hops) or "Which
  office does the lead of the team that owns the service that X work from?" (4 hops) into one
  question per hop, searches each (the next hop names what the previous one found), reranks each
  search, answers with the last hop's sentence. A hop counts as answered only by a sentence that
  holds every term of the hop's question.
* hopeless: a persistent searcher: the question, its keywords, then the keywords with one more
  word each time (overview, history, ...), following "summarised in ..." pointers, reranking
  every search; gives up after eight searches.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ragtoll.proxy.tools.demo import agent as demo_agent
from ragtoll.proxy.tools.demo.policy import (
    ABSTAIN,
    CONFIDENT,
    Action,
    Transcript,
    best_sentence,
    bridge,
    keywords,
    read_transcript,
)
from ragtoll.proxy.tools.demo.policy import decide as demo_decide
from ragtoll.proxy.tools.demo.text import overlap, sentences

from .provider import PREAMBLE

TOP_K = 6
Policy = Callable[[Transcript, bool], Action]

# --- system prompts: what each agent tells its model (and how the scripted model knows its style) ---
SYSTEMS = {
    "lean": (
        "You are Northwind Cloud's support assistant. Search the documents with retrieve and answer "
        "as soon as they answer the question, citing the chunk id. Say so when you cannot find it."
    ),
    "runaway": (
        "You are a careful research assistant for Northwind Cloud. Search with retrieve; before you "
        "answer, make sure by searching again in other words. Cite chunk ids."
    ),
    "multihop": (
        "You answer multi-step questions about Northwind Cloud. Break the question into steps, search "
        "each step with retrieve, order results with rerank, and answer from the documents, citing chunk ids."
    ),
    "hopeless": (
        "You are a thorough research assistant for Northwind Cloud. Search with retrieve, order results "
        "with rerank, try other search terms when you do not find the answer, and follow references "
        "between documents. Cite chunk ids, or say that you cannot find the answer."
    ),
}


def _found(question: str, t: Transcript, bar: float = CONFIDENT) -> tuple[str, str] | None:
    recall, sentence, cid = best_sentence(question, t.evidence)
    return (sentence, cid) if recall >= bar else None


def _answer(found: tuple[str, str] | None, t: Transcript) -> Action:
    if found is not None:
        return Action(answer=f"{found[0]} [{found[1]}]")
    if t.error is not None:
        return Action(answer=f"{ABSTAIN} (search stopped: {t.error})")
    return Action(answer=ABSTAIN)


def _search(query: str) -> Action:
    return Action("retrieve", {"query": query, "top_k": TOP_K})


def _rerank_due(t: Transcript) -> bool:
    return t.last_tool == "retrieve" and bool(t.last_ids)


def lean(t: Transcript, final: bool) -> Action:
    found = _found(t.question, t)
    if found or final or t.error is not None:
        return _answer(found, t)
    kw = keywords(t.question)
    for query in (t.question, kw, kw + " details"):
        if query not in t.searches:
            return _search(query)
    return _answer(None, t)


_SWAPS = {
    "window": "period", "annual": "yearly", "plans": "subscriptions", "leads": "heads",
    "restart": "reboot", "owns": "runs", "target": "goal", "expire": "lapse", "rotated": "changed",
    "incident": "outage", "contact": "person", "limit": "cap", "regions": "locations",
}
_FILLERS = ["exact", "official", "current", "confirm", "policy", "documentation", "latest", "details",
            "precisely", "verified", "according to docs", "please", "again", "rule", "value", "answer"]


def rewordings(question: str) -> list[str]:
    """The runaway's rewordings of one question, in the order it tries them: the question, its
    keywords, synonyms swapped, the keywords reversed, then the keywords with one filler word each."""
    kw = keywords(question)
    swapped = " ".join(_SWAPS.get(w.lower(), w) for w in kw.split())
    out = [question, kw, swapped, " ".join(reversed(kw.split()))]
    for i, filler in enumerate(_FILLERS):
        out.append(f"{swapped if i % 2 else kw} {filler}")
    seen: set[str] = set()
    return [q for q in out if not (q in seen or seen.add(q))]


def runaway(t: Transcript, final: bool) -> Action:
    if final or t.error is not None:
        return _answer(_found(t.question, t), t)
    for query in rewordings(t.question):
        if query not in t.searches:
            return _search(query)
    return _answer(_found(t.question, t), t)


# a hop is answered by a sentence holding every term of the hop's question: with 3/4, "Cobalt is
# owned by the Security Engineering team" would answer "Who leads the Security Engineering team?"
HOP_RECALL = 1.0
_WHO_LEADS = re.compile(r"^Who leads (?P<team>the team that owns .+)\?$", re.IGNORECASE)
_OFFICE = re.compile(r"^Which office does (?P<person>.+) work from\?$", re.IGNORECASE)
_LEAD_OF = re.compile(r"^the lead of (?P<team>the team that owns .+)$", re.IGNORECASE)
_TEAM_OWNS = re.compile(r"^the team that owns (?P<service>.+)$", re.IGNORECASE)
_DEPENDS = re.compile(r"^the service that (?P<name>\S+) depends on$", re.IGNORECASE)
_SERVICE = re.compile(r"^the service that (?P<fn>.+)$", re.IGNORECASE)


def plan(question: str) -> list[str] | None:
    """One question per hop, innermost first; `{}` stands for what the previous hop found."""

    def service(np: str) -> list[str] | None:
        if m := _DEPENDS.match(np):
            return [f"Which service does {m['name']} depend on?"]
        if m := _SERVICE.match(np):
            return [f"Which service {m['fn']}?"]
        return None

    def team(np: str) -> list[str] | None:
        m = _TEAM_OWNS.match(np)
        inner = service(m["service"]) if m else None
        return inner + ["Which team owns {}?"] if inner else None

    def person(np: str) -> list[str] | None:
        m = _LEAD_OF.match(np)
        inner = team(m["team"]) if m else None
        return inner + ["Who leads the {} team?"] if inner else None

    q = question.strip()
    if m := _WHO_LEADS.match(q):
        t = team(m["team"])
        return t + ["Who leads the {} team?"] if t else None
    if m := _OFFICE.match(q):
        p = person(m["person"])
        return p + ["Which office does {} work from?"] if p else None
    return None


def multihop(t: Transcript, final: bool) -> Action:
    hops = plan(t.question) or [t.question]
    name: str | None = None
    current, found = hops[0], None
    for i, template in enumerate(hops):
        current = template.format(name) if "{}" in template else template
        found = _found(current, t, HOP_RECALL)
        if found is None:
            break
        if i < len(hops) - 1:
            name = bridge(found[0], current)
            if name is None:
                found = None
                break
    done = found is not None  # the loop ended on the last hop, answered
    if final or t.error is not None:
        return _answer(found if done else None, t)
    if _rerank_due(t):  # every search is reranked, the last hop's too
        return Action("rerank", {"query": t.searches[-1], "ids": t.last_ids, "top_n": 3})
    if done:
        return _answer(found, t)
    for query in (current, keywords(current)):
        if query not in t.searches:
            return _search(query)
    return _answer(None, t)


_POINTER = re.compile(r"\b(?:summarised in|continued in|see) ([a-z0-9][a-z0-9 ]*[a-z0-9])")
_EXPANSIONS = ["overview", "history", "records", "report", "archive", "details"]
HOPELESS_PATIENCE = 8


def hopeless(t: Transcript, final: bool) -> Action:
    found = _found(t.question, t)
    if final or t.error is not None:
        return _answer(found, t)
    if _rerank_due(t):
        return Action("rerank", {"query": t.searches[-1], "ids": t.last_ids, "top_n": 3})
    if found:
        return _answer(found, t)
    for _, text in t.evidence:  # follow references in relevant evidence
        for s in sentences(text):
            if overlap(t.question, s)[0] >= 0.34:
                for target in _POINTER.findall(s.lower()):
                    if target not in t.searches:
                        return _search(target)
    if len(t.searches) >= HOPELESS_PATIENCE:
        return _answer(None, t)
    kw = keywords(t.question)
    for query in [t.question, kw, *(f"{kw} {e}" for e in _EXPANSIONS)]:
        if query not in t.searches:
            return _search(query)
    return _answer(None, t)


POLICIES: dict[str, Policy] = {"lean": lean, "runaway": runaway, "multihop": multihop, "hopeless": hopeless}


def decide(messages: list[dict[str, Any]], *, final: bool = False) -> Action:
    """The scripted model: the policy the system prompt asks for; any other prompt (the demo agent's,
    used by the corroborator, fatal and passes agents) gets the demo's policy."""
    system = next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")
    if system.startswith(PREAMBLE):  # the context eval's fixed instructions: the style follows them
        system = system.removeprefix(PREAMBLE)
        messages = [{**m, "content": system} if m.get("role") == "system" else m for m in messages]
    for style, prompt in SYSTEMS.items():
        if system == prompt:
            return POLICIES[style](read_transcript(messages), final)
    if system != demo_agent.SYSTEM:
        raise ValueError(f"no scripted policy for system prompt {system[:60]!r}")
    return demo_decide(messages, final=final)
