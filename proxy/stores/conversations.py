"""The conversation store: what ties an untracked call to its conversation, shared by replicas.

Two kinds of entry, each with a TTL (the task idle timeout and a margin), both bounded:
  * links: a conversation's opening (fingerprint and anchor), a Responses API response id or a
    named conversation -> the task id it belongs to;
  * pending: per client scope, its conversations' latest answers (the tool calls they asked for),
    newest first, at most MAX_PENDING per scope: what a search or rerank is matched against; and
    the tool calls a search already answered (at most MAX_CONSUMED per scope).
Memory: LRU dictionaries (MAX_LINKS links, MAX_SCOPES scopes). Redis: one key per link (SET EX),
one list per scope (LPUSH, LTRIM, EXPIRE in one pipeline). The store is never on the critical
path of a refusal: the resolver bounds each call by `store_timeout_ms` and falls back to the
client's session when the store fails.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

import orjson
import xxhash

from ..core.conversation import Pending

MAX_LINKS = 200_000  # memory store: least recently written links go first beyond this
# memory store: client scopes whose pending tool calls are kept. Worst case held: MAX_SCOPES x
# MAX_PENDING answers x MAX_TEXTS x MAX_TEXT characters (core/conversation.py): about 100 MB
MAX_SCOPES = 1_000
MAX_PENDING = 64  # conversations per client scope a search is matched against (newest first)
MAX_CONSUMED = MAX_PENDING * 16  # answered tool calls remembered per client scope (Redis)
PREFIX = "ragtoll:conv:"


class ConversationStore(Protocol):
    async def link(self, key: str, task_id: str) -> None:
        """Remember that `key` (a conversation's opening, a response id) belongs to `task_id`."""

    async def find(self, key: str) -> str | None:
        """The task `key` belongs to, if remembered."""

    async def take(self, key: str) -> str | None:
        """As `find`, and forget it (atomic: one taker)."""

    async def pending(self, scope: str, entry: Pending) -> None:
        """The latest answer of a conversation of this client scope (replaces its earlier one)."""

    async def recent(self, scope: str) -> tuple[list[Pending], set[str]]:
        """The scope's conversations, newest first (at most MAX_PENDING), and the tool calls of
        theirs a search has answered (`consume`)."""

    async def consume(self, scope: str, token: str) -> bool:
        """A search answers this tool call (core/conversation.Match.token): True when it is the
        first to (atomic: two identical searches at once never both claim one tool call)."""


class MemoryConversationStore:
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._links: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._scopes: OrderedDict[str, deque[tuple[Pending, float]]] = OrderedDict()
        self._consumed: OrderedDict[str, set[str]] = OrderedDict()  # scope -> answered tool calls

    async def link(self, key: str, task_id: str) -> None:
        self._links[key] = (task_id, self._clock())
        self._links.move_to_end(key)
        while len(self._links) > MAX_LINKS:
            self._links.popitem(last=False)

    async def find(self, key: str) -> str | None:
        found = self._links.get(key)
        if found is None or self._clock() - found[1] > self.ttl_s:
            return None
        return found[0]

    async def take(self, key: str) -> str | None:
        found = await self.find(key)
        self._links.pop(key, None)
        return found

    async def pending(self, scope: str, entry: Pending) -> None:
        entries = self._scopes.get(scope)
        if entries is None:
            entries = self._scopes[scope] = deque(maxlen=MAX_PENDING)
        for old in [e for e in entries if e[0].task_id == entry.task_id]:
            entries.remove(old)
        entries.appendleft((entry, self._clock()))
        self._scopes.move_to_end(scope)
        while len(self._scopes) > MAX_SCOPES:
            gone, _ = self._scopes.popitem(last=False)
            self._consumed.pop(gone, None)
        consumed = self._consumed.get(scope)
        if consumed is not None:  # only what the kept answers can still hold
            keys = {e.key for e, _ in entries}
            consumed.intersection_update(t for t in consumed if t.rpartition(":")[0] in keys)

    async def recent(self, scope: str) -> tuple[list[Pending], set[str]]:
        now = self._clock()
        return (
            [p for p, at in self._scopes.get(scope, ()) if now - at <= self.ttl_s],
            set(self._consumed.get(scope, ())),
        )

    async def consume(self, scope: str, token: str) -> bool:
        if scope not in self._scopes:
            return True
        consumed = self._consumed.setdefault(scope, set())
        if token in consumed:
            return False
        consumed.add(token)
        return True


class RedisConversationStore:
    """`client`: the app's Redis client (the budget store's). Keys carry no hash tag: each command
    touches one key, so it runs on Cluster."""

    def __init__(self, client: Any, ttl_s: float) -> None:
        self.client = client
        self.ttl_s = max(1, int(ttl_s))

    @staticmethod
    def _link_key(key: str) -> str:
        # a link holds ids the client chose (a tool call's, a response's): hashed, never a raw key
        return PREFIX + "l:" + xxhash.xxh3_128_hexdigest(key.encode("utf-8", "replace"))

    async def link(self, key: str, task_id: str) -> None:
        await self.client.set(self._link_key(key), task_id, ex=self.ttl_s)

    async def find(self, key: str) -> str | None:
        found = await self.client.get(self._link_key(key))
        return found.decode() if isinstance(found, bytes) else found

    async def take(self, key: str) -> str | None:
        found = await self.client.getdel(self._link_key(key))  # Redis 6.2+
        return found.decode() if isinstance(found, bytes) else found

    async def pending(self, scope: str, entry: Pending) -> None:
        key = PREFIX + "p:" + scope
        pipe = self.client.pipeline(transaction=False)
        pipe.lpush(key, orjson.dumps([entry.task_id, list(entry.texts), entry.key]))
        pipe.ltrim(key, 0, MAX_PENDING * 2 - 1)  # an entry per answer: twice the conversations kept
        pipe.expire(key, self.ttl_s)
        await pipe.execute()

    async def recent(self, scope: str) -> tuple[list[Pending], set[str]]:
        # two keys, two commands (a Cluster may hold them apart): the list, then the answered set
        raw = await self.client.lrange(PREFIX + "p:" + scope, 0, MAX_PENDING * 2 - 1)
        seen: set[str] = set()
        out: list[Pending] = []
        for item in raw:
            try:
                task_id, texts, key = orjson.loads(item)
            except (orjson.JSONDecodeError, ValueError, TypeError):
                continue
            if not isinstance(task_id, str) or task_id in seen or not isinstance(texts, list):
                continue
            seen.add(task_id)
            out.append(Pending(task_id, tuple(str(t) for t in texts), str(key)))
        consumed = await self.client.hkeys(PREFIX + "c:" + scope) if out else []
        return out[:MAX_PENDING], {c.decode() if isinstance(c, bytes) else c for c in consumed}

    async def consume(self, scope: str, token: str) -> bool:
        key = PREFIX + "c:" + scope
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(key, token, 1)
        pipe.hlen(key)
        pipe.expire(key, self.ttl_s)
        first, size, _ = await pipe.execute()
        if size > MAX_CONSUMED:  # bounded: start over (a repeated search may then match its newest again)
            await self.client.delete(key)
        return bool(first)


def open_conversation_store(store_url: str, budget: Any, ttl_s: float) -> ConversationStore:
    """The conversation store beside the budget store `budget` (same store, same client)."""
    if store_url == "memory":
        return MemoryConversationStore(ttl_s)
    return RedisConversationStore(budget.client, ttl_s)
