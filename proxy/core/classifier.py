"""Query-complexity classifier: a task's first query -> (class, reason), by ordered cue rules.

Classes are the background article's QueryClass values. Pure, offline and deterministic: a
handful of precompiled regexes over the lower-cased text, first matching rule wins, and the
reason names the rule and the words that fired it. Imports nothing from the rest of ragtoll.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

SIMPLE_FACT: Final = "simple_fact"
PROCEDURAL: Final = "procedural"
MULTI_HOP: Final = "multi_hop"
INVESTIGATIVE: Final = "investigative"
CLASSES: Final = (SIMPLE_FACT, PROCEDURAL, MULTI_HOP, INVESTIGATIVE)

# Only the head of a very long prompt is read: the cues sit in the question itself, and a
# bound keeps the cost flat whatever an agent pastes in.
MAX_CHARS: Final = 1000

_AUX = r"(?:do|does|did|can|could|should|would|will|is|are|was|were|has|have|had)"
_WH = r"(?:what|what's|which|who|when|where|why|how|whether)"


class _Rule(NamedTuple):
    label: str
    what: str  # the rule's name in the reason string
    pattern: re.Pattern[str]


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.VERBOSE)


# Order matters: the first rule that matches decides. A how-to opener outranks everything
# ("how do I compare plans" asks for steps); analysis outranks comparison ("compare our
# pricing against competitors and assess..." is open-ended); comparison and chaining outrank
# a how-to cue found later in the sentence.
_HOW_TO_OPENER = _rx(r"""
    ^(?:please\s+|so\s+|ok\s+|hi,?\s+)?
    (?: how\s+(?:do|can|could|should|would)\s+(?:i|we|one|you)\b
      | how\s+does\s+one\b | how\s+(?:can|could|should)\s+(?:a|an|the|my|our)\s+\w+\s+\w+
      | how\s+(?:is|are)\s+[^?]{1,60}?\s+supposed\s+to\b
      | how\s+to\b | what(?:'s|\s+is)\s+involved\s+in\b
      | (?:i'd|i\s+would|we'd)\s+like\s+to\s+(?!know\b|understand\b)
      | can\s+(?:i|we|you)\s+get\s+help\b
      | steps?\s+(?:to|for)\b
      | what\s+(?:are|'re)\s+the\s+steps\b
      | what(?:'s|\s+is)\s+the\s+(?:process|procedure)\b
      | walk\s+me\s+through\b
      | guide\s+me\b
      | show\s+me\s+how\b
      | instructions\s+(?:for|to|on)\b
      | can\s+you\s+(?:tell|show|explain)(?:\s+to)?(?:\s+me)?\s+how\b
      | what\s+(?:do|should)\s+(?:i|we)\s+(?:(?:need|have)\s+to\s+)?(?:do|bring|prepare|submit|try)\b
      | what\s+steps\b
      | (?:i|we)\s+(?:need|want)\s+to\s+(?!know\b|understand\b)
      | need\s+to\s+(?!know\b)
      | (?:set\s+up|reset|enable|disable|configure|install|cancel|rotate|revoke|register)\b
    )""")
# "audit logs", "the audit store": the noun; only "audit our/the/all/whether..." asks for one.
_ANALYSIS = _rx(r"""
    \b(?: investigat\w* | analy[sz]\w*
      | audit(?:ing)?\s+(?=our|the|all|every|each|whether|which|how|what|these|those|my)
      | assess\w* | evaluat\w* | diagnos\w* | troubleshoot\w* | root\s+cause
      | dig\s+into | look\s+(?:into|across|through|for) | go\s+through | figure\s+out
      | help\s+me\s+understand | identify | flag\s+(?:any|all) | find\s+out | work\s+out
      | break\s+(?:down|it\s+down) | full\s+picture | get\s+to\s+the\s+bottom
      | review\s+(?:all|every|our|the) | summari[sz]e\s+the\s+(?:main|recurring|evidence)
    )\b""")
_OPEN_ENDED = _rx(r"""
    \b(?: what(?:'s|\s+is|\s+are)?\s+(?:causing|driving|behind)
      | what\s+could\s+be\s+causing | main\s+drivers? | key\s+risks? | biggest\s+\w*\s*risks?
      | factors | patterns? | trends? | recurring | anomal\w* | inconsisten\w* | discrepanc\w*
      | systemic | exposure | impact | going\s+on | happening | something\s+(?:is|seems)\s+(?:off|wrong)
      | in\s+common | responsible\s+for\s+(?:most|the\s+most) | struggl\w* | and\s+why\b
      | compared?\s+to\s+(?:peers|competitors|similar|the\s+market)
      | keeps?\s+(?:getting|running|dropping|coming|failing)
    )\b""")
_WHY_CHANGE = _rx(r"""
    \bwhy\b.{0,80}?\b(?: gone\s+up | go(?:ne)?\s+down | increas\w* | decreas\w* | drop\w* | spik\w*
      | ris(?:e|en|ing) | doubled | higher | lower | slow\w* | fail\w* | stale | so\s+(?:many|much)
      | twice | sharply | keeps? | don't | doesn't | fall\w* | climb\w* | tripl\w* | worse | so\s+long
      | longer | grow\w* | jump\w* | surg\w* | declin\w* | plummet\w* | soar\w* )""")
_COMPARISON = _rx(r"""
    \b(?: compar\w* | difference | differ\w* | vs\.? | versus | cheaper | better | same\s+(?:rate|as)?
      | match(?:es)?\s+the | overlap\w* | relative\s+to | compatible\s+with | what\s+(?:has\s+)?changed
      | override\w* | take\s+precedence | prevail\w* | between\s+.{1,40}?\s+and
      | (?:\w+er|more|less)\s+than\s+(?![$\d]|a\s+few|one\b|two\b|three\b|four\b|five\b|ten\b) )\b""")
_CONDITIONAL = _rx(r"""
    (?:^|[,;:\-]\s*|\b(?:and|but)\s+)if\b | \bif\s+(?:i|i'm|we|my|our|the|a|an|you|they|it|he|she)\b
    | \bgiven\s+(?:that|the|i'm|we) | \bbut\s+.{1,40}?\b(?:isn't|aren't|doesn't|don't|wasn't|not)\b
    | \b(?:apply|applies|covered|count)\s+(?:when|while)\b""")
_AGGREGATION = _rx(r"""
    \bboth\b | \balso\s+(?:apply|count|support|have|has|cover)\w* | \bcombine\w* | \bon\s+top\s+of\b
    | \bplus\b | \bpercentage\s+of\b | \bin\s+total\b | \bsubtract\w* | \bminus\b | \bsum\s+of\b
    | \bwhich\s+of\s+(?:my|our|the|these|those)\b | \brefer(?:s|ences?)\b
    | \bwhich\b[^?]{3,80}\band\s+(?:have|has|are|is|support\w*|can|do|does)\b""")
_TWO_QUESTIONS = _rx(rf"""
    [,;]\s*(?:and|or|but)\s+(?:(?:at|in|for|by|to|from|with|on)\s+)?(?:{_AUX}|{_WH})\b
    | \?.+\? | \band\s+(?:then\s+)?{_WH}\b
    | \b(?:and|or)\s+(?:is|are|does|do|can|will)\s+(?:it|they|that|those|he|she|the)\b""")
# A stated situation, then a question about it: two facts to combine.
_SITUATION = _rx(rf"""
    ^(?:my|our|i|i'm|i've|we|we're|we've)\b[^?]{{8,}}?(?:[;:]|\s-)\s*(?:{_AUX}|{_WH}|am|can|is\s+there)\b""")
_HOW_TO_LATER = _rx(r"""
    \b(?: how\s+(?:do|can|should)\s+i\b | how\s+to\b | what\s+do\s+i\s+do | steps?\b | process\b
      | procedure\b | checklist\b | instructions\b | where\s+do\s+i\s+start | what\s+should\s+i\s+try
      | what\s+do\s+i\s+(?:need|have)\s+to\s+(?:do|bring|prepare|submit) )""")
# Years, quarters and version numbers: two different ones mean two facts to line up.
_DATE_OR_VERSION = re.compile(r"\b(?:(?:19|20)\d\d|q[1-4]|v?\d+\.\d+(?:\.\d+)*)\b")

_RULES: Final = (
    _Rule(PROCEDURAL, "how-to opener", _HOW_TO_OPENER),
    _Rule(INVESTIGATIVE, "analysis cue", _ANALYSIS),
    _Rule(INVESTIGATIVE, "open-ended cause/trend cue", _OPEN_ENDED),
    _Rule(INVESTIGATIVE, "why + observed change", _WHY_CHANGE),
    _Rule(MULTI_HOP, "comparison", _COMPARISON),
    _Rule(MULTI_HOP, "conditional chain", _CONDITIONAL),
    _Rule(MULTI_HOP, "aggregation over facts", _AGGREGATION),
    _Rule(MULTI_HOP, "two questions joined", _TWO_QUESTIONS),
    _Rule(MULTI_HOP, "situation + question", _SITUATION),
)
_LATE_RULES: Final = (_Rule(PROCEDURAL, "how-to cue", _HOW_TO_LATER),)


def classify(query: str) -> tuple[str, str]:
    """(class, reason) for one query; the reason names the rule and the text that fired it.

    Total and deterministic: any string (empty, huge, binary noise) gets a class, never an error.
    """
    text = " ".join(query[:MAX_CHARS].lower().replace("\u2019", "'").split())
    if not text:
        return SIMPLE_FACT, "empty query"
    for rule in _RULES:
        m = rule.pattern.search(text)
        if m is not None:
            return rule.label, _reason(rule, m.group(0), text)
    marks = list(dict.fromkeys(_DATE_OR_VERSION.findall(text)))
    if len(marks) >= 2:
        return MULTI_HOP, f"{len(marks)} dates/versions to line up ({', '.join(marks[:3])})"
    for rule in _LATE_RULES:
        m = rule.pattern.search(text)
        if m is not None:
            return rule.label, _reason(rule, m.group(0), text)
    return SIMPLE_FACT, "no procedural, comparison, chaining or analysis cue: single lookup"


def _reason(rule: _Rule, matched: str, text: str) -> str:
    reason = f"{rule.what} '{_snippet(matched)}'"
    if rule.pattern is _COMPARISON:
        items = _compared_items(matched, text)
        if items >= 2:
            reason = f"comparison of {items} items '{_snippet(matched)}'"
    return reason


_ITEM_SPLIT = re.compile(r"\s*(?:,\s*(?:and\s+|or\s+)?|\band\b|\bor\b|\bvs\.?|\bversus\b|\bwith\b)\s*")
_ITEM_END = re.compile(r"\s(?:for|in|on|when|if|once|given|regarding|about|to)\s|[?.:;]")


def _compared_items(matched: str, text: str) -> int:
    """How many things a comparison names: "between A, B and C" -> 3; 0 when unsure."""
    if matched.startswith("between"):
        span = matched[len("between"):]
    elif matched.startswith(("compar", "vs", "versus", "differ")):
        at = text.find(matched)
        start = 0 if matched.startswith(("vs", "versus")) else at + len(matched)
        span = text[start:]
        stop = _ITEM_END.search(span, max(0, at + len(matched) - start) if start == 0 else 0)
        span = span[: stop.start()] if stop else span
    else:
        return 0
    return sum(1 for part in _ITEM_SPLIT.split(span) if part.strip(" -'\"`"))


def _snippet(matched: str) -> str:
    """The matched words for the reason, printable (a control character in the query becomes a space)."""
    matched = "".join(c if c.isprintable() else " " for c in matched).strip(" ,;:-")
    return matched if len(matched) <= 40 else matched[:37] + "..."
