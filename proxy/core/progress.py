"""Is the task still getting somewhere? One verdict per retrieval (and per rerank). Pure: no I/O.

A retrieval is **fruitful** when its top-ranked results bring evidence the task has not seen. The
tail does not count: a reworded query brings back a slightly different tail almost every time, so
"any new chunk" calls every runaway retrieval progress. The measure is rank-weighted novelty over
the top `top_k` results (weights 1/log2(rank + 2), as in DCG), each weight scaled by the result's
score relative to the first result's when the scores are monotone in the listed order (a
similarity falls, a distance rises), so a new chunk that scored near the top counts almost fully
and a new chunk far behind counts little.

A query that rewords an earlier query of the task (similar by the cache's embedder when one is
configured, by shared content words otherwise) has to clear a higher bar: rewording the same
question and getting one new result at rank 3 is what a runaway loop looks like; a new hop of a
multi-hop question is a different query and brings new results at the top.

Novelty is not progress on its own: a retrieval is **for the question** when at least half of its
query's content words are the task's question's (the first query or user message this process saw
for the task) or words of the top results of the task's earlier retrievals for the question (the
next hop of a multi-hop question names what the previous hop found). An agent that asks a new,
unrelated question each time gets fruitful verdicts (new results) that are not for the question:
only a fruitful retrieval for the question lets a task climb to a larger profile (`escalate_to`).

Reranks: a rerank whose documents were all ranked before in the task is fruitless.
LLM steps: a tool call the model already made earlier in the transcript is a repeated step
(`repeated_tool_calls`), recorded as a signal; the retrieval it leads to gets its own verdict.

Every verdict carries its reason and numbers, for spans and task records.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from itertools import pairwise

import orjson
import xxhash

from ..model import Chunk
from .evidence_track import chunk_key, fingerprint
from .queries import normalize
from .verify import content_overlap, features

# reasons
NEW_TOP = "new_top_results"
REWORDED_NEW_TOP = "reworded_query_new_top_results"
TOP_SEEN = "top_results_seen"
REWORDED = "reworded_query_top_results_seen"
REPEATED = "repeated_query"
NO_RESULTS = "no_results"
UNREAD = "unread"  # the answer was not read (unknown format, oversized, stream cut): no verdict
RERANK_NEW = "new_documents"
RERANK_SEEN = "documents_already_ranked"

MAX_QUERIES = 32  # earlier queries a task keeps for the similarity check (the most recent)
MAX_QUERY_WORDS = 64  # content words kept of each (the first, in order): a long query costs no more
SHOWN_CHARS = 200  # of each earlier query's text, kept to name it (`similar_to`)
MAX_EVIDENCE_WORDS = 2048  # content words of a task's evidence for its question kept (the first ones)
FOR_QUESTION = 0.5  # share of a query's content words the question and its evidence must hold
MAX_EVIDENCE_TEXTS = 48  # top results of a task's evidence kept to read (when a query needs their words)


@dataclass(frozen=True, slots=True)
class ProgressRules:
    """How verdicts are reached (config `budgets.progress`)."""

    top_k: int = 3  # results that count as "the top"
    min_novelty: float = 0.2  # weighted novelty a retrieval needs to be fruitful
    reworded_novelty: float = 0.45  # ... when its query rewords an earlier one
    lexical_similarity: float = 0.5  # shared content words (Jaccard) that make a query a rewording
    embedding_similarity: float = 0.85  # cosine that makes a query a rewording (with an embedder)


@dataclass(frozen=True, slots=True)
class Verdict:
    fruitful: bool | None  # None: no verdict (the answer was not read)
    reason: str
    novelty: float = 0.0  # weighted share of the top results that are new to the task
    new_top: int = 0  # top results new to the task
    top: int = 0  # results looked at (at most top_k)
    similarity: float = 0.0  # to the most similar earlier query of the task
    similar_to: str | None = None  # that query
    # the query asks for the task's question (or the evidence it led to); None: not judged (no question known)
    for_question: bool | None = None

    @property
    def evidence(self) -> bool:
        """Fruitful evidence for the task's question: what lets a task climb (`escalate_to`)."""
        return bool(self.fruitful) and self.for_question is True

    def attributes(self) -> dict[str, object]:
        """Span / record attributes (without the `ragtoll.progress.` prefix)."""
        out: dict[str, object] = {"reason": self.reason, "novelty": round(self.novelty, 3),
                                  "new_top": self.new_top, "top": self.top,
                                  "similarity": round(self.similarity, 3)}
        if self.fruitful is not None:
            out["fruitful"] = self.fruitful
        if self.for_question is not None:
            out["for_question"] = self.for_question
        if self.similar_to is not None:
            out["similar_to"] = self.similar_to[:200]
        return out


def _score_factors(chunks: Sequence[Chunk]) -> list[float]:
    """Per result, its score relative to the first result's (1.0 each when scores say nothing)."""
    scores = [c.score for c in chunks]
    if len(scores) < 2 or any(s is None or not math.isfinite(s) or s < 0 for s in scores):
        return [1.0] * len(scores)
    vals = [float(s) for s in scores if s is not None]
    if all(a >= b for a, b in pairwise(vals)) and vals[0] > 0:  # a similarity, best first
        return [v / vals[0] for v in vals]
    if all(a <= b for a, b in pairwise(vals)):  # a distance, best first
        eps = 1e-6
        return [(vals[0] + eps) / (v + eps) for v in vals]
    return [1.0] * len(vals)


