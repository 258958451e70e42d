"""Replica-local lexical index of cached queries: which entries could a query be served from, similarity aside?

Pure. Verification needs equal numbers, units, dates, negation, directions and quoted strings,
and enough shared content words; entries that cannot meet that are never worth an embedding.
A miss with no such entry skips the embedding on the request path, and still records which
check refused against the closest entry. Bounded per partition and in partitions.
"""

from __future__ import annotations

from collections import OrderedDict

from ..core.verify import INTENT_FLOOR, Features, content_overlap, features, verify

MAX_PARTITIONS = 10_000
MAX_PER_PARTITION = 5_000
MAX_SCAN = 200  # entries sharing a word with the query, looked at per lookup


class _Part:
    __slots__ = ("entries", "postings")

    def __init__(self) -> None:
        self.entries: OrderedDict[str, tuple[str, frozenset[str]]] = OrderedDict()  # qkey -> (query, content)
        self.postings: dict[str, set[str]] = {}


class LexicalIndex:
    def __init__(self) -> None:
        self._parts: OrderedDict[str, _Part] = OrderedDict()

    def add(self, pkey: str, qkey: str, query: str, content: frozenset[str]) -> None:
        part = self._parts.get(pkey)
        if part is None:
            part = self._parts[pkey] = _Part()
            while len(self._parts) > MAX_PARTITIONS:
                self._parts.popitem(last=False)
        part.entries[qkey] = (query, content)
        for w in content:
            part.postings.setdefault(w, set()).add(qkey)
        while len(part.entries) > MAX_PER_PARTITION:
            old, (_, words) = part.entries.popitem(last=False)
            for w in words:
                part.postings.get(w, set()).discard(old)

    def candidates(self, pkey: str, mine: Features, vocab: frozenset[str], limit: int = 20,
                   floor: float = INTENT_FLOOR) -> tuple[list[str], str]:
        """Query keys of entries that pass verification against `mine` (similarity aside) with at least
        `floor` of their content words shared, most shared content first; when there are none, the
        closest entry's refusal."""
        part = self._parts.get(pkey)
        if part is None:
            return [], "none"
        seen: set[str] = set()
        for w in mine.content:
            seen |= part.postings.get(w, set())
            if len(seen) >= MAX_SCAN:
                break
        if not seen and not mine.content:
            seen = set(list(part.entries)[-MAX_SCAN:])  # a query of no content words: compare with the newest
        scored = sorted(((content_overlap(mine.content, part.entries[q][1]), q) for q in seen if q in part.entries),
                        reverse=True)
        closest = ""
        passed: list[str] = []
        for overlap, q in scored:
            if overlap < floor or len(passed) >= limit:
                break
            refused = verify(mine, features(part.entries[q][0], vocab), 1.0, vocab, intent_floor=floor)
            if refused is None:
                passed.append(q)
            else:
                closest = closest or refused
        if passed:
            return passed, ""
        if closest:
            return [], f"verify:{closest}"
        return [], "verify:intent" if scored else "none"
