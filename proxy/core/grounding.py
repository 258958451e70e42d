"""Groundedness, pure: what share of an answer's claims the evidence its task retrieved backs.

Definition (docs/context.md, "Report and dashboard"):

* A **claim** is a sentence of the answer (split at line breaks and after `.`, `!`, `?`) with at
  least MIN_CLAIM_WORDS content words: words that are not stopwords (lexicon.STOPWORDS), folded
  to their canonical form (verify.canon: case, plurals, verb endings, synonyms), and numbers
  (commas dropped). A sentence that only says the answer was not found ("I could not find ...",
  ABSTAIN_PATTERNS) is not a claim, and a sentence of citations alone belongs to the claim before it.
* A **citation** is a bracketed chunk id (`[doc-12]`, `[kb:7, kb:9]`): an id-like token with a
  letter in it; `[1]` is a position in a prompt ragtoll never sees, so it is not one.
* A claim is **supported** when one chunk the task retrieved holds at least SUPPORT_SHARE (0.7) of
  its content words and every number in it, and every id it cites is a chunk the task retrieved.
  A claim that cites retrieved chunks must be supported by one of them; one that cites a chunk the
  task never retrieved is not supported, whatever its words.
* **Groundedness** = supported claims / claims; None when the answer makes no claim.

Bounded: an answer is read up to MAX_ANSWER_CHARS and MAX_CLAIMS claims; a task keeps the words
of at most MAX_CHUNKS chunks (the first ones it retrieved, each chunk once by id or text) and
MAX_POSTINGS (word, chunk) pairs. Scoring a claim walks the postings of its words only
(an inverted index), so it costs the claim's words times the chunks holding each word.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..model import Chunk
from . import lexicon as lx
from .evidence_track import PASSAGE_SPLIT, chunk_key
from .verify import canon

MIN_CLAIM_WORDS = 3
SUPPORT_SHARE = 0.7  # chosen on half A of the eval's tasks (bench/eval_agents/grounding_eval.py, docs/context.md)
MAX_ANSWER_CHARS = 8 * 1024
MAX_CLAIMS = 64
MAX_CHUNKS = 256
MAX_CHUNK_CHARS = 16 * 1024
MAX_POSTINGS = 50_000
MAX_CITATIONS = 32  # per claim

# words: split at whitespace and punctuation (str.translate: a regex cost ~8x more per chunk);
# thousands separators and apostrophes go ("1,200" is 1200, "don't" is dont)
_TOKENS = str.maketrans({**{c: " " for c in "!\"#$%&()*+./:;<=>?@[\\]^_`{|}~-–—“”‘«»•·…"}, ",": None, "'": None, "’": None})
_BRACKETS = re.compile(r"\[([^\[\]\n]{1,400})\]")
_ID = re.compile(r"^[\w.:/#@-]{1,128}$")
_LETTER = re.compile(r"[^\W\d_]")
_CITED_PREFIX = re.compile(r"^(?:sources?|chunks?|docs?|refs?|see)\s*[:#]?\s+", re.IGNORECASE)
# prepositions the verifier keeps (they change a query's meaning) but that carry no claim of their own
_LINKS = frozenset(["in", "into", "on", "onto", "off", "out", "up", "down", "over", "under", "to", "from", "than",
                    "within", "per"])
_SKIP = lx.STOPWORDS | _LINKS
# sentences that report the answer was not found: not claims about the world
ABSTAIN_PATTERNS = re.compile(
    r"\b(?:could ?n[o']t|can ?n[o']t|can't|did ?n[o']t|unable to|was unable to|failed to) (?:find|locate|determine)\b"
    r"|\bno (?:relevant |supported )?(?:information|answer|mention)\b|\b(?:do ?n[o']t|does ?n[o']t) know\b"
    r"|\bnot (?:found|mentioned|covered|stated) in\b",
    re.IGNORECASE)


def content_words(text: str) -> set[str]:
    """The canonical content words and numbers of `text` (what claims and chunks are compared by)."""
    out: set[str] = set()
    for word in set(text.casefold().translate(_TOKENS).split()):  # each distinct word once
        if word.isdigit():
            out.add(word)
        elif word not in _SKIP and len(word) > 1:
            out.add(canon(word))
    return out


def _is_number(word: str) -> bool:
    return word.isdigit()


def citations(text: str) -> tuple[str, list[str]]:
    """(`text` without its citation brackets, the chunk ids it cites in order)."""
    ids: list[str] = []

    def take(m: re.Match[str]) -> str:
        inner = _CITED_PREFIX.sub("", m.group(1).strip())
        parts = [p.strip() for p in re.split(r"[,;]\s*|\s+and\s+", inner)]
        if all(p.isdigit() for p in parts):
            return " "  # [1], [2, 3]: a position in the prompt, not a chunk id
        if not all(_ID.match(p) and _LETTER.search(p) for p in parts):
            return m.group(0)  # prose in brackets: kept as text
        ids.extend(parts)
        return " "

    return _BRACKETS.sub(take, text), ids


@dataclass(frozen=True, slots=True)
class Claim:
    words: frozenset[str]
    cited: tuple[str, ...]


def claims(answer: str) -> list[Claim]:
    """The answer's claims (module docstring), at most MAX_CLAIMS, read up to MAX_ANSWER_CHARS."""
    out: list[Claim] = []
    for sentence in PASSAGE_SPLIT.split(answer[:MAX_ANSWER_CHARS]):
        text, cited = citations(sentence)
        words = content_words(text)
        if len(words) < MIN_CLAIM_WORDS or ABSTAIN_PATTERNS.search(text):
            if cited and out and not words:  # "... 30 days. [doc-3]": the citation of the claim before
                last = out[-1]
                out[-1] = Claim(last.words, (last.cited + tuple(cited))[:MAX_CITATIONS])
            continue
        if len(out) >= MAX_CLAIMS:
            break
        out.append(Claim(frozenset(words), tuple(cited[:MAX_CITATIONS])))
    return out


