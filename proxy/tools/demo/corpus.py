"""The bundled corpus, workload and gold answers, a BM25 index over the corpus, and the ACL rule.

Pure apart from reading the packaged data files. Principals are fixed: `alice` (staff) sees
public and staff documents, `bob` (a customer) sees public ones only.
"""

from __future__ import annotations

import importlib.resources
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from .text import terms

PRINCIPALS: dict[str, tuple[str, ...]] = {"alice": ("public", "staff"), "bob": ("public",)}
INDEX_VERSION = "2026-11-30.1"


@dataclass(frozen=True)
class Chunk:
    id: str
    doc: str
    title: str
    text: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Task:
    id: str
    kind: str  # simple_fact | procedural | multi_hop | paraphrase | access | runaway
    principal: str
    question: str
    quick: bool  # part of the shortened workload


def _lines(name: str) -> list[dict[str, Any]]:
    data = importlib.resources.files("ragtoll.proxy.tools.demo").joinpath("data", name).read_bytes()
    return [orjson.loads(line) for line in data.splitlines() if line.strip()]


def load_corpus() -> list[Chunk]:
    return [
        Chunk(r["id"], r["doc"], r["title"], r["text"], tuple(r["groups"])) for r in _lines("corpus.jsonl")
    ]


def load_workload(quick: bool = False) -> list[Task]:
    tasks = [
        Task(r["id"], r["kind"], r["principal"], r["question"], r["quick"]) for r in _lines("workload.jsonl")
    ]
    return [t for t in tasks if t.quick] if quick else tasks


def load_gold() -> dict[str, str | None]:
    """Task id -> the gold answer, or None when the right answer is "not in the documents I may see"."""
    return {r["id"]: r["answer"] for r in _lines("gold.jsonl")}


def may_see(principal_groups: tuple[str, ...] | list[str], chunk_groups: tuple[str, ...]) -> bool:
    return bool(set(principal_groups) & set(chunk_groups))


class Index:
    """BM25 (k1=1.2, b=0.75) over chunk text + title, filtered by the caller's groups."""

    def __init__(self, chunks: list[Chunk]) -> None:
        self.chunks = chunks
        self.docs = [Counter(terms(c.title + " " + c.text)) for c in chunks]
        self.lengths = [sum(d.values()) for d in self.docs]
        self.avg = sum(self.lengths) / max(len(self.lengths), 1)
        df: Counter[str] = Counter()
        for d in self.docs:
            df.update(d.keys())
        n = len(chunks)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def search(
        self, query: str, groups: tuple[str, ...] | list[str], top_k: int
    ) -> list[tuple[Chunk, float]]:
        q = terms(query)
        scored = []
        for i, chunk in enumerate(self.chunks):
            if not may_see(groups, chunk.groups):
                continue  # ACL is enforced by the retriever itself, as in a real stack
            d, score = self.docs[i], 0.0
            for t in q:
                f = d.get(t, 0)
                if f:
                    score += self.idf[t] * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * self.lengths[i] / self.avg))
            if score > 0:
                scored.append((chunk, round(score, 4)))
        scored.sort(key=lambda cs: (-cs[1], cs[0].id))
        return scored[:top_k]
