"""Redis evidence store (plain Redis or Cluster, no modules): similarity is computed here, in numpy.

Every key of a partition shares its hash tag `ragtoll:{c:<partition>}:` - the entry blobs
(`e:<query key>`), the vectors hash (`v`) and the insertion-order set (`z`) - so each step is a
single-slot pipeline that runs unchanged on Cluster. Every key has a TTL. A partition keeps at
most `max_partition_entries` vectors; the oldest are trimmed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..stores.redis import connect
from .entry import Entry

VERSION_TTL_S = 30 * 24 * 3600
THRESHOLD_TTL_S = VERSION_TTL_S  # a threshold the self-audit raised; renewed by every further raise
# raise, never lower: concurrent raises from two replicas keep the higher threshold
_RAISE = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'threshold'))
local new = tonumber(ARGV[1])
if cur == nil or new > cur then redis.call('HSET', KEYS[1], 'threshold', ARGV[1]) else new = cur end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return tostring(new)
"""


def _keys(pkey: str) -> tuple[str, str, str]:
    base = f"ragtoll:{{c:{pkey}}}:"
    return base + "e:", base + "v", base + "z"


def _texts(pkey: str) -> str:
    return f"ragtoll:{{c:{pkey}}}:q"  # query key -> normalised query, for other replicas' lexical index


def _audit(scope: str) -> str:
    return f"ragtoll:{{a:{scope}}}:audit"  # the audit scope's hash (its raised threshold)


class RedisEvidenceStore:
    shared = True  # other replicas write here too: lexical indexes sync through `recent`

    def __init__(self, client: Any, max_partition_entries: int = 5_000, owns_client: bool = True) -> None:
        self.client = client
        self.max_partition_entries = max_partition_entries
        self._owns = owns_client

    @classmethod
    def from_url(cls, url: str, max_partition_entries: int = 5_000, timeout_s: float = 0.25) -> RedisEvidenceStore:
        return cls(connect(url, timeout_s=timeout_s), max_partition_entries)

    async def get(self, pkey: str, qkey: str) -> Entry | None:
        e, _, _ = _keys(pkey)
        raw = await self.client.get(e + qkey)
        return Entry.loads(raw) if raw else None

    async def get_many(self, pkey: str, qkeys: Sequence[str]) -> list[Entry | None]:
        e, _, _ = _keys(pkey)  # one hash tag per partition: one MGET, also on a Cluster
        raws = await self.client.mget([e + q for q in qkeys])
        return [Entry.loads(raw) if raw else None for raw in raws]

    async def nearest(self, pkey: str, vector: np.ndarray, min_similarity: float, limit: int,
                      keys: list[str] | None = None) -> list[tuple[float, Entry]]:
        e, v, z = _keys(pkey)
        if keys is not None:
            values = await self.client.hmget(v, keys) if keys else []
            found: dict[bytes, bytes] = {k.encode(): val for k, val in zip(keys, values, strict=True) if val}
        else:
            found = await self.client.hgetall(v)
        if not found:
            return []
        names = list(found)
        matrix = np.frombuffer(b"".join(found[k] for k in names), dtype=np.float32).reshape(len(names), -1)
        if matrix.shape[1] != vector.shape[0]:
            return []  # vectors of another embedder: nothing comparable
        sims = matrix @ vector.astype(np.float32, copy=False)
        order = [i for i in np.argsort(-sims)[: limit * 2 + 2] if sims[i] >= min_similarity]
        if not order:
            return []
        qkeys = [names[i].decode() for i in order]
        blobs = await self.client.mget([e + q for q in qkeys])
        out: list[tuple[float, Entry]] = []
        gone: list[str] = []
        for i, q, blob in zip(order, qkeys, blobs, strict=True):
            if blob is None:
                gone.append(q)  # the entry expired before its vector: drop the vector too
            elif len(out) < limit:
                out.append((float(sims[i]), Entry.loads(blob)))
        if gone:
            pipe = self.client.pipeline(transaction=False)
            pipe.hdel(v, *gone)
            pipe.zrem(z, *gone)
            await pipe.execute()
        return out

    async def put(self, pkey: str, qkey: str, entry: Entry, vector: np.ndarray | None, ttl_s: int) -> None:
        e, v, z = _keys(pkey)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(e + qkey, entry.dumps(), ex=ttl_s)
        if vector is not None:
            pipe.hset(v, qkey, vector.astype(np.float32, copy=False).tobytes())
            pipe.expire(v, ttl_s)
            pipe.hset(_texts(pkey), qkey, entry.query)
            pipe.expire(_texts(pkey), ttl_s)
            pipe.zadd(z, {qkey: time.time()})
            pipe.expire(z, ttl_s)
            pipe.zcard(z)
        result = await pipe.execute()
        if vector is not None and result[-1] > self.max_partition_entries:
            oldest = await self.client.zpopmin(z, result[-1] - self.max_partition_entries)
            drop = [m.decode() if isinstance(m, bytes) else m for m, _ in oldest]
            if drop:
                pipe = self.client.pipeline(transaction=False)
                pipe.hdel(v, *drop)
                pipe.hdel(_texts(pkey), *drop)
                pipe.delete(*[e + q for q in drop])
                await pipe.execute()

    async def recent(self, pkey: str, since: float, limit: int = 1000) -> list[tuple[str, str, float]]:
        """(query key, normalised query, time filed) of vectors filed after `since`, oldest first."""
        _, _, z = _keys(pkey)
        rows = await self.client.zrangebyscore(z, f"({since}", "+inf", start=0, num=limit, withscores=True)
        if not rows:
            return []
        qkeys = [m.decode() if isinstance(m, bytes) else m for m, _ in rows]
        texts = await self.client.hmget(_texts(pkey), qkeys)
        return [(q, t.decode(), float(score)) for q, t, (_, score) in zip(qkeys, texts, rows, strict=True) if t]

    async def get_version(self, source: str) -> str | None:
        raw = await self.client.get(f"ragtoll:{{v:{source}}}:version")
        return raw.decode() if isinstance(raw, bytes) else raw

    async def set_version(self, source: str, version: str) -> None:
        await self.client.set(f"ragtoll:{{v:{source}}}:version", version, ex=VERSION_TTL_S)

    async def get_threshold(self, scope: str) -> float | None:
        raw = await self.client.hget(_audit(scope), "threshold")
        return float(raw) if raw is not None else None

    async def raise_threshold(self, scope: str, threshold: float) -> float:
        return float(await self.client.eval(_RAISE, 1, _audit(scope), repr(float(threshold)), THRESHOLD_TTL_S))

    async def aclose(self) -> None:
        if self._owns:
            await self.client.aclose()
