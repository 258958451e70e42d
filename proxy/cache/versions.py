"""Source versions: the version every partition key carries, so a new version makes older entries unreachable.

A route's current version is, newest write wins: set by the ingestion pipeline through
`POST /admin/sources/{name}/version`, or seen on a retrieval response (header or field), kept in
the evidence store so every replica agrees; else the static `cache.sources` value; else "0".
Reads are memoised for `local_ttl_s` per replica; writes on this replica are seen at once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

from .entry import EvidenceStore

VALID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, no spaces


class Versions:
    def __init__(self, store: EvidenceStore, static: Mapping[str, str], local_ttl_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._static = dict(static)
        self._ttl = local_ttl_s
        self._clock = clock
        self._local: dict[str, tuple[str, float]] = {}

    async def current(self, source: str) -> str:
        found = self._local.get(source)
        now = self._clock()
        if found is not None and found[1] > now:
            return found[0]
        version = await self._store.get_version(source) or self._static.get(source) or "0"
        self._local[source] = (version, now + self._ttl)
        return version

    async def set(self, source: str, version: str) -> None:
        if not VALID.match(version):
            raise ValueError("a version is 1-128 printable ASCII characters without spaces")
        await self._store.set_version(source, version)
        self._local[source] = (version, self._clock() + self._ttl)

    async def observe(self, source: str, version: str | None) -> str:
        """Record a version seen on a response; returns the version its evidence belongs to."""
        if not version or not VALID.match(version):
            return await self.current(source)
        if version != await self.current(source):
            await self.set(source, version)
        return version