def chunk_words(chunks: Sequence[Chunk], texts: Sequence[str]) -> list[tuple[str, set[str]]]:
    """(key, content words) of each retrieved chunk; `texts`: their texts as far as they are read
    (a chunk without an id is keyed by that much of its text: a 7 MB one costs what 16 KB does)."""
    read = [t[:MAX_CHUNK_CHARS] for t in texts]
    return [(chunk_key(Chunk(c.id, t)), content_words(t)) for c, t in zip(chunks, read, strict=True)]


@dataclass(frozen=True, slots=True)
class Grounding:
    """How one answer stands against its task's evidence."""

    claims: int
    supported: int
    citations: int  # chunk ids the answer cites
    citations_retrieved: int  # ... of those, chunks the task retrieved

    @property
    def share(self) -> float | None:
        return round(self.supported / self.claims, 4) if self.claims else None


@dataclass(slots=True)
class TaskEvidence:
    """The content words of the chunks one task retrieved, as an inverted index (word -> chunks)."""

    keys: dict[str, int] = field(default_factory=dict)  # chunk id (or "fp:" + text fingerprint) -> number
    index: dict[str, list[int]] = field(default_factory=dict)
    postings: int = 0

    def add(self, chunk_id: str, text: str) -> int:
        """Index one retrieved chunk (once per id, else per text); returns the postings it added."""
        ((key, words),) = chunk_words([Chunk(chunk_id, text)], [text])
        return self.put(key, words)

    def put(self, key: str, words: set[str]) -> int:
        """Index one chunk's content words (`chunk_words`) under its key, within the task's bounds."""
        if key in self.keys or len(self.keys) >= MAX_CHUNKS or self.postings >= MAX_POSTINGS:
            return 0
        n = self.keys[key] = len(self.keys)
        kept = list(words)[: MAX_POSTINGS - self.postings]
        for w in kept:
            self.index.setdefault(w, []).append(n)
        self.postings += len(kept)
        return len(kept)

    def ground(self, answer: str) -> Grounding:
        """Score `answer` against the chunks indexed so far (module docstring)."""
        found = claims(answer)
        supported = cited_total = cited_known = 0
        for claim in found:
            known = [self.keys[c] for c in claim.cited if c in self.keys]
            cited_total += len(claim.cited)
            cited_known += len(known)
            if len(known) < len(claim.cited):
                continue  # cites a chunk the task never retrieved
            if self._backed(claim.words, set(known)):
                supported += 1
        return Grounding(len(found), supported, cited_total, cited_known)

    def _backed(self, words: frozenset[str], only: set[int]) -> bool:
        hits: Counter[int] = Counter()
        for w in words:
            hits.update(self.index.get(w, ()))
        need = SUPPORT_SHARE * len(words)
        numbers = [w for w in words if _is_number(w)]
        for chunk, n in hits.items():
            if n < need or (only and chunk not in only):
                continue
            if all(chunk in self.index.get(num, ()) for num in numbers):
                return True
        return False