def novelty(chunks: Sequence[Chunk], seen: AbstractSet[str], top_k: int) -> tuple[float, int, int]:
    """(weighted novelty, new results, results) over the first `top_k` results."""
    top = list(chunks[:top_k])
    if not top:
        return 0.0, 0, 0
    factors = _score_factors(top)
    total = new = 0.0
    n_new = 0
    mine: set[str] = set()
    for rank, (chunk, factor) in enumerate(zip(top, factors)):
        w = factor / math.log2(rank + 2)
        total += 1.0 / math.log2(rank + 2)
        key = chunk_key(chunk)
        if key not in seen and key not in mine:
            new += w
            n_new += 1
        mine.add(key)
    return (new / total if total else 0.0), n_new, len(top)


def lexical_similarity(query: str, earlier: Iterable[str]) -> tuple[float, str | None]:
    """The highest share of content words (stemmed, Jaccard) `query` has with an earlier query."""
    return _most_similar(query, ((q, features(q).content) for q in earlier))


def _most_similar(query: str, earlier: Iterable[tuple[str, frozenset[str]]],
                  mine: frozenset[str] | None = None) -> tuple[float, str | None]:
    mine = features(query).content if mine is None else mine
    own = normalize(query)
    best, which, _ = _closest(own, ((q, normalize(q), words) for q, words in earlier), mine)
    return best, which


def _closest(own: str, earlier: Iterable[tuple[str, str, frozenset[str]]],
             mine: frozenset[str]) -> tuple[float, str | None, bool]:
    """(similarity, shown text, the same query) of the earlier (shown, normalised form or its hash,
    words) most like this query (`own`: its normalised form or hash, `mine`: its words)."""
    best, which = 0.0, None
    for shown, norm, words in earlier:
        if norm == own:
            return 1.0, shown, True
        s = content_overlap(mine, words) if mine else 0.0
        if s > best:
            best, which = s, shown
    return best, which, False


def _query_words(query: str) -> frozenset[str]:
    """The first MAX_QUERY_WORDS content words of `query`, in the order they appear."""
    content = features(query).content
    if len(content) <= MAX_QUERY_WORDS:
        return frozenset(content)
    kept: list[str] = []
    for word in normalize(query).split():
        if word in content and word not in kept:
            kept.append(word)
            if len(kept) == MAX_QUERY_WORDS:
                break
    return frozenset(kept or list(content)[:MAX_QUERY_WORDS])


class _Task:
    """What a process remembers of one task's search."""

    __slots__ = ("asked", "evidence", "queries", "question")

    def __init__(self, asked: str | None = None) -> None:
        # (shown text, normalised form's hash, content words) of the last MAX_QUERIES queries
        self.queries: deque[tuple[str, str, frozenset[str]]] = deque(maxlen=MAX_QUERIES)
        self.asked = asked  # the task's question as first seen, read into `question` when a search needs it
        # the task's question and its evidence's content words (None: no question known yet)
        self.question: set[str] | None = None
        # top results of its evidence not read into `question` yet (read when a query needs them)
        self.evidence: list[str] = []

    def words(self) -> set[str] | None:
        if self.question is None and self.asked:
            self.question = set(list(features(self.asked[:4096]).content)[:MAX_EVIDENCE_WORDS])
        return self.question

    def asks_for_it(self, query_words: frozenset[str], question: set[str]) -> bool:
        """`for_question`, reading the evidence's words only when the question's own do not do."""
        if for_question(query_words, question):
            return True
        if not self.evidence:
            return False
        for text in self.evidence:
            if len(question) >= MAX_EVIDENCE_WORDS:
                break
            question.update(features(text).content)
        self.evidence.clear()
        return for_question(query_words, question)


