"""Verification of a semantic candidate: the two queries must agree on everything that changes the answer.

Pure. Similar embeddings are only a loose first cut ("annual plans" and "monthly plans" score 0.9);
this module refuses a candidate unless numbers, units, dates and periods, negation, direction and
comparison words, the roles of from/to/than, whose thing it is ("my calendar" / "a coworker's calendar"), the order of the values around each connective ("from
X to Y", "X to Y", "X → Y", "X vs Y", "before", "than"), quoted strings, named entities, filter-like
words (learned from the partition's filters and chunk metadata) and the content words agree.
`verify` returns None when the candidate may be served, else the name of the check that refused.
`top_margin` measures how clearly a cached retrieval's first result led: a near tie is fragile,
since a reworded query can reorder it, and the cache serves such an entry from the exact tier only.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import lexicon as lx

_TOKEN = re.compile(r"\$?\d[\d,]*(?:\.\d+)?%?[a-z]*|[^\W\d_][\w'’-]*|[$€£%→>]", re.UNICODE)
_QUOTED = re.compile(r"\"([^\"]{1,200})\"|“([^”]{1,200})”|(?<!\w)'([^']{1,200})'(?!\w)")
_NUMERIC = re.compile(r"^\$?(\d[\d,]*(?:\.\d+)?)(%?)([a-z]*)$")

INTENT_FLOOR = 0.25  # share of content words two queries must have in common (chosen on the tuning domains)


@dataclass(frozen=True, slots=True)
class Features:
    quoted: frozenset[str]
    numbers: frozenset[str]
    units: frozenset[str]
    dates: frozenset[str]
    negated: bool
    directions: frozenset[str]
    roles: tuple[tuple[str, str], ...]  # (content word, role) for from/to/than/vs slots
    entities: frozenset[str]
    content: frozenset[str]
    sequence: tuple[str, ...]  # the content words in order (minimal pairs)
    # each connective (to, from, vs, than, before, after) with the values before and after it, up to
    # the connectives next to it: "from monthly to annual" has ("to", {monthly}, {annual})
    order: tuple[tuple[str, frozenset[str], frozenset[str]], ...] = ()
    # verbs and particles of direction (lexicon.MOTIONS, un-/dis-/de- reversals): refused against their opposite
    motions: frozenset[str] = frozenset()
    # content words and direction poles in order: who does what to whom ("owner ... to admin")
    spine: tuple[str, ...] = ()
    focus: frozenset[str] = frozenset()  # what the question asks for (lexicon.QUESTION_FOCUS)
    # whose thing it is: (content word, owner) after "my"/"our"/"your" (owner "self") or "<name>'s"
    owners: tuple[tuple[str, str], ...] = ()


def stem(word: str) -> str:
    """A light, conservative English stemmer: plurals and common verb endings only."""
    w = word
    for suffix, repl in (("ies", "y"), ("sses", "ss"), ("ches", "ch"), ("shes", "sh"), ("xes", "x")):
        if w.endswith(suffix) and len(w) > len(suffix) + 2:
            return w[: -len(suffix)] + repl
    if w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 3:
        return w[:-1]
    for suffix in ("ing", "ed"):
        if w.endswith(suffix) and len(w) > len(suffix) + 3:
            base = w[: -len(suffix)]
            if len(base) > 2 and base[-1] == base[-2] and base[-1] not in "lsz":
                base = base[:-1]  # stopped -> stop
            return base
    return w


@functools.lru_cache(maxsize=16_384)
def canon(word: str) -> str:
    w = word.casefold().strip("'’-")
    w = lx.SYNONYMS.get(w, w)
    s = stem(w)
    return lx.SYNONYMS.get(s, s)


def features(text: str, vocab: Iterable[str] = ()) -> Features:
    """Everything `verify` compares, from one query. `vocab`: filter-like words of the partition.

    Remembered when `vocab` is a frozenset (the cache passes one per partition): a lookup compares
    the query with the same cached queries again and again."""
    if isinstance(vocab, frozenset):
        return _features_of(text, vocab)
    return _features(text, _canon_set(frozenset(vocab)))


@functools.lru_cache(maxsize=8_192)  # ~1.5 KB each: at most ~12 MB
def _features_of(text: str, vocab: frozenset[str]) -> Features:
    return _features(text, _canon_set(vocab))


@functools.lru_cache(maxsize=4_096)
def _canon_set(vocab: frozenset[str]) -> frozenset[str]:
    return frozenset(canon(v) for v in vocab)


def _features(text: str, vocab_set: frozenset[str]) -> Features:
    quoted = frozenset(next(g for g in m.groups() if g).casefold().strip() for m in _QUOTED.finditer(text))
    raw_tokens = _TOKEN.findall(text)
    numbers: set[str] = set()
    units: set[str] = set()
    dates: set[str] = set()
    directions: set[str] = set()
    motions: set[str] = set()
    focus: set[str] = set()
    spine: list[str] = []
    entities: set[str] = set()
    sequence: list[str] = []  # the content words, in order
    roles: list[tuple[str, str]] = []
    owners: list[tuple[str, str]] = []
    owner: str | None = None  # the owner the next content word belongs to ("my calendar", "Ann's calendar")
    # the values (content words, numbers, units, dates) between connectives, and the connectives
    segments: list[list[str]] = [[]]
    links: list[str] = []
    negated = False
    role: str | None = None
    prev_lower = ""
    last_content: str | None = None  # the content word right before this token, if any
    adjacent: str | None = None  # the value right before this token, if any (an implicit "from")

    def value(item: str) -> None:
        """A value of the query: it fills a pending from/to/than/vs slot and its segment."""
        nonlocal role, adjacent
        if role:
            roles.append((item, role))
            role = None
        segments[-1].append(item)
        adjacent = item

    def connective(group: str) -> None:
        nonlocal adjacent
        links.append(group)
        segments.append([])
        adjacent = None

    for i, tok in enumerate(raw_tokens):
        low = tok.casefold().replace("’", "'")
        asked = lx.QUESTION_FOCUS.get(f"{prev_lower} {low}" if prev_lower == "how" else low)
        if asked is not None:
            focus.add(asked)
        m = _NUMERIC.match(low)
        if m:
            number, pct, unit = m.groups()
            numbers.add(_num(number))
            if pct:
                units.add("percent")
            if tok.startswith("$"):
                units.add("usd")
            if unit:
                u = lx.UNITS.get(unit) or lx.UNITS.get(stem(unit))
                if u:
                    units.add(u)
                elif unit in lx.ORDINAL_SUFFIXES:
                    pass
                else:
                    entities.add(low)  # 4k, 5g, 2fa: a code, not a count
            value(_num(number))
            prev_lower = low
            continue
        if low.startswith("non-") and len(low) > 4:
            negated, low = True, low[4:]  # non-refundable
        if low in lx.SYMBOL_UNITS:
            units.add(lx.SYMBOL_UNITS[low])
            value("u:" + lx.SYMBOL_UNITS[low])
            continue
        if low in ("→", ">"):
            _implicit_source(roles, adjacent)
            connective("to")
            role = "to"
            continue
        if low in lx.NEGATIONS or low.endswith("n't"):
            negated = True
            continue
        if low in lx.ROLE_MARKERS:
            group = lx.ROLE_MARKERS[low]
            if low in lx.MOTIONS:
                motions.add(lx.MOTIONS[low])  # "into" Boards, not "out of" it
            if group == "to":
                _implicit_source(roles, adjacent)  # "Tokyo to Sydney": Tokyo is the source
            elif group == "than" and last_content is not None:
                directions.add(f"than:{last_content}")  # "younger than" != "older than": the comparison itself
            connective(group)
            role = group
            last_content = None
            continue
        last_content = None
        c = canon(low)
        if c in lx.FOCUS_WORDS:
            focus.add(lx.FOCUS_WORDS[c])
        motion = _motion(low, prev_lower)
        if motion is not None:
            motions.add(motion)
            spine.append(motion)
            if motion in ("enable", "disable"):  # "turn on" / "switch off"
                directions.add(motion)
        if low in lx.NUMBER_WORDS:
            numbers.add(lx.NUMBER_WORDS[low])
            value(lx.NUMBER_WORDS[low])
            continue
        if c in lx.UNITS or low in lx.UNITS:
            unit = lx.UNITS.get(c) or lx.UNITS[low]
            if prev_lower in ("per", "a", "an", "each", "every") and unit in lx.PERIOD_UNITS:
                dates.add(lx.PERIOD_UNITS[unit])  # "per month" is "monthly"
                value("d:" + lx.PERIOD_UNITS[unit])
            elif prev_lower in lx.DATE_QUALIFIERS and unit in lx.PERIOD_UNITS:
                dates.add(_qualified_date(prev_lower, unit))  # "last month" != "this month"
                value("d:" + _qualified_date(prev_lower, unit))
            else:
                units.add(unit)
                value("u:" + unit)  # "USD to EUR": currencies and units take from/to slots too
                if unit in lx.BARE_PERIODS:
                    sequence.append("u:" + unit)  # a content word if no number states a period (below)
            prev_lower = low
            continue
        if c in lx.DATES or low in lx.DATES:
            d = _qualified_date(prev_lower, lx.DATES.get(c) or lx.DATES[low])
            dates.add(d)
            value("d:" + d)  # "from monthly to annual"
            prev_lower = low
            continue
        if low in lx.DIRECTIONS or c in lx.DIRECTIONS:
            pole = lx.DIRECTIONS.get(low) or lx.DIRECTIONS[c]
            directions.add(pole)
            spine.append(pole)
            if low in ("before", "after"):
                connective(low)  # "A before B" != "B before A"
            prev_lower = low
            continue
        prev_lower = low
        if low in lx.SELF_POSSESSIVES:
            owner = "self"
        if low in lx.STOPWORDS or c in lx.STOPWORDS:
            adjacent = None
            continue
        possessor = _possessor(low)
        if possessor is not None:
            c = canon(possessor)
        sequence.append(c)
        spine.append(c)
        last_content = c
        value(c)
        if owner is not None:
            owners.append((c, owner))
        owner = c if possessor is not None else None
        if c in lx.GAZETTEER or c in vocab_set or (c not in lx.SYNONYM_TARGETS and _looks_like_name(tok, i, raw_tokens)):
            entities.add(c)
    if numbers:
        sequence = [w for w in sequence if not w.startswith("u:")]
    else:  # "how many sick days", "hours flying": the period asked for, a content word, not a stated unit
        units -= lx.BARE_PERIODS
    order = tuple((group, frozenset(segments[k]), frozenset(segments[k + 1])) for k, group in enumerate(links))
    return Features(quoted, frozenset(numbers), frozenset(units), frozenset(dates), negated,
                    frozenset(directions), tuple(sorted(set(roles))), frozenset(entities), frozenset(sequence),
                    tuple(sequence), order, frozenset(motions), tuple(spine), frozenset(focus),
                    tuple(sorted(set(owners))))


def verify(a: Features, b: Features, similarity: float, vocab: Iterable[str] = (),
           intent_floor: float = INTENT_FLOOR, intent_free_above: float = 1.01) -> str | None:
    """None if `b`'s evidence may serve `a`; else the first check that refused."""
    if a.quoted != b.quoted:
        return "quoted"
    if a.numbers != b.numbers:
        return "number"
    if a.units != b.units:
        return "unit"
    if a.dates != b.dates:
        return "date"
    if a.negated != b.negated:
        return "negation"
    if a.directions != b.directions or _motions_oppose(a.motions, b.motions):
        return "direction"
    if _roles_conflict(a.roles, b.roles):
        return "role"
    if _order_conflict(a.order, b.order):
        return "order"
    if _role_swap(a.spine, b.spine) or _owners_conflict(a.owners, b.owners):
        return "role"
    if (a.entities ^ b.entities) - (a.content & b.content):  # "Acme" capitalised first in one query only
        return "entity"
    if a.focus and b.focus and a.focus != b.focus:
        return "question"
    changed = a.content ^ b.content
    if changed & _canon_set(vocab if isinstance(vocab, frozenset) else frozenset(vocab)):
        return "filter"
    if _minimal_pair(a.sequence, b.sequence):
        return "swap"
    if content_overlap(a.content, b.content) < intent_floor and similarity < intent_free_above:
        return "intent"
    return None


