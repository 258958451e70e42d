"""A cached evidence entry and its wire form; the evidence store protocol both stores implement.

Pure. An entry keeps what a serve needs (the upstream's response body, the chunk ids and ACLs
in rank order, the owner when an ACL was unknown, the view it was fetched under when the upstream
filters by caller, when it was fetched and the source version it came with) and what verification
needs (the normalised query, the filter-like words seen in the response's metadata and how
clearly its first result led).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True, slots=True)
class Entry:
    query: str  # normalised query text
    top_k: int | None
    chunk_ids: tuple[str, ...]
    acls: tuple[tuple[str, ...] | None, ...]
    body: bytes
    content_type: str = "application/json"
    owner: str | None = None
    vocab: tuple[str, ...] = ()
    created: float = 0.0  # wall-clock seconds when the upstream answered
    margin: float | None = None  # how clearly the first result led its own retrieval (verify.top_margin)
    # the fetcher's view (Principal.view, sorted) when the upstream filters results by caller; None: it
    # answers every caller alike. A principal whose view holds more may have live results this lacks.
    scope: tuple[str, ...] | None = None
    version: str | None = None  # the source version the response carried (repeated on hits)

    def size(self) -> int:
        """Bytes this entry holds in the memory store, estimated on the safe side (checked against
        tracemalloc: a 5-chunk retrieval answer measured 1.56 KB, this says 1.72 KB)."""
        return len(self.body) + len(self.query) + 120 * len(self.chunk_ids) + 64 * len(self.vocab) + 600

    def dumps(self) -> bytes:
        return orjson.dumps({
            "q": self.query, "k": self.top_k, "ids": list(self.chunk_ids),
            "acl": [list(a) if a is not None else None for a in self.acls],
            "b": self.body.decode("utf-8"), "ct": self.content_type, "o": self.owner,
            "v": list(self.vocab), "t": self.created, "m": self.margin,
            "s": list(self.scope) if self.scope is not None else None, "ver": self.version,
        })

    @classmethod
    def loads(cls, raw: bytes) -> Entry:
        d: dict[str, Any] = orjson.loads(raw)
        return cls(
            query=d["q"], top_k=d["k"], chunk_ids=tuple(d["ids"]),
            acls=tuple(tuple(a) if a is not None else None for a in d["acl"]),
            body=d["b"].encode("utf-8"), content_type=d["ct"], owner=d["o"], vocab=tuple(d["v"]), created=d["t"],
            margin=d.get("m"),  # absent from entries filed before margins were kept
            scope=tuple(d["s"]) if d.get("s") is not None else None, version=d.get("ver"),
        )


# Distinct values a source's version channel may name while its state lives (VERSION_TTL_S after
# its last change); a value seen is remembered that long, so no number of newer values brings it
# back as new. Past the cap a new value is refused: the source stops moving forward (its answers
# are not filed, older entries are served only within the staleness bound) - never backward.
VERSIONS_MAX = 100_000
VERSION_TTL_S = 30 * 24 * 3600


class EvidenceStore(Protocol):
    """Entries and their query vectors, per partition. Every key expires after `ttl_s`.

    No lookup ever crosses a partition: `pkey` scopes every call.
    """

    async def get(self, pkey: str, qkey: str) -> Entry | None: ...

    async def get_many(self, pkey: str, qkeys: Sequence[str]) -> list[Entry | None]:
        """`get` of several keys of one partition, in order, in one store round trip."""
        ...

    async def nearest(self, pkey: str, vector: np.ndarray, min_similarity: float, limit: int,
                      keys: list[str] | None = None) -> list[tuple[float, Entry]]:
        """Entries whose query vector has cosine >= min_similarity, best first; only `keys` when given."""
        ...

    async def put(self, pkey: str, qkey: str, entry: Entry, vector: np.ndarray | None, ttl_s: int,
                  aliases: Sequence[str] = ()) -> None:
        """File `entry` (and its query vector) under `qkey`; the entry alone also under each alias, in
        the same round trip."""
        ...

    async def recent(self, pkey: str, since: float, limit: int = 1000) -> list[tuple[str, str, float]]:
        """(query key, normalised query, time filed) of entries with vectors filed after `since`.

        Only shared stores (`shared = True`) need to answer; a replica-local store returns []."""
        ...

    async def get_source(self, source: str) -> dict[str, str] | None:
        """A source's version fields (versions.SourceStore): each channel's value and confirmation time."""
        ...

    async def advance_source(self, source: str, channel: str, value: str, now: float) -> tuple[dict[str, str], bool]:
        """Atomically: confirm `value` if it is the channel's current one, make it current if never seen
        (arrival order), else leave the source as it is; the fields after, and whether `value` is current.
        A value seen before never becomes current again while the source's state lives (no window to
        exhaust); past `VERSIONS_MAX` distinct values a new one is refused (not current)."""
        ...

    async def claim_probe(self, source: str, now: float, interval: float) -> tuple[bool, dict[str, str]]:
        """Whether no probe of `source` was claimed in the last `interval` seconds (then this one is);
        the source's fields."""
        ...

    async def release_probe(self, source: str, claimed_at: float) -> None:
        """Undo the claim made at `claimed_at` (a probe the source refused with 401/403 confirms
        nothing, so it must not hold off the next caller's); a later claim is left alone."""
        ...

    async def get_threshold(self, scope: str) -> float | None:
        """The similarity threshold the self-audit raised for `scope`, shared by every replica (None: not raised)."""
        ...

    async def raise_threshold(self, scope: str, threshold: float) -> float:
        """Set `scope`'s threshold to at least `threshold`, atomically (never lowers it); returns the stored one."""
        ...

    async def aclose(self) -> None: ...
