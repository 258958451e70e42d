"""The ACL decision of every serve, and the optional external check (pure core + an injected poster).

A cached entry may be served only if the *current* principal may see every cached chunk: a chunk
is visible when its ACL holds the public marker or one of the principal's groups (the subject is
never matched: a subject named like a group is not in it). When the upstream filters results by
caller, the entry also remembers the view it was fetched under and serves only a principal whose
view is inside it: a broader principal's live results may hold chunks the fetcher never saw. An
entry holding any chunk with unknown ACL (`acl is None`) belongs to the exact principal that
fetched it. The external check, when configured, must also allow every chunk id; when it fails or
times out the answer is "no" (a miss), never "yes".
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import orjson

from ..model import Principal

MAX_AUTHZ_CACHE = 100_000


def owner_of(acls: Sequence[tuple[str, ...] | None], principal: Principal) -> str | None:
    """The owner key an entry gets when stored: the fetcher's, if any chunk's ACL is unknown."""
    return principal.key if any(a is None for a in acls) else None


# Which rule let a principal be served an entry (the span's `ragtoll.cache.view`).
VIEW_SHARED = "shared"  # the upstream answers every caller alike: the chunks' ACLs decide
VIEW_INSIDE = "inside"  # the upstream filters by caller: the principal's view is inside the fetcher's
VIEW_OWNER = "owner"  # a chunk's ACL is unknown: only the exact fetcher


def scope_of(principal: Principal, filters_by_caller: bool) -> tuple[str, ...] | None:
    """The view an entry remembers: the fetcher's, when the upstream filters by caller."""
    return tuple(sorted(principal.view)) if filters_by_caller else None


def chunk_visible(acl: tuple[str, ...] | None, principal: Principal, public: str) -> bool:
    if acl is None:
        return False  # unknown: only the owner rule can admit it
    return public in acl or not principal.groups.isdisjoint(acl)


def view_rule(scope: tuple[str, ...] | None, owner: str | None) -> str:
    """The rule a served entry passed (see VIEW_*)."""
    if owner is not None:
        return VIEW_OWNER
    return VIEW_SHARED if scope is None else VIEW_INSIDE


def decide(acls: Sequence[tuple[str, ...] | None], owner: str | None, principal: Principal, public: str,
           scope: tuple[str, ...] | None = None) -> str | None:
    """None if `principal` may be served every chunk; else why not (`view:outside`, `acl:private`,
    `acl:denied`). `scope`: the view the entry was fetched under, when the upstream filters by caller;
    same tenant is the partition's to guarantee."""
    if scope is not None and not principal.view.issubset(scope):
        return "view:outside"  # its live results may hold chunks the fetcher could not see
    if owner is not None and owner != principal.key:
        return "acl:private"
    for acl in acls:
        if acl is None:
            if owner is None:
                return "acl:private"  # unknown ACL without an owner: never shared
            continue
        if not chunk_visible(acl, principal, public):
            return "acl:denied"
    return None


# (url, body, timeout_s) -> (status, response body)
Poster = Callable[[str, bytes, float], Awaitable[tuple[int, bytes]]]


class ExternalAuthz:
    """Asks `url` which chunk ids a principal may see; answers are cached for `ttl_s` seconds.

    Request: `{"subject", "groups", "tenant", "chunk_ids"}`. Response: `{"allowed": [ids]}`.
    """

    def __init__(self, url: str, post: Poster, ttl_s: float = 30.0, timeout_s: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._post = post
        self._ttl = ttl_s
        self._timeout = timeout_s
        self._clock = clock
        self._cache: OrderedDict[tuple[str, str], tuple[bool, float]] = OrderedDict()

    async def allows(self, principal: Principal, chunk_ids: Sequence[str]) -> str | None:
        """None when every id is allowed; else `authz:denied` or `authz:unavailable`."""
        now = self._clock()
        unknown: list[str] = []
        for cid in dict.fromkeys(chunk_ids):
            found = self._cache.get((principal.key, cid))
            if found is None or found[1] <= now:
                unknown.append(cid)
            elif not found[0]:
                return "authz:denied"
        if not unknown:
            return None
        body = orjson.dumps({"subject": principal.subject, "groups": sorted(principal.groups),
                             "tenant": principal.tenant, "chunk_ids": unknown})
        try:
            status, raw = await self._post(self.url, body, self._timeout)
            if status != 200:
                return "authz:unavailable"
            allowed = orjson.loads(raw).get("allowed")
            if not isinstance(allowed, list):
                return "authz:unavailable"
        except Exception:  # noqa: BLE001 - any failure of the check is a refusal, never a serve
            return "authz:unavailable"
        allowed_set = {str(a) for a in allowed}
        expires = self._clock() + self._ttl
        for cid in unknown:
            self._cache[(principal.key, cid)] = (cid in allowed_set, expires)
            self._cache.move_to_end((principal.key, cid))
        while len(self._cache) > MAX_AUTHZ_CACHE:
            self._cache.popitem(last=False)
        return None if all(cid in allowed_set for cid in unknown) else "authz:denied"
