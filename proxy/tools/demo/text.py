"""The demo stack's shared text analysis: tokens, a tiny stemmer, synonyms, sentence overlap.

The retriever (BM25), the reranker and the scripted LLM all read text through this one analyzer,
as a real stack's search engine and model share a notion of "the same word". Pure, no I/O.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"[a-z0-9]+(?:[.\-][a-z0-9]+)*")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "the",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "of",
        "for",
        "to",
        "in",
        "on",
        "at",
        "by",
        "and",
        "or",
        "what",
        "whats",
        "which",
        "who",
        "whom",
        "how",
        "when",
        "where",
        "why",
        "do",
        "does",
        "did",
        "i",
        "my",
        "we",
        "you",
        "it",
        "its",
        "this",
        "that",
        "these",
        "with",
        "from",
        "long",
        "many",
        "much",
        "often",
        "must",
        "can",
        "should",
        "there",
        "their",
        "them",
        "they",
        "me",
        "our",
        "per",
        "about",
        "any",
        "s",
        "into",
        "than",
        "then",
        "before",
        "during",
    ]
)
# what a search engine's synonym file (and a language model) would treat as one meaning
SYNONYMS = {
    "period": "window",
    "yearly": "annual",
    "subscription": "plan",
    "led": "lead",
    "leader": "lead",
    "kept": "retain",
    "mfa": "multi-factor",
}


def stem(word: str) -> str:
    if word in SYNONYMS:
        return stem(SYNONYMS[word]) if SYNONYMS[word] != word else word
    if any(c.isdigit() for c in word):
        return word
    for suffix in ("ing", "ed", "es", "s"):
        if (
            word.endswith(suffix)
            and len(word) - len(suffix) >= 3
            and not (suffix == "s" and word.endswith("ss"))
        ):
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return SYNONYMS.get(word, word)


def terms(text: str) -> list[str]:
    """Content terms of `text`, in order, stemmed; stopwords and one-letter words dropped."""
    return [
        stem(t) for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS and (len(t) > 1 or t.isdigit())
    ]


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def overlap(question: str, sentence: str) -> tuple[float, float]:
    """(recall of the question's terms in the sentence, precision): how fully the sentence answers."""
    q, s = set(terms(question)), set(terms(sentence))
    if not q or not s:
        return 0.0, 0.0
    common = len(q & s)
    return common / len(q), common / len(s)
