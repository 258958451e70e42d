"""Source versions and their freshness: the version every partition key carries, and when it was confirmed.

A source's version has two channels: the one the ingestion pipeline pushes (`POST
/admin/sources/{name}/version`; before any push, the static `cache.sources` value, else "0") and
the one observed on the source (a retrieval response's version header or field, or a version
probe). Values are opaque and ordered by first arrival, per channel: a value seen before never
becomes current again (the store remembers every value for as long as the source's state lives,
up to `VERSIONS_MAX`, refusing new ones past it rather than forgetting old ones), so a lagging replica's response cannot roll a source back and bring back
the entries a newer version retired. The two are composed into the partition version. A push, a
probe's answer or a response that carries the current value confirms it (`SourceState.confirmed`),
which is what lets an entry older than its source's staleness bound be served. Kept in the
evidence store (one hash per source) so every replica agrees; reads are memoised for `local_ttl_s`.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson

from ..adapters.fields import get_path

VALID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, no spaces
PUSHED, OBSERVED = "pushed", "observed"  # the two channels (fields of the source's hash)
CONFIRM_EVERY_S = 1.0  # a replica re-confirms an unchanged observed version at most this often

Probe = Callable[[], Awaitable[str | None]]  # asks the source for its version (None: no answer)


class ProbeRefused(Exception):
    """The source refused the probe's credentials (401/403): the caller's, not the source's, fault."""


def probed_version(field: str | None, header: str, status: int, body: bytes,
                   headers: Mapping[str, str]) -> str | None:
    """The version a probe's answer names: the JSON `field` (a dotted path) of its body, else its
    `header`; None for an error answer or one that names none. Raises ProbeRefused for 401/403."""
    if status in (401, 403):
        raise ProbeRefused(f"the source answered the version probe {status}")
    if status >= 400:
        return None
    if field:
        found = get_path(orjson.loads(body), field) if body else None
        return str(found) if isinstance(found, (str, int)) and not isinstance(found, bool) else None
    return headers.get(header.lower()) or None


class VersionSuperseded(ValueError):
    """A push of a value the source has already moved past (values only move forward)."""


class SourceStore(Protocol):
    """The evidence store's part in versions (both stores implement it; Redis: one Lua script per step)."""

    async def get_source(self, source: str) -> dict[str, str] | None: ...

    async def advance_source(self, source: str, channel: str, value: str, now: float) -> tuple[dict[str, str], bool]:
        """Atomically: confirm `value` if current, make it current if never seen, else leave it
        (superseded); the source's fields after, and whether `value` is current."""
        ...

    async def claim_probe(self, source: str, now: float, interval: float) -> tuple[bool, dict[str, str]]:
        """Whether this caller may probe `source` (recorded, so no one else may within `interval`
        seconds), and the source's fields (another replica's probe answer, when not)."""
        ...

    async def release_probe(self, source: str, claimed_at: float) -> None:
        """Undo the claim made at `claimed_at` if no one claimed since (a refused probe claims nothing)."""
        ...


@dataclass(frozen=True, slots=True)
class SourceState:
    pushed: str  # the pushed channel's value (or the static one, or "0")
    observed: str | None  # the observed channel's value (what a hit repeats in the version header)
    confirmed: float = -math.inf  # wall-clock seconds of the last confirmation; -inf: never

    @property
    def version(self) -> str:
        """The partition version: pushed[+observed]."""
        return compose(self.pushed, self.observed)

    def confirmed_within(self, bound: float, now: float) -> bool:
        return now - self.confirmed <= bound


def compose(pushed: str, observed: str | None) -> str:
    return f"{pushed}+{observed}" if observed else pushed


def state_of(fields: Mapping[str, str] | None, static: str | None) -> SourceState:
    f = fields or {}
    at = [float(f[k]) for k in (PUSHED + "_at", OBSERVED + "_at") if k in f]
    return SourceState(f.get(PUSHED) or static or "0", f.get(OBSERVED) or None, max(at, default=-math.inf))


