"""Evidence stage: what each call did with evidence. A retrieval answer read whole is described
to the agent (`x-ragtoll-evidence`: how many chunks came back, how many are new to the task, the top
score and the margin); on each LLM call, how many prompt tokens are evidence the task retrieved
earlier, and how many of those were already sent in an earlier prompt (the context landfill).

The landfill count is process-local (a bounded LRU of recent tasks, each dropped when its task
ends), so behind several replicas a task's numbers cover the calls this replica saw. It never
answers or fails a call.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ragtoll.instrumentation import semconv as sc

from ..core import tokens
from ..core.evidence_track import evidence_header, evidence_pieces, measure_prompt
from ..request.exchange import Exchange, Stage, contract

EVIDENCE_HEADER = b"x-ragtoll-evidence"
MAX_TASKS = 10_000
MAX_FINGERPRINTS = 20_000  # per task and set: past this the task's oldest evidence is forgotten
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
            seen = self._task(ex.task.id)
            for chunk in ex.observation.chunks:
                if chunk.text:
                    seen.evidence |= evidence_pieces(chunk.text)
            _bound(seen.evidence)
        elif op in _LLM and ex.call.prompt_texts:
            seen = self._tasks.get(ex.task.id)
            if seen is None or not seen.evidence:
                return
            self._tasks.move_to_end(ex.task.id)
            encoding, _exact = tokens.encoding_for_model(ex.call.model)
            m = measure_prompt(ex.call.prompt_texts, seen.evidence, seen.sent, encoding)
            seen.sent |= m.sent
            _bound(seen.sent)
            if ex.span is not None:
                ex.span.set_attributes({sc.EVIDENCE_PROMPT_TOKENS: m.evidence_tokens,
                                        sc.EVIDENCE_DUPLICATE_TOKENS: m.duplicate_tokens})

    def on_task_end(self, task_id: str) -> None:
        self._tasks.pop(task_id, None)

    def _task(self, task_id: str) -> _Seen:
        seen = self._tasks.get(task_id)
        if seen is None:
            seen = self._tasks[task_id] = _Seen()
            while len(self._tasks) > MAX_TASKS:
                self._tasks.popitem(last=False)
        else:
            self._tasks.move_to_end(task_id)
        return seen


def _bound(fingerprints: set[str]) -> None:
    while len(fingerprints) > MAX_FINGERPRINTS:
        fingerprints.pop()