class RecentQueries:
    """Each task's last MAX_QUERIES retrieval queries with their content words, for the rewording
    check, and the content words of its question and of the evidence found for it; at most
    `max_tasks` tasks (least recently used dropped), each forgotten when its task ends. Kept per
    process: on several replicas a task's queries are judged against those its replica saw.

    Bounded per task whatever it sends: of each query SHOWN_CHARS of text, a 16-byte hash and
    MAX_QUERY_WORDS words; of its question MAX_EVIDENCE_WORDS words; MAX_EVIDENCE_TEXTS texts of
    2 KB. A query past `server.max_query_chars` never gets here (the pipeline keys it by hash)."""

    def __init__(self, max_tasks: int = 10_000) -> None:
        self._tasks: OrderedDict[str, _Task] = OrderedDict()
        self._max_tasks = max_tasks

    def _task(self, task_id: str) -> _Task:
        task = self._tasks.get(task_id)
        if task is None:
            task = self._tasks[task_id] = _Task()
            if len(self._tasks) > self._max_tasks:
                self._tasks.popitem(last=False)
        self._tasks.move_to_end(task_id)
        return task

    def asked(self, task_id: str, question: str | None) -> None:
        """The task's question (its first query or user message), unless one is known already."""
        if question and task_id not in self._tasks:
            self._task(task_id).asked = question[:4096]

    def judge(self, task_id: str, chunks: Sequence[Chunk] | None, seen: AbstractSet[str], query: str | None,
              rules: ProgressRules) -> Verdict:
        """The verdict on a retrieval of `task_id`; remembers its query for the next ones, and its
        top results' words when it brought evidence for the question."""
        task = self._tasks.get(task_id)
        earlier = task.queries if task is not None else None
        words = _query_words(query) if query else frozenset()
        own = xxhash.xxh3_128_hexdigest(normalize(query).encode("utf-8", "surrogatepass")) if query else ""
        best, which, same = _closest(own, earlier, words) if query and earlier else (0.0, None, False)
        # the same query again is named by itself, so judge_retrieval sees a repeat however long it is
        sim = (best, query if same else which)
        verdict = judge_retrieval(chunks, seen, query, sim, rules.lexical_similarity, rules)
        if not query:
            return verdict
        task = self._task(task_id)
        task.queries.append((query[:SHOWN_CHARS], own, words))
        question = task.words()
        if question is None:  # the task's first search names its question
            question = task.question = set(words)
        verdict = replace(verdict, for_question=task.asks_for_it(words, question))
        if verdict.evidence and chunks and len(question) < MAX_EVIDENCE_WORDS and len(task.evidence) < MAX_EVIDENCE_TEXTS:
            task.evidence.extend(chunk.text[:2048] for chunk in chunks[:rules.top_k] if chunk.text)
        return verdict

    def forget(self, task_id: str) -> None:
        self._tasks.pop(task_id, None)


def for_question(query_words: AbstractSet[str], question: AbstractSet[str]) -> bool:
    """A query asks for the question when at least FOR_QUESTION of its content words are the
    question's or its evidence's (a query of no content words does not)."""
    if not query_words:
        return False
    return len(query_words & question) >= FOR_QUESTION * len(query_words)


def cosine_similarity(vector: Sequence[float], earlier: Iterable[tuple[str, Sequence[float]]]) -> tuple[float, str | None]:
    """The highest cosine between `vector` and an earlier query's (unit vectors from the embedder)."""
    best, which = 0.0, None
    for q, v in earlier:
        s = float(sum(a * b for a, b in zip(vector, v)))
        if s > best:
            best, which = s, q
    return best, which


def judge_retrieval(chunks: Sequence[Chunk] | None, seen: AbstractSet[str], query: str | None,
                    similarity: tuple[float, str | None], reworded_at: float,
                    rules: ProgressRules) -> Verdict:
    """The verdict on one retrieval. `seen`: the task's chunk keys before this retrieval;
    `similarity`: (highest similarity to an earlier query, that query); `reworded_at`: the
    similarity that makes a rewording (lexical or embedding threshold, whichever measured)."""
    if chunks is None:
        return Verdict(None, UNREAD)
    if not chunks:
        return Verdict(False, NO_RESULTS, similarity=similarity[0], similar_to=similarity[1])
    nov, n_new, n = novelty(chunks, seen, rules.top_k)
    sim, which = similarity
    if query is not None and which is not None and normalize(which) == normalize(query) and n_new == 0:
        return Verdict(False, REPEATED, nov, n_new, n, sim, which)
    reworded = which is not None and sim >= reworded_at
    bar = rules.reworded_novelty if reworded else rules.min_novelty
    if nov >= bar and n_new > 0:
        return Verdict(True, REWORDED_NEW_TOP if reworded else NEW_TOP, nov, n_new, n, sim, which)
    return Verdict(False, REWORDED if reworded else TOP_SEEN, nov, n_new, n, sim, which)


def judge_rerank(documents: Sequence[str], ranked: AbstractSet[str]) -> tuple[Verdict, set[str]]:
    """The verdict on one rerank, and the fingerprints of its documents (add them to `ranked`)."""
    fps = {fingerprint(d) for d in documents}
    if not fps:
        return Verdict(None, UNREAD), fps
    fresh = len(fps - ranked)
    nov = fresh / len(fps)
    return Verdict(fresh > 0, RERANK_NEW if fresh else RERANK_SEEN, nov, fresh, len(fps)), fps


def tool_call_signature(name: str, arguments: str) -> str:
    """One spelling of a tool call: its name and its arguments as canonical JSON (or text)."""
    try:
        args = orjson.dumps(orjson.loads(arguments), option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, TypeError):
        args = normalize(arguments or "").encode()
    return name + "\x00" + args.decode()


def repeated_tool_calls(calls: Sequence[tuple[str, str]]) -> int:
    """How many of the transcript's tool calls (name, arguments), in order, repeat an earlier one."""
    seen: set[str] = set()
    repeats = 0
    for name, arguments in calls:
        sig = tool_call_signature(name, arguments)
        if sig in seen:
            repeats += 1
        seen.add(sig)
    return repeats