class Versions:
    def __init__(self, store: SourceStore, static: Mapping[str, str], local_ttl_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, now: Callable[[], float] = time.time) -> None:
        self._store = store
        self._static = dict(static)
        self._ttl = local_ttl_s
        self._clock = clock  # memo expiry
        self._now = now  # confirmations: wall clock, shared by replicas
        self._local: dict[str, tuple[dict[str, str], float]] = {}
        self._probes: dict[str, asyncio.Task[SourceState]] = {}
        self._probed: dict[str, float] = {}  # this replica's last claim per source

    async def state(self, source: str, *, fresh: bool = False) -> SourceState:
        found = self._local.get(source)
        if found is None or fresh or found[1] <= self._clock():
            fields = await self._store.get_source(source) or {}
            self._remember(source, fields)
            return state_of(fields, self._static.get(source))
        return state_of(found[0], self._static.get(source))

    async def current(self, source: str) -> str:
        return (await self.state(source)).version

    async def set(self, source: str, version: str) -> SourceState:
        """The ingestion pipeline's push (admin API): a new value, or the current one again (a
        confirmation). Raises ValueError for a malformed value, VersionSuperseded for an old one."""
        if not VALID.match(version):
            raise ValueError("a version is 1-128 printable ASCII characters without spaces")
        fields, current = await self._store.advance_source(source, PUSHED, version, self._now())
        self._remember(source, fields)
        if not current:
            raise VersionSuperseded(f"source {source!r} has moved past version {version!r} (or has named "
                                    "VERSIONS_MAX values within their lifetime); versions only move "
                                    "forward: push a new value")
        return state_of(fields, self._static.get(source))

    async def observe(self, source: str, version: str) -> tuple[SourceState, bool]:
        """A version the source itself reported (a response, a probe). Returns the state after and
        whether `version` is current: False for a malformed value or one the source moved past."""
        if not VALID.match(version):
            return await self.state(source), False
        found = self._local.get(source)
        if found is not None and found[0].get(OBSERVED) == version and found[1] > self._clock() and \
                self._now() - float(found[0].get(OBSERVED + "_at", "-inf")) < CONFIRM_EVERY_S:
            return state_of(found[0], self._static.get(source)), True  # confirmed a moment ago
        fields, current = await self._store.advance_source(source, OBSERVED, version, self._now())
        self._remember(source, fields)
        return state_of(fields, self._static.get(source)), current

    async def confirm(self, source: str, bound: float, probe: Probe) -> SourceState:
        """The source's state, confirmed by `probe` if it was not within `bound` seconds. The probe runs
        at most once per `bound` per source (across replicas: a claim in the store), one at a time. A
        probe the source refused (401/403: the asking caller's credentials) claims nothing."""
        running = self._probes.get(source)
        if running is None:
            running = self._probes[source] = asyncio.get_running_loop().create_task(self._probe(source, bound, probe))
            running.add_done_callback(lambda _t: self._probes.pop(source, None))
        return await asyncio.shield(running)

    async def _probe(self, source: str, bound: float, probe: Probe) -> SourceState:
        now = self._now()
        if now - self._probed.get(source, -math.inf) < bound:
            return await self.state(source)  # this replica probed within the bound
        claimed, fields = await self._store.claim_probe(source, now, bound)
        self._remember(source, fields)
        if not claimed:  # another replica probed within the bound: its answer is in `fields`
            return state_of(fields, self._static.get(source))
        self._probed[source] = now
        try:
            version = await probe()
        except ProbeRefused:
            # this caller's credentials, not the source: the claim goes back, the next caller may probe
            self._probed.pop(source, None)
            await self._store.release_probe(source, now)
            return await self.state(source)
        except Exception:  # noqa: BLE001 - a failed probe confirms nothing; entries past the bound miss
            version = None
        if version is None:
            return await self.state(source, fresh=True)
        state, _ = await self.observe(source, version)
        return state

    def _remember(self, source: str, fields: dict[str, str]) -> None:
        self._local[source] = (fields, self._clock() + self._ttl)
        if len(self._local) > 10_000:
            self._local.pop(next(iter(self._local)))
