"""Source versions: the version every partition key carries, so a new version makes older entries unreachable.

A route's version has two parts, each of which only moves forward by being replaced: the one set
by the ingestion pipeline (`POST /admin/sources/{name}/version`, else the static `cache.sources`
value, else "0") and the last one seen on a retrieval response (header or field). Both are kept
in the evidence store so every replica agrees, and composed, so a stale response header can never
bring back entries an admin bump retired. Reads are memoised for `local_ttl_s` per replica.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping

from .entry import EvidenceStore

VALID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, no spaces
_OBSERVED = "#observed"


class Versions:
    def __init__(self, store: EvidenceStore, static: Mapping[str, str], local_ttl_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._static = dict(static)
        self._ttl = local_ttl_s
        self._clock = clock
        self._local: dict[str, tuple[str, float]] = {}

    async def _get(self, key: str) -> str | None:
        found = self._local.get(key)
        now = self._clock()
        if found is not None and found[1] > now:
            return found[0] or None
        value = await self._store.get_version(key)
        self._local[key] = (value or "", now + self._ttl)
        return value

    async def _put(self, key: str, value: str) -> None:
        await self._store.set_version(key, value)
        self._local[key] = (value, self._clock() + self._ttl)

    async def current(self, source: str) -> str:
        admin = await self._get(source) or self._static.get(source) or "0"
        observed = await self._get(source + _OBSERVED)
        return f"{admin}+{observed}" if observed else admin

    async def set(self, source: str, version: str) -> None:
        """The ingestion pipeline's version (admin API)."""
        if not VALID.match(version):
            raise ValueError("a version is 1-128 printable ASCII characters without spaces")
        await self._put(source, version)

    async def observe(self, source: str, version: str | None) -> str:
        """Record a version seen on a response; returns the composed version its evidence belongs to."""
        if version and VALID.match(version) and version != await self._get(source + _OBSERVED):
            await self._put(source + _OBSERVED, version)
        return await self.current(source)
