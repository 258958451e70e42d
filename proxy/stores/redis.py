"""The Redis budget store: one server-side script per reserve, extend, cancel and settle (one round
trip each).

All keys of a task share the hash tag `ragtoll:{t:<blake2b of the task id>}:` so each script
touches one slot and runs unchanged on Redis Cluster; hashing keeps odd bytes in task ids away
from other keys. Every key gets a TTL on every write. The only module that imports `redis`.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError, SlotNotCoveredError

from ..config import DIMENSIONS
from ..core.budget import Actual, Charge, Ledger, Reservation
from ..core.hold import Grant
from ..errors import StoreUnavailable
from ..redact import redact
from .base import SEEN_CHUNKS_CAP, Decision, TaskMeta, new_reservation_id, reservation_expiry, wants_seen

MAX_LOCAL_TASKS = 200_000
MAX_IN_FLIGHT = 64  # store commands in flight per process; more wait (within the caller's timeout)
WARM_CONNECTIONS = 16  # pooled connections opened before the replica says it is ready
# every server-side script (stores/scripts/*.lua): loaded before ready (`warm`)
SCRIPTS = ("reserve", "extend", "cancel", "settle", "end", "escalate", "principal_admit", "principal_charge")
# the task hash's text fields -> Ledger attributes (the Lua scripts write "class" for Ledger.cls)
_TEXT_FIELDS = {"task_id": "task_id", "profile": "profile", "class": "cls", "route": "route",
                "source": "source", "trace_id": "trace_id"}
_INT_FIELDS = frozenset({"started_ms", "last_ms", "chunks_seen"})


def _script(name: str) -> tuple[str, str]:
    text = importlib.resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text("utf-8")
    return text, hashlib.sha1(text.encode()).hexdigest()


def task_keys(task_id: str) -> tuple[str, str, str]:
    """(hash, unique-query set, chunk set) keys of a task, all under one hash tag."""
    tag = hashlib.blake2b(task_id.encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
    base = f"ragtoll:{{t:{tag}}}:"
    return base + "h", base + "q", base + "c"


def holds_key(task_id: str) -> str:
    """The task's reservations in flight (a hash: id -> record), under the task's hash tag; it
    exists only while a reservation (or a cancel's tombstone) does."""
    return task_keys(task_id)[0][:-1] + "r"


CLUSTER_SCHEME = "redis+cluster://"
# Tasks a stopping replica leaves to the others (task id -> last call, ms): one key per deployment
# (named after its records stream, which its replicas share), outside every task's hash tag, read
# and written by plain commands, never inside a script (so Cluster-safe).
HANDOVER_PREFIX = "ragtoll:handover:"
# Connections beyond the budget store's in-flight bound: the evidence cache shares the client.
SHARED_CONNECTIONS = 64


def seed_url(url: str) -> tuple[str, bool]:
    """The one `store:` URL rule: (the URL redis-py reads, whether it names a Cluster). A Cluster is
    named `redis+cluster://host:port`, a seed node."""
    if url.startswith(CLUSTER_SCHEME):
        return "redis://" + url[len(CLUSTER_SCHEME):], True
    return url, False


def connect(url: str, *, timeout_s: float = 0.25, connection_class: Any = None) -> Any:
    """The one Redis client for a `store:` URL: redis://, rediss://, unix://, or
    redis+cluster://host:port (a seed node of a Cluster). Does no I/O until first used."""
    common: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s,
                              # larger than the budget store's in-flight bound plus the cache's use,
                              # so a command never fails for want of a connection
                              "max_connections": MAX_IN_FLIGHT + SHARED_CONNECTIONS}
    if connection_class is not None:  # tests and the benchmark count round trips with it
        common["connection_class"] = connection_class
    plain, cluster = seed_url(url)
    if cluster:
        return RedisCluster.from_url(plain, **common)
    # one retry on a fresh connection covers a pooled socket the server closed; no backoff
    return aioredis.Redis.from_url(url, retry=Retry(NoBackoff(), 1), **common)


