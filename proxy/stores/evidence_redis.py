"""Redis evidence store (plain Redis or Cluster, no modules): similarity is computed here, in numpy.

Every key of a partition shares its hash tag `ragtoll:{c:<partition>}:` - the entry blobs
(`e:<query key>`), the vectors hash (`v`) and the insertion-order set (`z`) - so each step is a
single-slot pipeline that runs unchanged on Cluster. A source's version state and the values each
channel has seen share `ragtoll:{v:<source>}:`, so moving it forward is one single-slot script.
Every key has a TTL. A partition keeps at most `max_partition_entries` vectors; the oldest are trimmed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .evidence import VERSION_TTL_S, VERSIONS_MAX, Entry
from .redis import connect

THRESHOLD_TTL_S = VERSION_TTL_S  # a threshold the self-audit raised; renewed by every further raise
# raise, never lower: concurrent raises from two replicas keep the higher threshold
_RAISE = """
local cur = tonumber(redis.call('HGET', KEYS[1], 'threshold'))
local new = tonumber(ARGV[1])
if cur == nil or new > cur then redis.call('HSET', KEYS[1], 'threshold', ARGV[1]) else new = cur end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return tostring(new)
"""


# A source's version channel moves forward only: the value current already is confirmed; one never
# seen becomes current (when first seen recorded); one seen before and superseded changes nothing.
# Values are forgotten only once older than the state's own TTL, never to make room: at the cap a
# new value is refused (the source stops moving, never moves back).
# KEYS: the source's hash, the channel's seen set. ARGV: channel, value, now, ttl, cap.
_ADVANCE = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local current = 1
if cur == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1] .. '_at', ARGV[3])
elseif redis.call('ZSCORE', KEYS[2], ARGV[2]) then
  current = 0
else
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[3]) - tonumber(ARGV[4])))
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then
    current = 0
  else
    if cur then redis.call('ZADD', KEYS[2], 'NX', ARGV[3], cur) end
    redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
    redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[1] .. '_at', ARGV[3])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {current, redis.call('HGETALL', KEYS[1])}
"""
# at most one probe per interval per source, across replicas. ARGV: now, interval, ttl
_CLAIM = """
local last = tonumber(redis.call('HGET', KEYS[1], 'probed_at'))
local claimed = 0
if last == nil or tonumber(ARGV[1]) - last >= tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], 'probed_at', ARGV[1])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  claimed = 1
end
return {claimed, redis.call('HGETALL', KEYS[1])}
"""
# undo a claim still ours (a refused probe): ARGV: the claim's time, as claimed
_RELEASE = """
if redis.call('HGET', KEYS[1], 'probed_at') == ARGV[1] then redis.call('HDEL', KEYS[1], 'probed_at') end
return 0
"""


def _source(source: str) -> tuple[str, str]:
    """A source's version hash and the prefix of its channels' seen sets: one hash tag, one slot."""
    return f"ragtoll:{{v:{source}}}:state", f"ragtoll:{{v:{source}}}:seen:"


def _fields(flat: list[Any]) -> dict[str, str]:
    items = [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
    return dict(zip(items[::2], items[1::2], strict=True))


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

    async def put(self, pkey: str, qkey: str, entry: Entry, vector: np.ndarray | None, ttl_s: int,
                  aliases: Sequence[str] = ()) -> None:
        e, v, z = _keys(pkey)
        pipe = self.client.pipeline(transaction=False)
        blob = entry.dumps()
        pipe.set(e + qkey, blob, ex=ttl_s)
        for alias in aliases:
            pipe.set(e + alias, blob, ex=ttl_s)
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

    async def get_source(self, source: str) -> dict[str, str] | None:
        raw = await self.client.hgetall(_source(source)[0])
        return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in raw.items()} if raw else None

    async def advance_source(self, source: str, channel: str, value: str, now: float) -> tuple[dict[str, str], bool]:
        state, seen = _source(source)
        current, flat = await self.client.eval(_ADVANCE, 2, state, seen + channel, channel, value, repr(now),
                                               VERSION_TTL_S, VERSIONS_MAX)
        return _fields(flat), bool(current)

    async def claim_probe(self, source: str, now: float, interval: float) -> tuple[bool, dict[str, str]]:
        claimed, flat = await self.client.eval(_CLAIM, 1, _source(source)[0], repr(now), repr(float(interval)),
                                               VERSION_TTL_S)
        return bool(claimed), _fields(flat)

    async def release_probe(self, source: str, claimed_at: float) -> None:
        await self.client.eval(_RELEASE, 1, _source(source)[0], repr(claimed_at))

    async def get_threshold(self, scope: str) -> float | None:
        raw = await self.client.hget(_audit(scope), "threshold")
        return float(raw) if raw is not None else None

    async def raise_threshold(self, scope: str, threshold: float) -> float:
        return float(await self.client.eval(_RAISE, 1, _audit(scope), repr(float(threshold)), THRESHOLD_TTL_S))

    async def aclose(self) -> None:
        if self._owns:
            await self.client.aclose()
