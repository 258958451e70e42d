"""Evidence stage: what each call did with evidence. A retrieval answer read whole is described
to the agent (`x-ragtoll-evidence`: how many chunks came back, how many are new to the task, the top
score and the margin); on each LLM call, how many prompt tokens are evidence the task retrieved
earlier, and how many of those were already sent in an earlier prompt (the context landfill).

The landfill count is process-local (a bounded LRU of recent tasks, each dropped when its task
ends, within MAX_TOTAL_FINGERPRINTS across tasks), so behind several replicas a task's numbers cover the calls this replica saw. It never
answers or fails a call.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ragtoll.instrumentation import semconv as sc

from ..core import tokens
from ..core.evidence_track import evidence_header, evidence_pieces, measure_prompt
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


class EvidenceStage(Stage):
    contract = contract(response_reads="observation new_chunks response_headers",
                        end_reads="task status call observation span")

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
            texts = [c.text[:MAX_EVIDENCE_CHARS] for c in ex.observation.chunks[:MAX_EVIDENCE_CHUNKS] if c.text]
            pieces = await off_loop_if_big(sum(map(len, texts)), _pieces_of, texts)
            self._grow(ex.task.id, "evidence", pieces)
        elif op in _LLM and ex.call.prompt_texts:
            seen = self._tasks.get(ex.task.id)
            if seen is None or not seen.evidence:
                return
            self._tasks.move_to_end(ex.task.id)
            encoding, _exact = tokens.encoding_for_model(ex.call.model)
            texts = list(ex.call.prompt_texts)
            m = await off_loop_if_big(sum(map(len, texts)), measure_prompt, texts, frozenset(seen.evidence),
                                       frozenset(seen.sent), encoding)
            self._grow(ex.task.id, "sent", m.sent)
            if ex.span is not None:
                ex.span.set_attributes({sc.EVIDENCE_PROMPT_TOKENS: m.evidence_tokens,
                                        sc.EVIDENCE_DUPLICATE_TOKENS: m.duplicate_tokens})

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
        while self._total > MAX_TOTAL_FINGERPRINTS and len(self._tasks) > 1:
            self._drop(next(iter(self._tasks)))  # the least recently used task's evidence

    def _drop(self, task_id: str) -> None:
        seen = self._tasks.pop(task_id, None)
        if seen is not None:
            self._total -= len(seen.evidence) + len(seen.sent)

    def _task(self, task_id: str) -> _Seen:
        seen = self._tasks.get(task_id)
        if seen is None:
            seen = self._tasks[task_id] = _Seen()
            while len(self._tasks) > MAX_TASKS:
                self._drop(next(iter(self._tasks)))
        else:
            self._tasks.move_to_end(task_id)
        return seen


def _pieces_of(texts: list[str]) -> set[str]:
    out: set[str] = set()
    for text in texts:
        out |= evidence_pieces(text)
    return out


def _bound(fingerprints: set[str]) -> None:
    while len(fingerprints) > MAX_FINGERPRINTS:
        fingerprints.pop()