class RedisStore:
    """`url`: as `connect` reads it; `client`: one made by `connect` to share (the app's)."""

    def __init__(self, url: str, *, client: Any = None, timeout_s: float = 0.25, ttl_s: int = 86_400,
                 records_stream: str = "ragtoll:records", records_maxlen: int = 100_000,
                 connection_class: Any = None) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self.records_stream = records_stream
        self.records_maxlen = records_maxlen
        self._handover = HANDOVER_PREFIX + records_stream
        self._handed_over: set[str] = set()  # tasks read from the handover set, to remove once ended
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._cluster = seed_url(url)[1]
        self._ready = not self._cluster
        self._init_lock = asyncio.Lock()
        self.client: Any = client if client is not None else connect(url, timeout_s=timeout_s,
                                                                      connection_class=connection_class)
        self._reserve = _script("reserve")
        self._extend = _script("extend")
        self._cancel = _script("cancel")
        self._settle = _script("settle")
        self._end = _script("end")
        self._escalate = _script("escalate")
        # tasks this process has served, for the idle sweep (no global key: it would break Cluster slots)
        self._local: OrderedDict[str, int] = OrderedDict()

    async def _run(self, script: tuple[str, str], keys: tuple[str, ...], args: list[Any]) -> Any:
        text, sha = script
        if not self._ready:
            await self._initialize()
        async with self._slots:
            try:
                return await self.client.evalsha(sha, len(keys), *keys, *args)
            except NoScriptError:
                return await self.client.eval(text, len(keys), *keys, *args)  # first use on this node

    async def _initialize(self) -> None:
        # Learn the cluster's slot map once, before commands race to open connections to its nodes
        # (concurrent first commands can otherwise trip over a node list being rebuilt).
        async with self._init_lock:
            if not self._ready:
                await self.client.initialize()
                self._ready = True

    def _touch(self, task_id: str, now_ms: int) -> None:
        self._local[task_id] = now_ms
        self._local.move_to_end(task_id)
        while len(self._local) > MAX_LOCAL_TASKS:
            self._local.popitem(last=False)

    async def reserve(self, task_id: str, meta: TaskMeta, limits: Mapping[str, int], charge: Charge,
                      now_ms: int, shadow: bool = False, *, reservation_id: str = "",
                      expires_ms: int = 0) -> Decision:
        h, q, c = task_keys(task_id)
        rid = reservation_id or new_reservation_id()
        expires = expires_ms or reservation_expiry(now_ms)
        args: list[Any] = [
            task_id, meta.profile, meta.cls, meta.route, now_ms, self.ttl_s, 1 if shadow else 0,
            charge.query_key or "", charge.steps, charge.calls, charge.retrieval_calls, charge.rerank_calls,
            charge.context_tokens, charge.prompt_tokens, charge.completion_reserve, charge.cost_certain,
            charge.cost_reserve, 1 if charge.cache_hit else 0,
        ]
        args.extend(limits.get(d, -1) for d in DIMENSIONS)
        args.extend((meta.source, meta.trace_id, SEEN_CHUNKS_CAP if wants_seen(charge) else 0, rid, expires,
                     charge.choices))
        out = await self._run(self._reserve, (h, q, c, holds_key(task_id)), args)
        self._touch(task_id, now_ms)
        status = out[0].decode()
        if status == "cancelled":
            return Decision(False, None, Ledger(task_id), Reservation())
        if status == "duplicate":  # the caller cancels it: the first run's reply was lost
            raise StoreUnavailable(f"reservation {rid} arrived twice; its outcome is unknown", store="redis")
        if status == "conflict":
            return Decision(False, None, Ledger(task_id), Reservation(), profile_conflict=out[1].decode())
        dim = out[1].decode() or None
        if status == "reject":
            return Decision(False, dim, _ledger(task_id, out[3:]), Reservation())
        new_query = int(out[2]) == 1
        tokens, out_cost = int(out[3]), int(out[4])  # the output granted (budget.granted_output)
        n = int(out[5])
        seen = frozenset(m.decode() for m in out[6:6 + n]) if n >= 0 else None
        return Decision(True, dim, _ledger(task_id, out[6 + max(n, 0):]),
                        Reservation(charge.context_tokens, tokens, charge.cost_certain + out_cost, new_query,
                                    rid, expires),
                        seen_chunks=seen)

    async def extend(self, task_id: str, reservation_id: str, tokens: int, cost_nusd: int,
                     limits: Mapping[str, int], now_ms: int, expires_ms: int = 0) -> Grant:
        args = [reservation_id, tokens, cost_nusd, limits.get("max_completion_tokens", -1),
                limits.get("max_cost_usd", -1), now_ms, expires_ms or reservation_expiry(now_ms), self.ttl_s]
        out = await self._run(self._extend, (task_keys(task_id)[0], holds_key(task_id)), args)
        return Grant(int(out[0]), int(out[1]))

    async def cancel(self, task_id: str, reservation_id: str, now_ms: int) -> bool:
        h, q, _ = task_keys(task_id)
        return bool(await self._run(self._cancel, (h, q, holds_key(task_id)), [reservation_id, self.ttl_s]))

    async def settle(self, task_id: str, reservation: Reservation, actual: Actual, now_ms: int) -> Ledger | None:
        h, q, c = task_keys(task_id)
        args: list[Any] = [
            now_ms, self.ttl_s, actual.context_tokens - reservation.context_tokens,
            actual.completion_tokens - reservation.completion_tokens, actual.cost_nusd - reservation.cost_nusd,
            _chunks_arg(actual), reservation.id, actual.context_tokens, actual.completion_tokens,
            actual.cost_nusd, 1 if actual.finished else 0, actual.cached_input_tokens, actual.cache_write_tokens,
            " ".join(f"{name} {n}" for name, n in actual.tallies), *(actual.chunk_ids or ()),
        ]
        out = await self._run(self._settle, (h, c, q, holds_key(task_id)), args)
        if not out:
            self._local.pop(task_id, None)
            return None
        self._touch(task_id, now_ms)
        return _ledger(task_id, out)

    async def escalate(self, task_id: str, from_profile: str, to_profile: str, dimension: str) -> bool:
        return bool(await self._run(self._escalate, (task_keys(task_id)[0],), [from_profile, to_profile, dimension]))

    async def get_task(self, task_id: str) -> Ledger | None:
        if not self._ready:
            await self._initialize()
        async with self._slots:
            out = await self.client.hgetall(task_keys(task_id)[0])
        if not out:
            return None
        flat: list[bytes] = []
        for k, v in out.items():
            flat.extend((k, v))
        return _ledger(task_id, flat)

    async def end_task(self, task_id: str, idle_before_ms: int | None = None) -> Ledger | None:
        out = await self._run(self._end, (*task_keys(task_id), holds_key(task_id)),
                              [-1 if idle_before_ms is None else idle_before_ms])
        status = out[0].decode()
        if status == "active":
            self._local[task_id] = int(out[1])  # another replica served it since: check again later
            return None
        self._local.pop(task_id, None)
        if task_id in self._handed_over:  # ended (or gone): no one sweeps it again
            self._handed_over.discard(task_id)
            await self.client.zrem(self._handover, task_id)
        return _ledger(task_id, out[1:]) if status == "ended" else None

    async def idle_tasks(self, idle_before_ms: int) -> list[str]:
        mine = [t for t, last in self._local.items() if last < idle_before_ms]
        # tasks a stopped replica left behind (hand_over), idle as of the last call it saw; the
        # key's node may be down (Cluster): the tasks of the healthy nodes still end
        try:
            left = [t.decode() for t in await self.client.zrangebyscore(
                self._handover, "-inf", f"({idle_before_ms}", start=0, num=MAX_LOCAL_TASKS)]
        except Exception:  # noqa: BLE001 - read again on the next sweep
            left = []
        self._handed_over |= set(left)
        return mine + [t for t in left if t not in self._local]

    async def hand_over(self) -> int:
        if not self._local:
            return 0
        await self.client.zadd(self._handover, dict(self._local))
        await self.client.expire(self._handover, self.ttl_s)
        n = len(self._local)
        self._local.clear()
        return n

    def local_tasks(self) -> list[str]:
        return list(self._local)

    def failure_domain(self, task_id: str) -> str:
        """One server: one domain ("redis"). Cluster: the node ("host:port") that owns the slot of
        the task's hash tag, where its scripts run; "slot:<n>" until the slot map is known."""
        if not self._cluster:
            return "redis"
        key = task_keys(task_id)[0]
        try:
            return str(self.client.get_node_from_key(key).name)
        except SlotNotCoveredError:
            return f"slot:{self.client.keyslot(key)}"

    async def ping(self) -> None:
        if not self._ready:
            await self._initialize()
        await self.client.ping()

    async def warm(self, connections: int = WARM_CONNECTIONS) -> None:
        """Ready for a burst: the slot map learnt (Cluster), every script in the server's script
        cache (on every primary), and `connections` pooled connections open, so the first calls
        after start neither connect nor compile and stay within `store_timeout_ms`."""
        if not self._ready:
            await self._initialize()
        for name in SCRIPTS:
            await self.client.script_load(_script(name)[0])
        await asyncio.gather(*(self.client.ping() for _ in range(connections)))

    async def append_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append task records to the records stream (trimmed to about `records_maxlen`), in one
        round trip: the stream is one key, so even on Cluster the batch goes to one node."""
        pipe = self.client.pipeline(transaction=False)
        for record in records:
            pipe.xadd(self.records_stream, {"record": orjson.dumps(record)},
                      maxlen=self.records_maxlen, approximate=True)
        await pipe.execute()

    async def aclose(self) -> None:
        await self.client.aclose()


async def read_records(url: str, stream: str, *, batch: int = 1000,
                       timeout_s: float = 5.0) -> list[tuple[str, dict[bytes, bytes]]]:
    """Every entry of a task-record stream (what `append_records` writes), oldest first, as
    (entry id, fields), read `batch` entries per round trip. Raises StoreUnavailable."""
    client = connect(url, timeout_s=timeout_s)
    entries: list[tuple[str, dict[bytes, bytes]]] = []
    start = "-"
    try:
        while True:
            page: list[tuple[bytes, dict[bytes, bytes]]] = await client.xrange(stream, min=start, max="+", count=batch)
            entries.extend((entry_id.decode(), fields) for entry_id, fields in page)
            if len(page) < batch:
                return entries
            start = "(" + page[-1][0].decode()
    except RedisError as exc:
        raise StoreUnavailable(f"cannot read stream {stream!r}: {redact(str(exc))}") from exc
    finally:
        await client.aclose()


def _ledger(task_id: str, flat: list[bytes]) -> Ledger:
    ledger = Ledger(task_id)
    for i in range(0, len(flat) - 1, 2):
        key = flat[i].decode()
        raw = flat[i + 1]
        if key in _TEXT_FIELDS:
            setattr(ledger, _TEXT_FIELDS[key], raw.decode("utf-8", "replace"))
        elif key == "exhausted":
            ledger.exhausted = raw.decode("utf-8", "replace") or None
        elif key in _INT_FIELDS:
            setattr(ledger, key, int(raw))
        elif key.startswith("rej:"):
            ledger.rejections[key[4:]] = int(raw)
        elif key.startswith("srej:"):
            ledger.shadow_rejections[key[5:]] = int(raw)
        else:
            ledger.counters[key] = int(raw)
    return ledger


def now_ms() -> int:
    return int(time.time() * 1000)


def _chunks_arg(actual: Actual) -> str:
    """settle.lua's ARGV[6]: no chunks (0); chunks judged by novelty (1); by a verdict (f, x; e:
    fruitful evidence for the task's question)."""
    if actual.chunk_ids is None:
        return "0"
    if actual.fruitful is None:
        return "1"
    return ("e" if actual.evidence else "f") if actual.fruitful else "x"
