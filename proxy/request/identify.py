"""Task identity (DESIGN.md "Task identity"): baggage -> traceparent -> task header -> untracked policy.

Pure: headers and an injected clock in, a `TaskRef` out. Malformed, oversized or duplicated
`traceparent`/`baggage` are ignored and the reason recorded in `TaskRef.notes`; never an error
for the agent unless `tasks.untracked: reject` and nothing identifies the task.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from urllib.parse import unquote

import xxhash

from ..config import TasksConfig
from ..errors import TaskRequired
from ..model import (
    SOURCE_BAGGAGE,
    SOURCE_HEADER,
    SOURCE_PER_CALL,
    SOURCE_SESSION,
    SOURCE_TRACEPARENT,
    TASK_ID_PATTERN,
    TaskRef,
)

BAGGAGE_TASK_KEY = "ragtoll.task.id"
MAX_BAGGAGE_BYTES = 8192  # W3C baggage limits
MAX_BAGGAGE_MEMBERS = 180
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_BAGGAGE_KEY = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
MAX_SESSIONS = 100_000


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace_id, span_id, flags) of a valid W3C traceparent, else None."""
    if not value or len(value) > 512:
        return None
    m = _TRACEPARENT.match(value.strip().lower())
    if not m:
        return None
    version, trace_hex, span_hex, flags_hex, rest = m.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, int(flags_hex, 16)


def parse_baggage(value: str | None) -> tuple[tuple[tuple[str, str], ...], list[str]]:
    """W3C baggage members (key, decoded value) and notes about what was dropped.

    A key that appears twice is dropped entirely (ambiguous), never resolved by position.
    """
    notes: list[str] = []
    if not value:
        return (), notes
    if len(value.encode("utf-8", "replace")) > MAX_BAGGAGE_BYTES:
        return (), [f"baggage ignored: larger than {MAX_BAGGAGE_BYTES} bytes"]
    members: dict[str, str] = {}
    duplicated: set[str] = set()
    items = value.split(",")
    if len(items) > MAX_BAGGAGE_MEMBERS:
        return (), [f"baggage ignored: more than {MAX_BAGGAGE_MEMBERS} members"]
    for item in items:
        item = item.strip()
        if not item:
            continue
        pair = item.split(";", 1)[0]
        key, sep, raw = pair.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not _BAGGAGE_KEY.match(key):
            notes.append("baggage member ignored: malformed")
            continue
        if key in members or key in duplicated:
            duplicated.add(key)
            members.pop(key, None)
            continue
        members[key] = unquote(raw, errors="replace")
    for key in sorted(duplicated):
        if key.startswith("ragtoll."):
            notes.append(f"baggage {key} ignored: given more than once")
    return tuple(members.items()), notes


def derived_trace_id(task_id: str) -> int:
    """The trace id of a task named by baggage or header: stable across replicas, never zero."""
    return xxhash.xxh3_128_intdigest(b"ragtoll.task:" + task_id.encode()) or 1


def derived_span_id(task_id: str) -> int:
    """The span id of a task's virtual root (the `ragtoll.task` span takes it when the task ends)."""
    return xxhash.xxh3_64_intdigest(b"ragtoll.task.root:" + task_id.encode()) or 1


class Identifier:
    """Resolves the task of each call; holds the session table for `untracked: session`."""

    def __init__(self, config: TasksConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.header = config.header.lower()
        self._clock = clock
        self._sessions: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def identify(self, headers: Mapping[str, str], client: str, duplicated: frozenset[str] = frozenset()) -> TaskRef:
        """`duplicated` names headers that appeared more than once (they are ignored)."""
        notes: list[str] = []
        baggage: tuple[tuple[str, str], ...] = ()
        if "baggage" in duplicated:
            notes.append("baggage ignored: header given more than once")
        else:
            baggage, notes = parse_baggage(headers.get("baggage"))
        parent = None
        if "traceparent" in duplicated:
            notes.append("traceparent ignored: header given more than once")
        elif "traceparent" in headers:
            parent = parse_traceparent(headers["traceparent"])
            if parent is None:
                notes.append("traceparent ignored: malformed")

        task_id = dict(baggage).get(BAGGAGE_TASK_KEY)
        if task_id is not None:
            if TASK_ID_PATTERN.match(task_id):
                trace_id = parent[0] if parent else derived_trace_id(task_id)
                return TaskRef(task_id, SOURCE_BAGGAGE, trace_id, baggage, tuple(notes))
            notes.append(f"baggage {BAGGAGE_TASK_KEY} ignored: malformed")
        if parent is not None:
            return TaskRef(f"{parent[0]:032x}", SOURCE_TRACEPARENT, parent[0], baggage, tuple(notes))
        header_id = headers.get(self.header)
        if header_id is not None:
            if self.header in duplicated:
                notes.append(f"{self.header} ignored: header given more than once")
            elif TASK_ID_PATTERN.match(header_id):
                return TaskRef(header_id, SOURCE_HEADER, derived_trace_id(header_id), baggage, tuple(notes))
            else:
                notes.append(f"{self.header} ignored: malformed")
        policy = self.config.untracked
        if policy == "reject":
            raise TaskRequired(
                f"no task identity: send a W3C traceparent, baggage {BAGGAGE_TASK_KEY}, or header {self.header}",
                header=self.header,
            )
        if policy == "per-call":
            task_id = uuid.uuid4().hex
            return TaskRef(task_id, SOURCE_PER_CALL, int(task_id, 16) or 1, baggage, tuple(notes))
        task_id = self._session(client, headers)
        return TaskRef(task_id, SOURCE_SESSION, derived_trace_id(task_id), baggage, tuple(notes))

    def _session(self, client: str, headers: Mapping[str, str]) -> str:
        # A labelled heuristic: one client (address, user agent, credential) with gaps under the
        # idle timeout is one task. Credentials are hashed, never stored.
        key = xxhash.xxh3_64_hexdigest(
            "\x00".join((client, headers.get("user-agent", ""), headers.get("authorization", ""))).encode()
        )
        now = self._clock()
        found = self._sessions.get(key)
        if found is not None and now - found[1] < self.config.idle_timeout_s:
            task_id = found[0]
            self._sessions.move_to_end(key)
        else:
            task_id = f"session-{key}-{uuid.uuid4().hex[:8]}"
        self._sessions[key] = (task_id, now)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return task_id