def top_margin(scores: Sequence[float | None]) -> float | None:
    """The gap between the first two results' scores over the mean gap between adjacent ranks.

    1.0: the first result led by an average gap; near 0: the first two were tied. Free of the
    score's scale and direction (similarities, BM25, distances). None when it cannot be told:
    fewer than three scores, a missing or non-finite one, or scores out of rank order."""
    if len(scores) < 3:
        return None
    s: list[float] = []
    for x in scores:
        if x is None or isinstance(x, bool) or not math.isfinite(x):
            return None
        s.append(float(x))
    steps = [a - b for a, b in itertools.pairwise(s)]
    if not (all(d >= 0 for d in steps) or all(d <= 0 for d in steps)):
        return None  # not ranked by this score (e.g. reordered by a reranker)
    spread = abs(s[0] - s[-1])
    if spread == 0:
        return 0.0  # every result tied
    return abs(s[0] - s[1]) * (len(s) - 1) / spread


def content_overlap(a: frozenset[str], b: frozenset[str]) -> float:
    union = a | b
    return len(a & b) / len(union) if union else 1.0


def _minimal_pair(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """The same content words in the same order but one, exchanged for a word that is not its
    synonym ("regular" / "expedited delivery time to Brazil"): that word is the whole difference
    between the queries, so it is a facet of the answer, not a rewording. Rewordings move words
    around or change more than one. A particle exchanged for a content word is sentence shape, not
    a facet ("install Acme Agent on Linux" / "Acme Agent install steps Linux"); a particle for
    another particle still counts ("on" / "off")."""
    if len(a) != len(b) or len(a) < 3:
        return False
    changed = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
    return len(changed) == 1 and (changed[0][0] in _PARTICLES) == (changed[0][1] in _PARTICLES)


def _roles_conflict(a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> bool:
    ra: dict[str, set[str]] = {}
    for word, role in a:
        ra.setdefault(word, set()).add(role)
    rb: dict[str, set[str]] = {}
    for word, role in b:
        rb.setdefault(word, set()).add(role)
    for word in ra.keys() & rb.keys():
        if ra[word] != rb[word]:
            return True
    # A -> B against B -> A with one side unmarked: the word moved into the other slot.
    ta = {w for w, r in a if r == "to"}
    tb = {w for w, r in b if r == "to"}
    fa = {w for w, r in a if r == "from"}
    fb = {w for w, r in b if r == "from"}
    return bool((ta & fb) or (tb & fa))


def _order_conflict(a: tuple[tuple[str, frozenset[str], frozenset[str]], ...],
                    b: tuple[tuple[str, frozenset[str], frozenset[str]], ...]) -> bool:
    """The two ends of one connective swapped: a value before it in one query is after it in the other,
    and one after it is before it ("from annual to monthly" / "from monthly to annual", "USD to EUR" /
    "EUR to USD", "java vs python" / "python vs java", "A before B" / "B before A"). Read from the word
    order around the connective, so it holds for values no list knows. Every "vs" counts as ordered: a
    swapped comparison is a miss, never a serve."""
    for group, left, right in a:
        for other, left2, right2 in b:
            if group == other and not left.isdisjoint(right2) and not right.isdisjoint(left2):
                return True
    return False


def _motion(low: str, prev: str) -> str | None:
    """The direction a verb or particle gives (lexicon.MOTIONS), None for most words."""
    if prev in lx.SWITCH_VERBS and low in ("on", "off"):
        return "enable" if low == "on" else "disable"
    if low in ("in", "on") and prev in lx.PHRASAL_VERBS:
        return "in"  # "log in", "put someone on the team"
    if low in lx.MOTIONS:
        return lx.MOTIONS[low]
    root = _root(low)
    if root in _REVERSIBLE:
        return "v:" + _REVERSIBLE[root]
    for prefix in lx.REVERSING_PREFIXES:
        if low.startswith(prefix) and _root(low[len(prefix):]) in _REVERSIBLE:
            return "un:" + _REVERSIBLE[_root(low[len(prefix):])]
    return None


def _root(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s", "e"):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            return word[: -len(suffix)]
    return word


_REVERSIBLE = {_root(w): w for w in lx.REVERSIBLE}


def _motions_oppose(a: frozenset[str], b: frozenset[str]) -> bool:
    """One query moves a way the other moves against: "into" / "out", "hand" / "take", "block" / "unblock".
    Only what one query says and the other does not counts ("unblock a sender I blocked" vs "unblock")."""
    only_a, only_b = a - b, b - a
    if not only_a or not only_b:
        return False
    return any(_opposite(m) in only_b for m in only_a)


def _opposite(motion: str) -> str:
    if motion.startswith("v:"):
        return "un:" + motion[2:]
    if motion.startswith("un:"):
        return "v:" + motion[3:]
    return lx.OPPOSITE_MOTIONS.get(motion, "")


def _role_swap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Who does what to whom, swapped: of the words both queries have, two trade places and nothing else
    moves, with a shared word between them and one outside them ("how does the owner invite an admin to
    the workspace" / "how does an admin invite the owner to the workspace", "a manager rates an employee
    in a review" / "an employee rates a manager in a review"). A rewording reverses or reorders more
    ("Paris to London flight baggage rules" / "baggage allowance on flights from Paris to London")."""
    sa = [w for w in a if a.count(w) == 1 and b.count(w) == 1 and w not in _PARTICLES]
    shared = set(sa)
    sb = [w for w in b if w in shared]
    diff = [i for i, (x, y) in enumerate(zip(sa, sb, strict=True)) if x != y]
    if len(diff) != 2:
        return False
    i, j = diff
    return sa[i] == sb[j] and sa[j] == sb[i] and j - i >= 2 and len(sa) > j - i + 1


def _possessor(low: str) -> str | None:
    """The owner a possessive names ("coworker's" -> "coworker"), never a contraction ("what's", "it's")."""
    if low.endswith(("'s", "s'")) and len(low) > 3:
        base = low[:-2] if low.endswith("'s") else low[:-1]
        if base not in lx.STOPWORDS and base not in ("let", "here", "there"):
            return base
    return None


def _owners_conflict(a: tuple[tuple[str, str], ...], b: tuple[tuple[str, str], ...]) -> bool:
    """The same thing owned by different people: "let a coworker see my calendar" is not "see a
    coworker's calendar", "the owner's settings" not "an admin's settings". A query that names no
    owner for it conflicts with neither."""
    mine = dict(a)
    return any(word in mine and mine[word] != who for word, who in b)


_PARTICLES = frozenset(["in", "on", "off", "out", "up", "down", "over", "under"])


def _implicit_source(roles: list[tuple[str, str]], word: str | None) -> None:
    if word is not None and not any(w == word for w, _ in roles):
        roles.append((word, "from"))


def _num(value: str) -> str:
    v = value.replace(",", "")
    try:
        f = float(v)
    except ValueError:
        return v
    return str(int(f)) if f.is_integer() else repr(f)


def _qualified_date(prev: str, date: str) -> str:
    # "last month" and "this month" are different periods; "monthly" and "per month" the same
    if prev in lx.DATE_QUALIFIERS:
        return f"{lx.DATE_QUALIFIERS[prev]}:{date}"
    return date


def _looks_like_name(tok: str, i: int, tokens: list[str]) -> bool:
    if len(tok) < 2:
        return False
    if tok.isupper() and tok.isalpha():
        return True  # EU, GDPR, SSO
    if any(ch.isdigit() for ch in tok):
        return True  # S3, gpt-4o
    if tok[0].isupper() and i > 0 and tokens[i - 1] not in (".", "?", "!"):
        return not tok[1:].islower() or tok.casefold() not in lx.STOPWORDS
    return any(ch.isupper() for ch in tok[1:])  # iPhone, PostgreSQL


# --- the serve decision beyond the vetoes: a calibrated estimate of P(wrong) --------------------------

PAIR_FEATURES = ("similarity", "overlap", "containment", "substituted", "added", "same_order", "margin",
                 "margin_known", "gap", "neighbours")


def pair_features(a: Features, b: Features, similarity: float, margin: float | None = None,
                  gap: float = 0.0, neighbours: int = 1) -> tuple[float, ...]:
    """What the calibrated model reads of a candidate pair that passed every veto (PAIR_FEATURES).

    `margin`: the cached retrieval's `top_margin` (None: unknown); `gap`: how far this candidate's
    similarity is above the next one's (negative when another is closer); `neighbours`: how many
    cached queries of the partition could have verified (the neighbourhood's density)."""
    shared = a.content & b.content
    longer = max(len(a.content), len(b.content))
    order_a = [w for w in a.sequence if w in shared]
    order_b = [w for w in b.sequence if w in shared]
    known = margin is not None and math.isfinite(margin)
    only_a, only_b = len(a.content - shared), len(b.content - shared)
    return (float(similarity), content_overlap(a.content, b.content), len(shared) / longer if longer else 1.0,
            float(min(only_a, only_b)), float(abs(only_a - only_b)), 1.0 if order_a == order_b else 0.0,
            min(float(margin), 3.0) if known else 0.0, 1.0 if known else 0.0, float(gap),
            math.log1p(max(0, neighbours)))


@dataclass(frozen=True, slots=True)
class Calibration:
    """A logistic model of P(the candidate's evidence is right for the query | pair features), fitted
    offline on labelled pairs (bench/fit_verifier.py); standardised inputs, so coefficients compare."""

    names: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float

    def p_wrong(self, x: Sequence[float]) -> float:
        z = self.intercept + sum(c * (v - m) / s for c, v, m, s in zip(self.coef, x, self.mean, self.scale,
                                                                        strict=True))
        if z >= 0:
            return math.exp(-z) / (1.0 + math.exp(-z))
        return 1.0 / (1.0 + math.exp(z))
