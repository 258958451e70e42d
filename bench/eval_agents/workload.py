"""The evaluation workload: tasks per agent style, gold answers with their evidence chunks, the corpus.

The corpus is the demo's plus data/corpus_extra.jsonl; data/generate.py writes the data files.
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

from ragtoll.proxy.tools.demo.corpus import Chunk, load_corpus

DATA = pathlib.Path(__file__).parent / "data"
STYLES = ("lean", "corroborator", "runaway", "multihop", "hopeless", "fatal", "passes")


@dataclass(frozen=True)
class Task:
    id: str
    style: str
    principal: str
    question: str
    quick: bool


@dataclass(frozen=True)
class Gold:
    answer: str | None  # None: the answer is in no document (right answer: "I could not find it")
    evidence: tuple[str, ...]  # the chunks that together hold the answer (every hop's, for multi-hop)


def _lines(name: str) -> list[dict]:
    with open(DATA / name, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_tasks(quick: bool = False, styles: tuple[str, ...] = STYLES) -> list[Task]:
    tasks = [Task(r["id"], r["style"], r["principal"], r["question"], r["quick"]) for r in _lines("tasks.jsonl")]
    return [t for t in tasks if t.style in styles and (t.quick or not quick)]


def load_gold() -> dict[str, Gold]:
    return {r["id"]: Gold(r["answer"], tuple(r["evidence"])) for r in _lines("gold.jsonl")}


def load_chunks() -> list[Chunk]:
    extra = [Chunk(r["id"], r["doc"], r["title"], r["text"], tuple(r["groups"])) for r in _lines("corpus_extra.jsonl")]
    return load_corpus() + extra
