"""What groundedness costs ragtoll per call (proxy/core/grounding.py), best of 5.

    python bench/bench_grounding.py

Indexing one retrieval answer (10 chunks of ~1,200 characters, what the eval's realistic chunks
are), grading a typical answer (5 sentences) against a task's 40 chunks, and the worst case the
bounds allow: an answer of MAX_CLAIMS claims whose every word is in every one of MAX_CHUNKS chunks.
"""

from __future__ import annotations

import timeit

from ragtoll.proxy.core import grounding
from ragtoll.proxy.model import Chunk

SENTENCE = ("Refunds on annual plans are allowed within 30 days of purchase when the account is in good "
            "standing and the invoice was paid by card. ")


def chunk(i: int) -> str:
    return f"Section {i} of the billing policy, revision {i * 7}. " + SENTENCE * 8


def best(fn: object, n: int) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6  # type: ignore[arg-type]


def main() -> None:
    chunks = [Chunk(f"doc-{i}", chunk(i)) for i in range(10)]
    texts = [c.text for c in chunks]
    index_us = best(lambda: grounding.chunk_words(chunks, texts), 50)
    ev = grounding.TaskEvidence()
    for i in range(40):
        ev.add(f"doc-{i}", chunk(i))
    answer = " ".join([SENTENCE.strip() + " [doc-3]", "Monthly plans are not refundable at all.",
                       "Enterprise contracts follow their own terms.", "Ask support to start one.",
                       "The refund reaches the card within ten business days."])
    grade_us = best(lambda: ev.ground(answer), 200)
    worst = grounding.TaskEvidence()
    for i in range(grounding.MAX_CHUNKS):
        worst.add(f"w-{i}", SENTENCE)
    long_answer = SENTENCE * grounding.MAX_CLAIMS
    worst_us = best(lambda: worst.ground(long_answer), 5)
    print(f"index one retrieval answer (10 chunks x {len(texts[0])} chars): {index_us:.0f} us")
    print(f"grade a 5-sentence answer ({len(answer)} chars) against 40 chunks: {grade_us:.0f} us")
    print(f"worst case: {grounding.MAX_CLAIMS} claims x {grounding.MAX_CHUNKS} chunks holding every word: {worst_us:.0f} us")


if __name__ == "__main__":
    main()
