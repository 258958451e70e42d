"""Evidence tracking: new chunks, evidence and duplicate tokens in prompts, the evidence header."""

from __future__ import annotations

import random

import http_sfv
import orjson
import pytest
from ragtoll.proxy.core import tokens
from ragtoll.proxy.core.evidence_track import (
    chunk_key,
    evidence_header,
    evidence_pieces,
    fingerprint,
    measure_prompt,
    new_chunks,
)
from ragtoll.proxy.model import Chunk

A = "Rotate API keys from the console under Settings, then Security."
B = "Old keys keep working for one hour after rotation so clients can switch."
C = "Keys expire automatically after ninety days unless renewed by an admin."


def test_fingerprint_ignores_case_spacing_and_unicode_form() -> None:
    assert fingerprint("Hello  World\n") == fingerprint("hello world") == fingerprint("ｈｅｌｌｏ world")
    assert fingerprint("hello world") != fingerprint("world hello")


def test_new_chunks_by_id_or_text() -> None:
    seen = {"k-1", chunk_key(Chunk("", B))}
    chunks = [Chunk("k-1", A), Chunk("k-2", C), Chunk("", B.upper()), Chunk("k-2", C), Chunk("", "fresh text")]
    assert new_chunks(chunks, seen) == ["k-2", chunk_key(Chunk("", "fresh text"))]


def test_prompt_evidence_and_context_landfill() -> None:
    evidence = evidence_pieces(A) | evidence_pieces(B) | evidence_pieces(C)
    first = measure_prompt(["You answer from the context.", f"Context:\n[1] {A}\n[2] {B}\nQuestion: how?"],
                           evidence, set())
    assert first.evidence_tokens == tokens.count(f"[1] {A}") + tokens.count(f"[2] {B}")
    assert first.duplicate_tokens == 0
    # the next step re-sends A and B (history) and adds C
    second = measure_prompt([f"Context:\n[1] {A}\n[2] {B}", f"- {C}"], evidence, first.sent)
    assert second.duplicate_tokens == tokens.count(f"[1] {A}") + tokens.count(f"[2] {B}")
    assert second.evidence_tokens == second.duplicate_tokens + tokens.count(f"- {C}")


def test_evidence_inside_json_tool_output_and_repeats_within_one_prompt() -> None:
    evidence = evidence_pieces(A)
    tool = orjson.dumps({"results": [{"id": "k-1", "text": A}, {"id": "k-1", "text": A}]}).decode()
    m = measure_prompt([tool], evidence, set())
    assert m.evidence_tokens == 2 * tokens.count(A) and m.duplicate_tokens == tokens.count(A)


def test_no_evidence_no_work() -> None:
    m = measure_prompt(["anything at all, long enough to be a passage"], set(), set())
    assert (m.evidence_tokens, m.duplicate_tokens, m.sent) == (0, 0, frozenset())


def test_evidence_header_is_an_rfc8941_dictionary() -> None:
    value = evidence_header([Chunk("a", score=0.91234), Chunk("b", score=0.8), Chunk("c", score=0.5)], 2)
    parsed = http_sfv.Dictionary()
    parsed.parse(value.encode())
    assert {k: float(v.value) for k, v in parsed.items()} == {"n": 3, "new": 2, "top": 0.912, "margin": 0.412}
    assert evidence_header([], 0) == "n=0, new=0"
    assert evidence_header([Chunk("a", score=0.7), Chunk("b", score=0.6)], 1) == "n=2, new=1, top=0.7"
    assert evidence_header([Chunk("a", score=float("nan"))], 1) == "n=1, new=1"
    assert evidence_header([Chunk("a")], 1) == "n=1, new=1"


def test_evidence_header_matches_an_rfc8941_serializer_on_any_score() -> None:
    rng = random.Random(8941)
    scores = [rng.uniform(-1e12 + 1, 1e12 - 1) for _ in range(300)] + [rng.uniform(-2, 2) for _ in range(3000)]
    scores += [0.0, -0.0, 1.0, 0.1, 0.0005, 0.0015, 0.9995, -0.0004, 123.4565, 999_999_999_999.9]
    for i, top in enumerate(scores):
        third = scores[(i * 7 + 3) % len(scores)]
        chunks = [Chunk("a", score=top), Chunk("b", score=0.0), Chunk("c", score=third)]
        value = evidence_header(chunks, i)
        parsed = http_sfv.Dictionary()
        parsed.parse(value.encode())
        assert str(parsed) == value  # what an RFC 8941 serializer writes for the same values
        assert float(parsed["top"].value) == pytest.approx(round(top, 3), rel=1e-12, abs=1e-9)
