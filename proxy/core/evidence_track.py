"""Evidence tracking, pure: chunk fingerprints, new-chunk counts, evidence and duplicate
("context landfill") tokens in a prompt, and the `x-ragtoll-evidence` header value.

The per-task sets (chunk keys seen, evidence piece fingerprints, pieces already sent) live in the
budget store; these functions only compute. Matching is by text fingerprints of passages
(paragraphs, lines or sentences), so evidence is found when an agent pastes a chunk into a
prompt with its own framing ("[1] ...", JSON tool output, bullets).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import orjson
import xxhash

from ..model import Chunk
from . import tokens

# A passage shorter than this is too common to identify evidence ("Yes.", "Sources:").
MIN_PIECE_CHARS = 24
EVIDENCE_HEADER = "x-ragtoll-evidence"

PASSAGE_SPLIT = re.compile(r"\n+|(?<=[.!?。！？])\s+")
_MARKER = re.compile(r"^(?:\[\d+\]|\(\d+\)|\d+[.)]|[-*•>]+)\s*")
_SPACE = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


def fingerprint(text: str) -> str:
    """Identity of a chunk's text: xxh3-64 hex of its normalised form (case, spacing, NFKC)."""
    return xxhash.xxh3_64_hexdigest(_norm(text).encode("utf-8", "surrogatepass"))


def chunk_key(chunk: Chunk) -> str:
    """What makes a chunk 'the same chunk' for new-chunk counting: its id, else its text."""
    return chunk.id if chunk.id else "fp:" + fingerprint(chunk.text)


def new_chunks(chunks: Iterable[Chunk], seen: AbstractSet[str]) -> list[str]:
    """Keys of `chunks` not in `seen` (the task's chunk keys so far), in order, without repeats."""
    out: list[str] = []
    mine: set[str] = set()
    for c in chunks:
        k = chunk_key(c)
        if k not in seen and k not in mine:
            mine.add(k)
            out.append(k)
    return out


def _pieces(text: str) -> Iterator[tuple[str, str]]:
    """(raw passage, fingerprint) for each passage long enough to identify evidence."""
    for raw in PASSAGE_SPLIT.split(text):
        piece = _norm(_MARKER.sub("", raw.strip()))
        if len(piece) >= MIN_PIECE_CHARS:
            yield raw, xxhash.xxh3_64_hexdigest(piece.encode("utf-8", "surrogatepass"))


def evidence_pieces(text: str) -> set[str]:
    """Passage fingerprints of one retrieved chunk's text: what the task's evidence set holds."""
    return {fp for _raw, fp in _pieces(text)}


def _strings(text: str) -> list[str]:
    """A prompt text, or the string leaves of it when it is JSON (tool output pasted as JSON)."""
    head = text.lstrip()[:1]
    if head not in ("{", "["):
        return [text]
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return [text]
    out: list[str] = []
    stack = [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return out


@dataclass(frozen=True, slots=True)
class PromptEvidence:
    """How much of one LLM prompt is retrieved evidence, and how much of that was sent before."""

    evidence_tokens: int
    duplicate_tokens: int  # evidence already in an earlier prompt of the task, or twice in this one
    sent: frozenset[str]  # evidence fingerprints in this prompt: add them to the task's sent set


def measure_prompt(texts: Sequence[str], evidence: AbstractSet[str], already_sent: AbstractSet[str],
                   encoding: str = tokens.O200K) -> PromptEvidence:
    """Count evidence and duplicate-evidence tokens in a prompt's texts.

    `evidence`: passage fingerprints of every chunk the task retrieved (`evidence_pieces`).
    `already_sent`: fingerprints sent in earlier prompts of the task (earlier `sent` results).
    Tokens are counted on the passage as it appears in the prompt.
    """
    ev = dup = 0
    here: set[str] = set()
    if not evidence:
        return PromptEvidence(0, 0, frozenset())
    for text in texts:
        for s in _strings(text):
            for raw, fp in _pieces(s):
                if fp not in evidence:
                    continue
                n = tokens.count(raw, encoding)
                ev += n
                if fp in already_sent or fp in here:
                    dup += n
                here.add(fp)
    return PromptEvidence(ev, dup, frozenset(here))


def evidence_header(chunks: Sequence[Chunk], new_count: int) -> str:
    """RFC 8941 dictionary for `x-ragtoll-evidence` (written directly: a general RFC 8941 serializer cost
    ~80 us per retrieval answer, before its headers could go out).

    `n`: chunks returned; `new`: chunks new to the task; `top`: the first result's score;
    `margin`: |score of 1st - score of 3rd| (absent with fewer than three scored results).
    Scores are taken in the upstream's order and scale (a distance for Chroma).
    """
    out = f"n={len(chunks)}, new={max(0, new_count)}"
    first = chunks[0].score if chunks else None
    third = chunks[2].score if len(chunks) >= 3 else None
    top = _decimal(first)
    if top is not None and first is not None:
        out += f", top={_sf_decimal(top)}"
        margin = _decimal(abs(first - third)) if third is not None and _decimal(third) is not None else None
        if margin is not None:
            out += f", margin={_sf_decimal(margin)}"
    return out


def _sf_decimal(x: float) -> str:
    """An RFC 8941 decimal: at most three fraction digits, at least one."""
    text = f"{x + 0.0:.3f}".rstrip("0")  # + 0.0: a rounded -0.0 is written 0.0
    return text + "0" if text.endswith(".") else text


def _decimal(x: float | None) -> float | None:
    """A score RFC 8941 can carry (finite, under 10^12), rounded to its 3 decimals."""
    if x is None or isinstance(x, bool) or not math.isfinite(x) or abs(x) >= 1e12:
        return None
    return round(float(x), 3)
