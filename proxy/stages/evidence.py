"""Evidence stage: what each call did with evidence. A retrieval answer read whole is described
to the agent (`x-ragtoll-evidence`: how many chunks came back, how many are new to the task, the top
score and the margin); on each LLM call, how many prompt tokens are evidence the task retrieved
earlier, and how many of those were already sent in an earlier prompt (the context landfill); on
each LLM answer (text, no tool call), how grounded it is in the chunks the task retrieved
(core/grounding.py). The task record gets the last answer's groundedness and the task's landfill.

The fingerprint sets the landfill is counted against and the grounding index are process-local (a bounded LRU of
recent tasks, each dropped when its task ends, within MAX_TOTAL_FINGERPRINTS across tasks): a call's evidence is found
only among the chunks this replica saw retrieved, and counted as resent only when this replica sent it before. Each
call's counts go on the exchange (`tallies`), which the budget settles into the task's ledger, so the record sums every
replica's calls. It never answers or fails a call.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ragtoll.instrumentation import semconv as sc

from ..core import tokens
from ..core.evidence_track import evidence_header, evidence_pieces, measure_prompt
from ..core.grounding import Grounding, TaskEvidence, chunk_words
from ..model import Chunk
from ..request.exchange import Exchange, Stage, contract
from ..request.offload import off_loop_if_big

EVIDENCE_HEADER = b"x-ragtoll-evidence"
MAX_TASKS = 10_000
MAX_FINGERPRINTS = 20_000  # per task and set: past this the task's oldest evidence is forgotten
# across the process (~100 bytes each): past this the least recently used tasks' evidence is forgotten
MAX_TOTAL_FINGERPRINTS = 1_000_000
# of one retrieval answer, the top results fingerprinted and how much of each: an agent's prompt
# carries its top results; hashing all 7,000 results of a 7 MB answer kept a core busy (issue 30)
MAX_EVIDENCE_CHUNKS = 64
MAX_EVIDENCE_CHARS = 16 * 1024
_LLM = frozenset({"chat", "text_completion"})


@dataclass(slots=True)
class _Seen:
    evidence: set[str] = field(default_factory=set)  # passage fingerprints the task retrieved
    sent: set[str] = field(default_factory=set)  # of those, the ones already in an earlier prompt
    words: TaskEvidence = field(default_factory=TaskEvidence)  # the chunks' content words (groundedness)
    prompt_tokens: int = 0  # evidence tokens in the task's prompts
    resent_tokens: int = 0  # ... already sent in an earlier prompt
    grounding: Grounding | None = None  # of the task's last answer

    def record(self) -> dict[str, Any]:
        g = self.grounding
        return {"prompt_tokens": self.prompt_tokens, "resent_tokens": self.resent_tokens,
                "chunks_indexed": len(self.words.keys), "claims": g.claims if g else None,
                "claims_supported": g.supported if g else None, "citations": g.citations if g else None,
                "citations_retrieved": g.citations_retrieved if g else None}


class EvidenceStage(Stage):
    contract = contract(response_reads="observation new_chunks response_headers",
                        end_reads="task status call observation span", end_writes="tallies")

    def __init__(self) -> None:
        self._tasks: OrderedDict[str, _Seen] = OrderedDict()
        self._total = 0  # fingerprints held across every task (MAX_TOTAL_FINGERPRINTS)

    async def on_response(self, ex: Exchange) -> None:
        """`x-ragtoll-evidence` for a retrieval answer read whole; what is new to the task the
        budget stage worked out before (`ex.new_chunks`, from the task's ledger)."""
        chunks = ex.observation.chunks
        if chunks is not None and ex.new_chunks is not None:
            ex.response_headers.append((EVIDENCE_HEADER, evidence_header(chunks, ex.new_chunks).encode()))

    async def on_end(self, ex: Exchange) -> None:
        if ex.task is None or ex.status != 200:
            return
        op = ex.call.operation
        if op == "retrieval" and ex.observation.chunks:
            chunks = [c for c in ex.observation.chunks[:MAX_EVIDENCE_CHUNKS] if c.text]
            texts = [c.text[:MAX_EVIDENCE_CHARS] for c in chunks]
            pieces, words = await off_loop_if_big(sum(map(len, texts)), _read_chunks, chunks, texts)
            self._grow(ex.task.id, "evidence", pieces)
            seen = self._task(ex.task.id)
            for key, content in words:
                self._total += seen.words.put(key, content)
            self._shrink()
        elif op in _LLM:
            seen = self._tasks.get(ex.task.id)
            if seen is None or not seen.evidence:
                return
            self._tasks.move_to_end(ex.task.id)
            attrs: dict[str, Any] = {}
            if ex.call.prompt_texts:
                encoding, _exact = tokens.encoding_for_model(ex.call.model)
                texts = list(ex.call.prompt_texts)
                m = await off_loop_if_big(sum(map(len, texts)), measure_prompt, texts, frozenset(seen.evidence),
                                           frozenset(seen.sent), encoding)
                self._grow(ex.task.id, "sent", m.sent)
                seen.prompt_tokens += m.evidence_tokens
                seen.resent_tokens += m.duplicate_tokens
                ex.tallies.prompt_tokens, ex.tallies.resent_tokens = m.evidence_tokens, m.duplicate_tokens
                attrs = {sc.EVIDENCE_PROMPT_TOKENS: m.evidence_tokens, sc.EVIDENCE_DUPLICATE_TOKENS: m.duplicate_tokens}
            obs = ex.observation
            if obs.output_text and not obs.tool_calls:  # an answer, not a step: how grounded is it
                answer = "".join(obs.output_text)
                # the work grows with the answer and the chunks its words are in: up to ~5 ms at the bounds
                seen.grounding = g = await off_loop_if_big(len(answer) * len(seen.words.keys) // 16,
                                                            seen.words.ground, answer)
                attrs.update({sc.EVIDENCE_CLAIMS: g.claims, sc.EVIDENCE_CLAIMS_SUPPORTED: g.supported,
                              sc.EVIDENCE_CITATIONS: g.citations, sc.EVIDENCE_CITATIONS_RETRIEVED: g.citations_retrieved})
                if g.share is not None:
                    attrs[sc.EVIDENCE_GROUNDEDNESS] = g.share
            if ex.span is not None and attrs:
                ex.span.set_attributes(attrs)

    def annotate(self, record: dict[str, Any]) -> None:
        """A task ended: its record gets the last answer's groundedness and the task's evidence
        numbers; the evidence token counts are the task ledger's (every replica's calls,
        `task_record`) where it holds them, else this process's."""
        seen = self._tasks.get(str(record.get("task_id")))
        if seen is not None:
            record["groundedness"] = seen.grounding.share if seen.grounding is not None else None
            record["evidence"] = {**seen.record(), **(record.get("evidence") or {})}

    def on_task_end(self, task_id: str) -> None:
        self._drop(task_id)

    def _grow(self, task_id: str, which: str, pieces: set[str] | frozenset[str]) -> None:
        """Add `pieces` to one of the task's sets, within the per-task and the process-wide bounds."""
        seen = self._task(task_id)
        kept: set[str] = getattr(seen, which)
        before = len(kept)
        kept |= pieces
        _bound(kept)
        self._total += len(kept) - before
        self._shrink()

    def _shrink(self) -> None:
        while self._total > MAX_TOTAL_FINGERPRINTS and len(self._tasks) > 1:
            self._drop(next(iter(self._tasks)))  # the least recently used task's evidence

    def _drop(self, task_id: str) -> None:
        seen = self._tasks.pop(task_id, None)
        if seen is not None:
            self._total -= len(seen.evidence) + len(seen.sent) + seen.words.postings

    def _task(self, task_id: str) -> _Seen:
        seen = self._tasks.get(task_id)
        if seen is None:
            seen = self._tasks[task_id] = _Seen()
            while len(self._tasks) > MAX_TASKS:
                self._drop(next(iter(self._tasks)))
        else:
            self._tasks.move_to_end(task_id)
        return seen


def _read_chunks(chunks: list[Chunk], texts: list[str]) -> tuple[set[str], list[tuple[str, set[str]]]]:
    """A retrieval answer's passage fingerprints (the landfill) and each chunk's content words (grounding)."""
    out: set[str] = set()
    for text in texts:
        out |= evidence_pieces(text)
    return out, chunk_words(chunks, texts)


def _bound(fingerprints: set[str]) -> None:
    while len(fingerprints) > MAX_FINGERPRINTS:
        fingerprints.pop()
