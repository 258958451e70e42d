"""In-process evidence store: LRU-bounded by entry count and bytes, TTL on every entry.

Similarity is a numpy matrix product over the partition's vectors, rebuilt lazily after writes.
Single event loop, no awaits inside a method: no lock needed.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from .evidence import VERSION_TTL_S, VERSIONS_MAX, Entry

if TYPE_CHECKING:
    import numpy as np

# A threshold the self-audit raised: kept as long, renewed by every further raise.
THRESHOLD_TTL_S = VERSION_TTL_S
# Raised thresholds, bounds and entry floors kept at most (each disagreeing audit may add an entry's
# floor): past this the least recently raised is forgotten, and may be raised again by a later audit.
MAX_THRESHOLDS = 100_000

_V = TypeVar("_V")


class _Partition:
    __slots__ = ("keys", "matrix", "vectors")

    def __init__(self) -> None:
        self.vectors: dict[str, np.ndarray] = {}
        self.matrix: np.ndarray | None = None
        self.keys: list[str] = []


class MemoryEvidenceStore:
    shared = False  # one process: the cache's lexical index already holds every entry

    def __init__(self, max_entries: int = 50_000, max_bytes: int = 256 * 1024 * 1024,
                 max_partition_entries: int = 5_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_partition_entries = max_partition_entries
        self._clock = clock
        self._lru: OrderedDict[tuple[str, str], tuple[Entry, float]] = OrderedDict()
        self._parts: dict[str, _Partition] = {}
        self._bytes = 0
        # source -> ((its version fields, the values seen per channel -> when first seen), expiry)
        self._sources: dict[str, tuple[tuple[dict[str, str], dict[str, dict[str, float]]], float]] = {}
        self._thresholds: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        return self._bytes

    async def get(self, pkey: str, qkey: str) -> Entry | None:
        found = self._lru.get((pkey, qkey))
        if found is None:
            return None
        if found[1] <= self._clock():
            self._drop((pkey, qkey))
            return None
        self._lru.move_to_end((pkey, qkey))
        return found[0]

    async def get_many(self, pkey: str, qkeys: Sequence[str]) -> list[Entry | None]:
        return [await self.get(pkey, q) for q in qkeys]

    async def nearest(self, pkey: str, vector: np.ndarray, min_similarity: float, limit: int,
                      keys: list[str] | None = None) -> list[tuple[float, Entry]]:
        part = self._parts.get(pkey)
        if part is None or not part.vectors:
            return []
        if keys is not None:
            scored = sorted(((float(part.vectors[k] @ vector), k) for k in keys if k in part.vectors), reverse=True)
            now = self._clock()
            picked: list[tuple[float, Entry]] = []
            for sim, k in scored:
                found = self._lru.get((pkey, k))
                if sim < min_similarity or len(picked) >= limit:
                    break
                if found is not None and found[1] > now:
                    picked.append((sim, found[0]))
            return picked
        import numpy as np  # only stores with vectors get here: an embedder other than `none`

        if part.matrix is None:
            part.keys = list(part.vectors)
            part.matrix = np.stack([part.vectors[k] for k in part.keys])
        sims = part.matrix @ vector
        order = np.argsort(-sims)[: max(limit * 2, limit + 2)]
        out: list[tuple[float, Entry]] = []
        now = self._clock()
        for i in order:
            sim = float(sims[i])
            if sim < min_similarity or len(out) >= limit:
                break
            key = (pkey, part.keys[i])
            found = self._lru.get(key)
            if found is None or found[1] <= now:
                continue  # expired; dropped on its next exact read or eviction
            out.append((sim, found[0]))
        return out

    async def put(self, pkey: str, qkey: str, entry: Entry, vector: np.ndarray | None, ttl_s: int,
                  aliases: Sequence[str] = ()) -> None:
        for alias in aliases:
            await self.put(pkey, alias, entry, None, ttl_s)
        key = (pkey, qkey)
        if key in self._lru:
            self._drop(key)
        size = entry.size() + (vector.nbytes if vector is not None else 0)
        if size > self.max_bytes:
            return
        self._lru[key] = (entry, self._clock() + ttl_s)
        self._bytes += size
        if vector is not None:
            part = self._parts.setdefault(pkey, _Partition())
            part.vectors[qkey] = vector.astype("float32", copy=False)
            part.matrix = None
            if len(part.vectors) > self.max_partition_entries:
                oldest = next(iter(part.vectors))
                self._drop((pkey, oldest))
        while len(self._lru) > self.max_entries or self._bytes > self.max_bytes:
            self._drop(next(iter(self._lru)))

    def _drop(self, key: tuple[str, str]) -> None:
        found = self._lru.pop(key, None)
        part = self._parts.get(key[0])
        vec = part.vectors.pop(key[1], None) if part is not None else None
        if part is not None and vec is not None:
            part.matrix = None
            if not part.vectors:
                del self._parts[key[0]]
        if found is not None:
            self._bytes -= found[0].size() + (vec.nbytes if vec is not None else 0)

    async def recent(self, pkey: str, since: float, limit: int = 1000) -> list[tuple[str, str, float]]:
        return []

    async def get_source(self, source: str) -> dict[str, str] | None:
        found = self._unexpired(self._sources, source)
        return dict(found[0]) if found is not None else None

    async def advance_source(self, source: str, channel: str, value: str, now: float) -> tuple[dict[str, str], bool]:
        fields, seen = self._unexpired(self._sources, source) or ({}, {})
        values = seen.setdefault(channel, {})  # value -> when first seen, oldest first
        current = True
        if fields.get(channel) == value:
            fields[channel + "_at"] = repr(now)
        elif value in values:
            current = False  # seen before and superseded: never current again
        else:
            while values and now - next(iter(values.values())) > VERSION_TTL_S:
                del values[next(iter(values))]  # as old as the state itself may live
            if len(values) >= VERSIONS_MAX:
                current = False  # full: refused rather than forgetting an old value that could return
            else:
                if channel in fields:
                    values.setdefault(fields[channel], now)
                values[value] = now
                fields[channel], fields[channel + "_at"] = value, repr(now)
        self._sources[source] = ((fields, seen), self._clock() + VERSION_TTL_S)
        return dict(fields), current

    async def claim_probe(self, source: str, now: float, interval: float) -> tuple[bool, dict[str, str]]:
        fields, seen = self._unexpired(self._sources, source) or ({}, {})
        claimed = now - float(fields.get("probed_at", "-inf")) >= interval
        if claimed:
            fields["probed_at"] = repr(now)
        self._sources[source] = ((fields, seen), self._clock() + VERSION_TTL_S)
        return claimed, dict(fields)

    async def release_probe(self, source: str, claimed_at: float) -> None:
        found = self._unexpired(self._sources, source)
        if found is not None and found[0].get("probed_at") == repr(claimed_at):
            del found[0]["probed_at"]

    async def get_threshold(self, scope: str) -> float | None:
        return self._unexpired(self._thresholds, scope)

    async def raise_threshold(self, scope: str, threshold: float) -> float:
        current = await self.get_threshold(scope)
        value = threshold if current is None else max(current, threshold)
        self._thresholds[scope] = (value, self._clock() + THRESHOLD_TTL_S)
        self._thresholds.move_to_end(scope)
        while len(self._thresholds) > MAX_THRESHOLDS:
            self._thresholds.popitem(last=False)
        return value

    def _unexpired(self, table: dict[str, tuple[_V, float]], key: str) -> _V | None:
        """The value stored under `key` with its expiry time, unless it has expired."""
        found = table.get(key)
        return None if found is None or found[1] <= self._clock() else found[0]

    async def aclose(self) -> None:
        return None
