"""Configuration: frozen dataclasses per section, loaded from YAML and `RAGTOLL_*` variables.

`load(env, path)` and `parse(raw)` are the entry points. Each section checks its own keys in
`validate(where)`; `Settings.validate()` adds only the rules that span sections. Errors are
`ConfigError`s naming the key, the bad value and what would be valid. Sections hold no mutable
containers (tuples and `FrozenMap`s), so a loaded `Settings` is immutable and hashable. Nothing
else in ragtoll reads the environment for configuration. Imports no I/O library besides yaml.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args, get_origin

import orjson
import yaml
from ragtoll.instrumentation.semconv import DIMENSIONS

from .errors import ConfigError
from .redact import redact

KINDS = ("llm", "embeddings", "retrieval", "rerank", "other")
DEFAULT_PORT = 8787
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_INSPECT_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_INSPECT_TOTAL_BYTES = 128 * 1024 * 1024
# The JSONL task-record sink rotates its file past this size and keeps this many rotated files.
DEFAULT_RECORDS_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_RECORDS_KEEP = 3
MIN_RECORDS_MAX_BYTES = 64 * 1024
MAX_RECORDS_KEEP = 100
# matched with fullmatch: `$` would let a trailing newline through
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_PREFIX = re.compile(r"(/[A-Za-z0-9._~-]+)+")
_HEADER = re.compile(r"[A-Za-z0-9-]+")
_RESERVED = ("/healthz", "/readyz", "/metrics")

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """A read-only mapping: `==` (also to a dict), `.get`, iteration and `hash` as a dict would
    give, and no way to change it. Config's mappings are these, so frozen sections stay frozen."""

    __slots__ = ("_data",)
    _data: dict[K, V]

    def __init__(self, data: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        object.__setattr__(self, "_data", dict(data))

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __reduce__(self) -> tuple[type[FrozenMap[K, V]], tuple[dict[K, V]]]:
        return type(self), (self._data,)

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"


EMPTY: FrozenMap[Any, Any] = FrozenMap()


def _freeze(obj: Any, *names: str) -> None:
    """Sections built in code (tests, the demo) may be handed a list or a dict: keep a tuple or a
    FrozenMap instead, so no section holds a container anyone can change."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, list):
            object.__setattr__(obj, name, tuple(value))
        elif isinstance(value, dict):
            object.__setattr__(obj, name, FrozenMap(value))


def _bad(key: str, value: Any, valid: str) -> typing.NoReturn:
    shown = redact(value) if isinstance(value, str) else value  # a store or upstream URL may hold a password
    raise ConfigError(f"Config '{key}' has value {shown!r}. Expected {valid}.", key=key)


def _finite(value: float) -> bool:
    return isinstance(value, int) or math.isfinite(value)  # ints are finite, however large


def _positive_s(key: str, value: float, default: str = "") -> None:
    if not _finite(value) or value <= 0:
        _bad(key, value, f"a positive number of seconds{default}")


# --- sections: each checks its own keys in validate(where) -------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    """The front door. Times in seconds, sizes in bytes."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a request body past this gets 413
    access_log: bool = False
    header_timeout_s: float = 10.0  # the whole request head, from the first byte (or an idle keep-alive)
    body_timeout_s: float = 30.0  # the whole request body, from the head; slower gets 408
    max_connections: int = 1024  # client connections served at once; more wait in the listen backlog
    # The connections one client address may hold outside a request (silent, mid-head, idle
    # keep-alive); past it the surplus is closed within 0.25 s (proxy/gate.py). None: a quarter of
    # max_connections. A request in flight is never cut.
    max_connections_per_address: int | None = None
    # The most of one response ragtoll decodes to read it (a buffered retrieval body, the SSE it
    # observes): past it, the rest passes through unread and the span says so.
    max_inspect_bytes: int = DEFAULT_MAX_INSPECT_BYTES
    max_event_bytes: int = 1024 * 1024  # one SSE event; a longer one ends the stream's observation
    # Bytes the whole process holds for inspection at once (request bodies read whole, answers and
    # their decoded copies): past it a request body gets 503 `overloaded`, an answer passes through
    # unread (the span says why; budgets charge its whole reservation). proxy/request/buffers.py.
    max_inspect_total_bytes: int = DEFAULT_MAX_INSPECT_TOTAL_BYTES
    # A retrieval or rerank query longer than this (characters) is keyed by a hash of its raw text
    # and never normalised, tokenised, embedded, compared or cached (proxy/request/pipeline.py).
    max_query_chars: int = 4096
    # On SIGTERM: calls in flight get this long to finish before ragtoll ends its tasks and exits
    # (keep it under the pod's terminationGracePeriodSeconds).
    shutdown_grace_s: float = 20.0
    # GET /metrics on a port of its own as well (none by default): where a scraper can reach it
    # while the proxy port stays on loopback (a sidecar). The same exposition as /metrics.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    def validate(self, where: str) -> None:
        if not 1 <= self.port <= 65535:
            _bad(f"{where}.port", self.port, "a TCP port between 1 and 65535")
        if self.metrics_port is not None and not (1 <= self.metrics_port <= 65535 and self.metrics_port != self.port):
            _bad(f"{where}.metrics_port", self.metrics_port,
                 f"a TCP port between 1 and 65535 other than {where}.port ({self.port}), or unset for none")
        if not self.metrics_host:
            _bad(f"{where}.metrics_host", self.metrics_host, "an address to listen on, e.g. 0.0.0.0 (default 127.0.0.1)")
        if self.max_body_bytes < 1024:
            _bad(f"{where}.max_body_bytes", self.max_body_bytes, "at least 1024")
        # granian (hyper) takes the head timeout in whole milliseconds, 1 ms to 60 s
        if not _finite(self.header_timeout_s) or not 0.001 <= self.header_timeout_s <= 60:
            _bad(f"{where}.header_timeout_s", self.header_timeout_s, "seconds between 0.001 and 60 (default 10)")
        _positive_s(f"{where}.body_timeout_s", self.body_timeout_s, " (default 30)")
        if self.max_connections < 1:
            _bad(f"{where}.max_connections", self.max_connections, "at least 1 (default 1024)")
        per_address = self.max_connections_per_address
        if per_address is not None and not 1 <= per_address <= self.max_connections:
            _bad(f"{where}.max_connections_per_address", per_address,
                 f"between 1 and {where}.max_connections ({self.max_connections}); default a quarter of it")
        if not _finite(self.shutdown_grace_s) or not 0 <= self.shutdown_grace_s <= 3600:
            _bad(f"{where}.shutdown_grace_s", self.shutdown_grace_s, "seconds between 0 and 3600 (default 20)")
        if self.max_inspect_bytes < 64 * 1024:
            _bad(f"{where}.max_inspect_bytes", self.max_inspect_bytes, "at least 65536 (default 8388608)")
        if self.max_inspect_total_bytes < max(self.max_inspect_bytes, self.max_body_bytes):
            _bad(f"{where}.max_inspect_total_bytes", self.max_inspect_total_bytes,
                 f"at least {where}.max_inspect_bytes and {where}.max_body_bytes "
                 f"({max(self.max_inspect_bytes, self.max_body_bytes)}); default 134217728")
        if not 64 <= self.max_query_chars <= 65536:
            _bad(f"{where}.max_query_chars", self.max_query_chars, "between 64 and 65536 characters (default 4096)")
        if not 1024 <= self.max_event_bytes <= self.max_inspect_bytes:
            _bad(f"{where}.max_event_bytes", self.max_event_bytes,
                 f"between 1024 and {where}.max_inspect_bytes ({self.max_inspect_bytes}); default 1048576")


@dataclass(frozen=True)
class AdminConfig:
    token_env: str = "RAGTOLL_ADMIN_TOKEN"
    token_file: str | None = None  # read (and its errors reported) by proxy/secrets.py at start

    def validate(self, where: str) -> None:
        """Nothing to check here: the token is a secret, read and checked where it is used."""


@dataclass(frozen=True)
class Timeouts:
    """Seconds. `read` is the longest wait for the next byte, so long streams are fine."""

    connect: float = 5.0
    read: float = 120.0
    write: float = 30.0
    pool: float = 5.0

    def validate(self, where: str) -> None:
        for name in ("connect", "read", "write", "pool"):
            _positive_s(f"{where}.{name}", getattr(self, name))


@dataclass(frozen=True)
class Limits:
    max_connections: int = 200
    max_keepalive_connections: int = 50  # HTTP/2 upstreams; aiohttp keeps any idle connection for keepalive_s
    keepalive_s: float = 15.0  # an idle connection is closed after this

    def validate(self, where: str) -> None:
        _positive_s(f"{where}.keepalive_s", self.keepalive_s, " (default 15)")
        if self.max_connections < 1:
            _bad(f"{where}.max_connections", self.max_connections, "at least 1 (default 200)")
        if self.max_keepalive_connections < 0:
            _bad(f"{where}.max_keepalive_connections", self.max_keepalive_connections, "at least 0 (default 50)")


@dataclass(frozen=True)
class TlsConfig:
    """How ragtoll verifies an https upstream and, for mTLS, proves itself to it."""

    ca_file: str | None = None  # PEM bundle of the CAs to trust instead of the public ones (certifi)
    cert_file: str | None = None  # client certificate (PEM) for mutual TLS
    key_file: str | None = None  # its private key (PEM)
    verify: bool = True  # false: no certificate check at all (never in production)

    def validate(self, where: str) -> None:
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                _bad(f"{where}.{name}", path, "the path of a readable PEM file")
        if self.key_file is not None and self.cert_file is None:
            _bad(f"{where}.key_file", self.key_file, "a key together with tls.cert_file (the client certificate)")


@dataclass(frozen=True)
class ProbeConfig:
    """A cheap request that tells a retrieval source's current version (cache freshness)."""

    path: str  # appended to the upstream URL, as a call's path after the prefix is: /version, /collections/docs
    method: Literal["GET", "HEAD", "POST"] = "GET"
    body: str | None = None  # a JSON body (POST)
    header: str | None = None  # the response header holding the version (default: fields.version_header)
    field: str | None = None  # ...or a dotted path in the JSON response body
    timeout_s: float = 2.0

    def validate(self, where: str) -> None:
        if not self.path.startswith("/") or any(c in self.path for c in " \r\n#"):
            _bad(f"{where}.path", self.path, "a path starting with /, such as /version")
        if self.header is not None and not _HEADER.fullmatch(self.header):
            _bad(f"{where}.header", self.header, "an HTTP header name")
        _positive_s(f"{where}.timeout_s", self.timeout_s, " (default 2)")


# How the evidence cache may normalise a query text before keying it (cache.partition.normalize_query):
# whitespace and nfc change nothing an upstream tells apart; the rest only for an upstream that ignores them
NORMALIZE_MODES = ("whitespace", "nfc", "width", "lowercase", "casefold")


def _normalize_modes(key: str, modes: tuple[str, ...]) -> None:
    if isinstance(modes, str) or any(m not in NORMALIZE_MODES for m in modes):
        _bad(key, modes, f"a list of {', '.join(NORMALIZE_MODES)} (default [whitespace, nfc]; lowercase, "
                         "casefold and width only for an upstream that ignores case or width)")


@dataclass(frozen=True)
class UpstreamCacheConfig:
    """The evidence cache's view of one retrieval source."""

    max_staleness_s: float | None = None  # how stale a served entry may be; null: cache.max_staleness_s
    probe: ProbeConfig | None = None  # how to confirm the source's version; null: pushes and responses only
    # whether the upstream filters results by caller (then entries remember the fetcher's view);
    # null: yes when identity reaches it (identity.mode header or jwt: the headers or token are forwarded)
    filters_by_caller: bool | None = None
    # how query texts are normalised before keying (NORMALIZE_MODES); null: cache.normalize
    normalize: tuple[str, ...] | None = None

    def validate(self, where: str, version_header: str | None) -> None:
        if self.normalize is not None:
            _normalize_modes(f"{where}.normalize", self.normalize)
        if self.max_staleness_s is not None:
            _positive_s(f"{where}.max_staleness_s", self.max_staleness_s, " (null: cache.max_staleness_s)")
        if self.probe is not None:
            self.probe.validate(f"{where}.probe")
            if not (self.probe.header or self.probe.field or version_header):
                _bad(f"{where}.probe", {"path": self.probe.path},
                     "a probe naming where its answer holds the version: header, field, or fields.version_header")


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    kind: Literal["llm", "embeddings", "retrieval", "rerank", "other"]
    url: str
    prefix: str = ""
    api: str = "passthrough"
    trusted: bool = False
    fields: Mapping[str, str] = EMPTY
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    tls: TlsConfig = TlsConfig()
    # The HTTP engine under the one client: aiohttp (HTTP/1.1; the fastest measured, bench/) or
    # httpx (httpx2's own transport, httpcore2; the one that speaks HTTP/2).
    engine: Literal["aiohttp", "httpx"] = "aiohttp"
    http2: bool = False  # speak HTTP/2 to it (needs engine: httpx; TLS with ALPN, or h2c prior knowledge)
    proxy: str | None = None  # an outbound HTTP proxy; none by default, and proxy variables are never read
    cache: UpstreamCacheConfig = UpstreamCacheConfig()  # the evidence cache's settings for this source
    # the status of this route's budget refusals (None: budgets.reject_status, else the adapter's:
    # 402 for OpenAI and Anthropic, which frameworks do not retry; 429 where clients honour x-should-retry)
    reject_status: int | None = None

    def __post_init__(self) -> None:
        _freeze(self, "fields")

    @property
    def route_prefix(self) -> str:
        return self.prefix or f"/{self.name}"

    @property
    def origin(self) -> str:
        """scheme://host[:port] of `url`, lowercased (upstreams with one origin share its connections)."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme.lower()}://{rest.split('/', 1)[0].lower()}"

    def validate(self, where: str) -> None:
        """This upstream alone; names, prefixes and origins shared with others are Settings' rules."""
        if not _NAME.fullmatch(self.name):
            _bad(f"{where}.name", self.name, "lowercase letters, digits, '-' or '_', at most 63 characters")
        if not re.fullmatch(r"https?://[^/\s?#@]+(/[^\s?#]*)?", self.url):
            # credentials in the URL would reach logs and collide with the caller's Authorization header
            _bad(f"{where}.url", self.url, "an absolute http:// or https:// URL without credentials, query or "
                 "fragment (the caller's requests carry the upstream's credentials in their headers)")
        prefix = self.route_prefix
        if not _PREFIX.fullmatch(prefix) or ".." in prefix.split("/"):
            _bad(f"{where}.prefix", prefix, "a path such as /openai (letters, digits, '.', '_', '~', '-')")
        if prefix == "/admin" or prefix.startswith("/admin/") or prefix in _RESERVED:
            _bad(f"{where}.prefix", prefix, "a prefix outside the reserved /admin, /healthz, /readyz, /metrics")
        self.timeouts.validate(f"{where}.timeouts")
        self.limits.validate(f"{where}.limits")
        self.tls.validate(f"{where}.tls")
        if self.proxy is not None and not re.fullmatch(r"https?://[^/\s?#]+/?", self.proxy):
            _bad(f"{where}.proxy", self.proxy, "an http:// or https:// proxy URL such as http://proxy:3128, or null")
        if self.http2 and self.engine != "httpx":
            _bad(f"{where}.http2", True, "false, or engine: httpx (aiohttp speaks only HTTP/1.1)")
        if self.http2 and self.proxy is not None:
            _bad(f"{where}.http2", True, "false when a proxy is set (HTTP/2 upstreams are reached directly)")
        self.cache.validate(f"{where}.cache", self.fields.get("version_header"))
        if self.reject_status is not None and not 400 <= self.reject_status <= 599:
            _bad(f"{where}.reject_status", self.reject_status, "an HTTP error status between 400 and 599, or null")


@dataclass(frozen=True)
class TasksConfig:
    header: str = "x-ragtoll-task-id"
    # a call with no trace context and no task header: its conversation's task (an LLM call by its
    # conversation, a search by the tool call it answers: request/conversation.py), else `session`;
    # `session`: one task per client (address, user agent, credential) within the idle timeout;
    # `per-call`: each call its own task; `reject`: refused (400 task_required)
    untracked: Literal["conversation", "session", "per-call", "reject"] = "conversation"
    idle_timeout_s: float = 60.0
    # the limits a heuristic task (a session: one client's calls, maybe many users behind one key) is
    # held to: `progress`: only the progress limits (stalled and fruitless searches) refuse, count and
    # cost limits are shadow verdicts; `full`: every limit, as for a task named by its caller
    session_budgets: Literal["progress", "full"] = "progress"

    def validate(self, where: str) -> None:
        if not _HEADER.fullmatch(self.header):
            _bad(f"{where}.header", self.header, "an HTTP header name")
        _positive_s(f"{where}.idle_timeout_s", self.idle_timeout_s, " (default 60)")


@dataclass(frozen=True)
class Profile:
    """A named limit set. An absent (None) dimension is unlimited."""

    max_steps: int | None = None
    max_calls: int | None = None
    max_retrieval_calls: int | None = None
    max_unique_queries: int | None = None
    max_rerank_calls: int | None = None
    max_context_tokens: int | None = None
    max_prompt_tokens: int | None = None
    max_completion_tokens: int | None = None
    max_cost_usd: float | None = None
    max_latency_ms: int | None = None
    max_stalled_retrievals: int | None = None
    max_fruitless_retrievals: int | None = None
    mode: Literal["enforce", "shadow"] | None = None
    allow_selection: bool = True
    # what the task's first refused LLM call gets: `reject` (the budget's 429/402), or `finish`:
    # it is forwarded once with tools disabled, so the model answers from what it already has
    on_exhausted: Literal["reject", "finish"] = "reject"
    finish_note: str | None = None  # added as a last user message to a finish (None: nothing added)
    # the finish past the limit is an allowance, not a blank cheque: its output is capped (and a
    # stream cut) at this many tokens and this cost, prompt included; a call whose prompt alone
    # costs more is refused. null cost: the smaller of $0.05 and a tenth of max_cost_usd
    finish_max_output_tokens: int = 1024
    finish_max_cost_usd: float | None = None
    # what a refused search or rerank gets: `reject` (the budget's error), or `empty`: a well-formed
    # answer with no results and the budget headers (agents that end a task on a tool error go on)
    on_exhausted_retrieval: Literal["reject", "empty"] = "reject"
    # a task this profile would refuse while it still makes progress (its last retrieval was fruitful)
    # moves to this profile once, and the call is judged again there (a misclassified question)
    escalate_to: str | None = None

    def limits(self) -> dict[str, float]:
        return {d: v for d in DIMENSIONS if (v := getattr(self, d)) is not None}

    def finish_allowance(self) -> tuple[int, float]:
        """(output tokens, USD) the one finish past the limit may use (`on_exhausted: finish`)."""
        cost = self.finish_max_cost_usd
        if cost is None:
            cost = DEFAULT_FINISH_COST_USD if self.max_cost_usd is None \
                else min(DEFAULT_FINISH_COST_USD, self.max_cost_usd / 10)
        return self.finish_max_output_tokens, cost

    def validate(self, where: str) -> None:
        for dim, value in self.limits().items():
            if not _finite(value) or value < 0:
                _bad(f"{where}.{dim}", value, "a finite number >= 0 (omit the key for no limit)")
        if self.finish_max_output_tokens < 1:
            _bad(f"{where}.finish_max_output_tokens", self.finish_max_output_tokens, "at least 1 (default 1024)")
        if self.finish_max_cost_usd is not None and (not _finite(self.finish_max_cost_usd)
                                                     or self.finish_max_cost_usd < 0):
            _bad(f"{where}.finish_max_cost_usd", self.finish_max_cost_usd,
                 "a finite number of USD >= 0 (null: the smaller of 0.05 and a tenth of max_cost_usd)")


@dataclass(frozen=True)
class ProfileRule:
    """Choose `profile` when the route is `route` and/or header `header` equals `equals`."""

    profile: str
    route: str | None = None
    header: str | None = None
    equals: str | None = None

    def validate(self, where: str) -> None:
        """The rule's own shape; BudgetsConfig checks that `profile` names one of its profiles."""
        if self.route is None and self.header is None:
            _bad(where, "{}", "a rule with `route`, `header` + `equals`, or both")
        if (self.header is None) != (self.equals is None):
            # a header without `equals` would match every request that lacks the header
            key, value = ("equals", self.equals) if self.header is None else ("header", self.header)
            _bad(f"{where}.{key}", value, "`header` and `equals` together (the rule matches header == equals)")
        if self.header is not None and not _HEADER.fullmatch(self.header):
            _bad(f"{where}.header", self.header, "an HTTP header name")


DEFAULT_FINISH_COST_USD = 0.05  # the finish allowance's cost when a profile names none (at most)
# The embedded default: stop the loop, not the answer. Progress limits end a task's search (one
# fruitless retrieval in a row, three in all), its next model call answers from the evidence it has
# (finish), a refused search answers empty (agents that end on a tool error go on); the counts and
# cost are ceilings for a loop that never retrieves or whose every search is new (progress limits
# do not stop an agent that asks a new question each time: max_retrieval_calls does), and one
# prompt may hold at most 128k tokens. Measured on bench/eval_agents (docs/evaluations.md).
DEFAULT_PROFILES: FrozenMap[str, Profile] = FrozenMap({
    "bounded": Profile(
        max_steps=40, max_retrieval_calls=40, max_cost_usd=1.0, max_prompt_tokens=128_000,
        max_stalled_retrievals=1, max_fruitless_retrievals=3, on_exhausted="finish", on_exhausted_retrieval="empty",
    )
})
# an `escalate_to` profile must bound what a climbed task may still do: model calls or cost, and searches
_ESCALATION_CEILINGS = (("max_steps", "max_calls", "max_cost_usd"),
                        ("max_retrieval_calls", "max_unique_queries", "max_calls"))


@dataclass(frozen=True)
class BudgetsConfig:
    enabled: bool = True  # false: no budget stage at all (tracing-only proxy; the benchmark's baseline)
    mode: Literal["enforce", "shadow"] = "enforce"
    default_profile: str = "bounded"
    classes: Mapping[str, str] = EMPTY  # query class -> profile
    profiles: Mapping[str, Profile] = DEFAULT_PROFILES
    rules: tuple[ProfileRule, ...] = ()
    reject_status: int | None = None  # None: per adapter (429, or 402 where an SDK retries 429)
    # a budgeted call whose body cannot be read: refused (400 unreadable_body), or forwarded and
    # charged its whole reservation; None: reject when the profile enforces, else charge_reservation
    on_unreadable: Literal["reject", "charge_reservation"] | None = None
    warn_fraction: float = 0.8
    # the output reserved for a call that sets no cap, to a model whose output ceiling is not known
    # (a call without a cap to a known model is reserved the model's ceiling: core/ceilings.py)
    default_max_output_tokens: int = 1024
    output_ceilings: Mapping[str, int] = EMPTY  # model name -> the most output tokens it accepts as its cap
    # a stream extends its own reservation by this many output tokens at a time (reserve -> extend -> settle)
    stream_extension_tokens: int = 256
    # a reservation not settled or extended within this long stops counting as in flight
    reservation_ttl_s: int = 900
    hmac_key_env: str = "RAGTOLL_BUDGET_HMAC_KEY"
    hmac_key_file: str | None = None
    task_ttl_s: int = 86_400  # TTL of every store key of a task, refreshed on each call
    records_file: str = "ragtoll-tasks.jsonl"  # task records sink (JSONL) unless the store is Redis
    records_max_bytes: int = DEFAULT_RECORDS_MAX_BYTES  # JSONL sink: rotate to records_file.1 past this
    records_keep: int = DEFAULT_RECORDS_KEEP  # JSONL sink: rotated files kept (.1 newest ... .N oldest)
    records_stream: str = "ragtoll:records"  # task records sink (Redis Stream) when the store is Redis

    def __post_init__(self) -> None:
        _freeze(self, "classes", "profiles", "rules", "output_ceilings")

    def validate(self, where: str) -> None:
        names = f"one of the profiles: {', '.join(sorted(self.profiles))}"
        if self.default_profile not in self.profiles:
            _bad(f"{where}.default_profile", self.default_profile, names)
        for cls, prof in self.classes.items():
            if prof not in self.profiles:
                _bad(f"{where}.classes.{cls}", prof, names)
        for i, rule in enumerate(self.rules):
            if rule.profile not in self.profiles:
                _bad(f"{where}.rules[{i}].profile", rule.profile, names)
            rule.validate(f"{where}.rules[{i}]")
        for name, profile in self.profiles.items():
            profile.validate(f"{where}.profiles.{name}")
            if profile.escalate_to is not None and (profile.escalate_to not in self.profiles
                                                    or profile.escalate_to == name):
                _bad(f"{where}.profiles.{name}.escalate_to", profile.escalate_to, f"another profile: {names}")
            if profile.escalate_to is not None:
                target = self.profiles[profile.escalate_to].limits()
                for group in _ESCALATION_CEILINGS:
                    if not any(d in target for d in group):
                        _bad(f"{where}.profiles.{name}.escalate_to", profile.escalate_to,
                             f"a profile that bounds a climbed task: {profile.escalate_to!r} sets none of "
                             f"{', '.join(group)}")
        if self.reject_status is not None and not 400 <= self.reject_status <= 599:
            _bad(f"{where}.reject_status", self.reject_status, "an HTTP error status between 400 and 599")
        if not 0 < self.warn_fraction <= 1:
            _bad(f"{where}.warn_fraction", self.warn_fraction, "a fraction in (0, 1]")
        if self.default_max_output_tokens < 1:
            _bad(f"{where}.default_max_output_tokens", self.default_max_output_tokens, "at least 1 (default 1024)")
        for model, ceiling in self.output_ceilings.items():
            if ceiling < 1:
                _bad(f"{where}.output_ceilings.{model}", ceiling, "a number of output tokens >= 1")
        if not 1 <= self.stream_extension_tokens <= 1_000_000:
            _bad(f"{where}.stream_extension_tokens", self.stream_extension_tokens,
                 "a number of output tokens from 1 to 1000000 (default 256)")
        if self.reservation_ttl_s < 10:
            _bad(f"{where}.reservation_ttl_s", self.reservation_ttl_s, "at least 10 seconds (default 900)")
        if self.task_ttl_s < 60:
            _bad(f"{where}.task_ttl_s", self.task_ttl_s, "at least 60 seconds")
        if self.records_max_bytes < MIN_RECORDS_MAX_BYTES:
            _bad(f"{where}.records_max_bytes", self.records_max_bytes,
                 f"at least {MIN_RECORDS_MAX_BYTES} bytes (64 KiB); the default is {DEFAULT_RECORDS_MAX_BYTES} (16 MiB)")
        if not 1 <= self.records_keep <= MAX_RECORDS_KEEP:
            _bad(f"{where}.records_keep", self.records_keep,
                 f"a number of rotated files from 1 to {MAX_RECORDS_KEEP} (default {DEFAULT_RECORDS_KEEP})")


@dataclass(frozen=True)
class PriceEntry:
    """USD per million tokens, or per call; an absent (None) price falls back to the shipped table."""

    input_per_mtok: float | None = None
    cached_input_per_mtok: float | None = None
    output_per_mtok: float | None = None
    per_call: float | None = None
    # prompt tokens written to the provider's cache (Anthropic: 1.25x input for the 5-minute cache);
    # None: priced as input
    cache_write_per_mtok: float | None = None

    def validate(self, where: str) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and (not _finite(value) or value < 0):
                _bad(f"{where}.{f.name}", value, "a price in USD >= 0 (omit the key to keep the shipped price)")


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    ttl_s: int = 3600
    embedder: str = "none"  # none | local | upstream:<name> (Settings checks the name)
    acl_public: str = "public"
    # semantic tier: candidates at or above `similarity` are verified before any is served
    similarity: float = 0.85
    # ...and those up to `reach` below it when they share at least 0.4 of their content words
    # (evidence.REACH_OVERLAP). Off by default: 0.05 served more on the tuning domains but served near
    # misses on held-out A (docs/evidence-cache.md)
    reach: float = 0.0
    candidates: int = 3
    # ...and served only from an entry whose first result led its own retrieval by at least this
    # share of the mean gap between adjacent ranks (verify.top_margin); a near tie serves exact hits only
    min_top_margin: float = 0.25
    embedder_model: str | None = None  # the `model` sent to an upstream:<route> embedder
    max_entries: int = 50_000  # memory store bounds (LRU eviction)
    max_bytes: int = 256 * 1024 * 1024
    max_partition_entries: int = 5_000  # vectors scanned per partition (Redis trims the oldest)
    max_body_bytes: int = 1024 * 1024  # larger responses are not cached
    exact_embeddings: bool = True  # exact caches of embeddings and rerank responses
    sources: Mapping[str, str] = EMPTY  # static source versions by route name
    version_field: str | None = None  # top-level response field holding the source version
    authz_url: str | None = None  # external check: POST {principal, chunk_ids} -> {allowed: [...]}
    authz_ttl_s: float = 30.0
    authz_timeout_s: float = 0.5
    audit_fraction: float = 0.0  # share of semantic hits re-run upstream off the request path
    audit_target: float = 0.95  # agreement below this raises the partition's threshold
    audit_step: float = 0.02
    # a semantic hit is served only when the calibrated model (proxy/data/cache_verifier.json) estimates
    # its probability of being wrong at most this; the audit tightens a route's bound when its live error
    # rate drifts above it. 1 turns the model off (the vetoes alone decide).
    max_error: float = 0.2
    # an entry older than this is served only with its source's version confirmed within it (a probe,
    # a push through the admin API, a response carrying it); per source: upstreams[].cache.max_staleness_s
    max_staleness_s: float = 300.0
    # how query texts are normalised before keying (NORMALIZE_MODES), unless a route says otherwise
    # (upstreams[].cache.normalize): by default only what no upstream tells apart
    normalize: tuple[str, ...] = ("whitespace", "nfc")

    def __post_init__(self) -> None:
        _freeze(self, "sources")

    def validate(self, where: str) -> None:
        if not 0 < self.similarity <= 1:
            _bad(f"{where}.similarity", self.similarity, "a cosine similarity in (0, 1]")
        if not _finite(self.reach) or not 0 <= self.reach < self.similarity:
            _bad(f"{where}.reach", self.reach, "a similarity margin in [0, similarity) (0, the default, turns it off)")
        if self.ttl_s < 1:
            _bad(f"{where}.ttl_s", self.ttl_s, "at least 1 second")
        for key in ("candidates", "max_entries", "max_bytes", "max_partition_entries", "max_body_bytes"):
            if getattr(self, key) < 1:
                _bad(f"{where}.{key}", getattr(self, key), "an integer >= 1")
        if not _finite(self.min_top_margin) or self.min_top_margin < 0:
            _bad(f"{where}.min_top_margin", self.min_top_margin,
                 "a number >= 0 (0 turns the ranking check off; default 0.25)")
        if not _finite(self.max_error) or not 0 < self.max_error <= 1:
            _bad(f"{where}.max_error", self.max_error,
                 "a probability in (0, 1]: the largest estimated chance of a wrong semantic hit to serve "
                 "(default 0.2; 1 serves on the vetoes alone)")
        if not 0 <= self.audit_fraction <= 1:
            _bad(f"{where}.audit_fraction", self.audit_fraction, "a fraction in [0, 1]")
        if not 0 < self.audit_target <= 1:
            _bad(f"{where}.audit_target", self.audit_target, "a fraction in (0, 1]")
        if self.authz_url is not None and not self.authz_url.startswith(("http://", "https://")):
            _bad(f"{where}.authz_url", self.authz_url, "an http:// or https:// URL")
        _positive_s(f"{where}.authz_timeout_s", self.authz_timeout_s, " (default 0.5)")
        _positive_s(f"{where}.max_staleness_s", self.max_staleness_s, " (default 300)")
        _normalize_modes(f"{where}.normalize", self.normalize)
        if not self.acl_public:
            _bad(f"{where}.acl_public", self.acl_public, "a non-empty marker such as public")


@dataclass(frozen=True)
class JwtConfig:
    secret_env: str = "RAGTOLL_JWT_SECRET"
    jwks_file: str | None = None
    algorithms: tuple[str, ...] = ("HS256",)  # one family; checked with the keys (cache/principal.py)
    audience: str | None = None
    issuer: str | None = None
    groups_claim: str = "groups"
    tenant_claim: str = "tenant"
    leeway_s: float = 0.0

    def __post_init__(self) -> None:
        _freeze(self, "algorithms")

    def validate(self, where: str) -> None:
        if not _finite(self.leeway_s) or self.leeway_s < 0:
            _bad(f"{where}.leeway_s", self.leeway_s, "seconds >= 0 of clock skew allowed (default 0)")


@dataclass(frozen=True)
class HeaderIdentityConfig:
    subject: str = "x-auth-subject"
    groups: str = "x-auth-groups"
    tenant: str = "x-auth-tenant"

    def validate(self, where: str) -> None:
        for name in ("subject", "groups", "tenant"):
            if not _HEADER.fullmatch(getattr(self, name)):
                _bad(f"{where}.{name}", getattr(self, name), "an HTTP header name")


@dataclass(frozen=True)
class IdentityConfig:
    mode: Literal["none", "header", "jwt"] = "none"
    jwt: JwtConfig = JwtConfig()
    header: HeaderIdentityConfig = HeaderIdentityConfig()

    def validate(self, where: str) -> None:
        self.jwt.validate(f"{where}.jwt")
        self.header.validate(f"{where}.header")


PRINCIPAL_ID_PREFIXES = ("sub:", "key:", "addr:")  # core/principals.py makes ids of these kinds


@dataclass(frozen=True)
class PrincipalLimits:
    """Limits of one principal across its tasks. An absent (None) key: no limit (in `default`),
    the default's limit (in an override)."""

    max_new_tasks_per_minute: int | None = None
    max_concurrent_tasks: int | None = None
    max_cost_usd_per_hour: float | None = None
    max_cost_usd_per_day: float | None = None

    def limits(self) -> dict[str, float]:
        return {f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    def validate(self, where: str) -> None:
        for name, value in self.limits().items():
            if not _finite(value) or value < 0:
                _bad(f"{where}.{name}", value, "a finite number >= 0 (omit the key for no limit)")


CACHE_KEY_MODES = ("auto", "off", "task", "system")
# hosts known to take `prompt_cache_key` (`auto` sets it there only: an OpenAI-compatible server
# elsewhere may refuse a field it does not know)
CACHE_KEY_HOSTS = ("api.openai.com",)


@dataclass(frozen=True)
class ContextRoute:
    """One route's departures from the `context:` defaults (None: the default applies)."""

    prompt_cache_key: Literal["auto", "off", "task", "system"] | None = None
    breakpoints: bool | None = None
    evidence_once: bool | None = None
    min_chunk_chars: int | None = None
    depth: bool | None = None
    depth_gap: float | None = None
    depth_floor: float | None = None
    widen: bool | None = None
    widen_floor: float | None = None
    widen_margin: float | None = None
    widen_top_k: int | None = None
    budget_note: bool | None = None
    breakpoint_models: tuple[str, ...] | None = None

    def validate(self, where: str) -> None:
        for key in ("depth_gap", "depth_floor", "widen_margin"):
            value = getattr(self, key)
            if value is not None and (not _finite(value) or not 0 <= value <= 1):
                _bad(f"{where}.{key}", value, "a share of the top score in [0, 1] (0 turns this test off)")
        if self.widen_floor is not None and (not _finite(self.widen_floor) or self.widen_floor < 0):
            _bad(f"{where}.widen_floor", self.widen_floor, "a score >= 0 on the retriever's own scale (0: off)")
        if self.widen_top_k is not None and not 1 <= self.widen_top_k <= MAX_WIDEN_TOP_K:
            _bad(f"{where}.widen_top_k", self.widen_top_k,
                 f"an integer in 1..{MAX_WIDEN_TOP_K} (the top_k a widened search asks for)")
        for i, prefix in enumerate(self.breakpoint_models or ()):
            if not prefix.strip():
                _bad(f"{where}.breakpoint_models[{i}]", prefix, "a model name prefix such as gpt-5.6 (an empty one "
                     "would match every model)")
        if self.min_chunk_chars is not None and self.min_chunk_chars < MIN_CHUNK_CHARS:
            _bad(f"{where}.min_chunk_chars", self.min_chunk_chars,
                 f"at least {MIN_CHUNK_CHARS} characters (a shorter text is too common to stand for a chunk)")


MIN_CHUNK_CHARS = 64
MAX_WIDEN_TOP_K = 50  # a widened search never asks for more (the demo tools' own ceiling)
# OpenAI models that take `prompt_cache_breakpoint` on content parts (GPT-5.6 and later, per
# OpenAI's API reference); a prefix list, so dated and named variants match
OPENAI_BREAKPOINT_MODELS = ("gpt-5.6",)


@dataclass(frozen=True)
class ContextConfig:
    """The context economy (proxy/core/context.py, proxy/stages/context.py): request rewrites that
    make an LLM call's prompt cheaper without taking anything from the model.

    `prompt_cache_key` (OpenAI-style routes): `task` sets a key per task when the client set none
    (a task's calls reach the machine holding its conversation), `system` one per caller and system
    prompt, `off` none; `auto` is `task` on api.openai.com (chosen by bench/eval_agents/context_eval.py)
    and `off` elsewhere (an OpenAI-compatible server may refuse a field it does not know). `breakpoints` (Anthropic
    routes): cache_control where the stable prefix ends. `evidence_once`: a chunk a new tool result
    repeats from earlier in the conversation becomes a reference. `widen` (off): a task's weak first
    pass widens its next search. `budget_note` (off): the prompt ends with what the task has left.
    `breakpoint_models`: OpenAI models that take `prompt_cache_breakpoint`. `routes` overrides by
    route name (docs/context.md)."""

    enabled: bool = True
    prompt_cache_key: Literal["auto", "off", "task", "system"] = "auto"
    breakpoints: bool = True
    evidence_once: bool = True
    min_chunk_chars: int = 200  # a tool-result text shorter than this is never replaced
    # adaptive depth (retrieval routes): results past the largest score drop (`depth_gap`, a share
    # of the top score) or under `depth_floor` x the top score are not passed on. On by default:
    # bench/eval_agents/context_eval.py chose gap 0.15 on half its tasks (against both providers)
    # and lost no answer on either half (x-ragtoll-depth says what was cut; `routes.<name>.depth:
    # false` opts out)
    depth: bool = True
    depth_gap: float = 0.15
    depth_floor: float = 0.0
    # widening a weak first pass (retrieval routes, per task): a task's first search on a query
    # whose top score is under `widen_floor` (the retriever's scale; 0: off) or whose top result
    # leads the next by less than `widen_margin` x the top score is passed on uncut, and the task's
    # next search asks for `widen_top_k` results; at most once per task
    widen: bool = False
    widen_floor: float = 0.0
    widen_margin: float = 0.05
    widen_top_k: int = 12
    # a short note of what the task has left (steps, searches, cost), appended as the prompt's last
    # part, never in the cached prefix; off: the eval's scripted models do not read it
    budget_note: bool = False
    # OpenAI-style routes: models (prefixes) that take `prompt_cache_breakpoint`; `breakpoints`
    # turns these on and off with Anthropic's
    breakpoint_models: tuple[str, ...] = OPENAI_BREAKPOINT_MODELS
    routes: Mapping[str, ContextRoute] = EMPTY

    def __post_init__(self) -> None:
        _freeze(self, "routes")

    def validate(self, where: str) -> None:
        if self.min_chunk_chars < MIN_CHUNK_CHARS:
            _bad(f"{where}.min_chunk_chars", self.min_chunk_chars,
                 f"at least {MIN_CHUNK_CHARS} characters (default 200)")
        ContextRoute(depth_gap=self.depth_gap, depth_floor=self.depth_floor, widen_floor=self.widen_floor,
                     widen_margin=self.widen_margin, widen_top_k=self.widen_top_k,
                     breakpoint_models=self.breakpoint_models).validate(where)
        for name, route in self.routes.items():
            route.validate(f"{where}.routes.{name}")

    def for_route(self, name: str) -> ContextRoute:
        """The policy of route `name`, every field resolved (None only where nothing applies)."""
        over = self.routes.get(name) or ContextRoute()
        return ContextRoute(
            prompt_cache_key=over.prompt_cache_key or self.prompt_cache_key,
            breakpoints=self.breakpoints if over.breakpoints is None else over.breakpoints,
            evidence_once=self.evidence_once if over.evidence_once is None else over.evidence_once,
            min_chunk_chars=over.min_chunk_chars or self.min_chunk_chars,
            depth=self.depth if over.depth is None else over.depth,
            depth_gap=self.depth_gap if over.depth_gap is None else over.depth_gap,
            depth_floor=self.depth_floor if over.depth_floor is None else over.depth_floor,
            widen=self.widen if over.widen is None else over.widen,
            widen_floor=self.widen_floor if over.widen_floor is None else over.widen_floor,
            widen_margin=self.widen_margin if over.widen_margin is None else over.widen_margin,
            widen_top_k=over.widen_top_k or self.widen_top_k,
            budget_note=self.budget_note if over.budget_note is None else over.budget_note,
            breakpoint_models=self.breakpoint_models if over.breakpoint_models is None else over.breakpoint_models,
        )


@dataclass(frozen=True)
class PrincipalsConfig:
    """Budgets across tasks, per principal (DESIGN.md "Across tasks"): `default` applies to every
    principal, `overrides` (principal id -> limits, as `ragtoll principal-id` prints) replace keys of it."""

    default: PrincipalLimits = PrincipalLimits()
    overrides: Mapping[str, PrincipalLimits] = EMPTY
    # a caller with no verified identity and no credential: known by its address (`addr:<ip>`, so
    # callers behind one NAT share it), or refused with a 401 (gateways that require a credential)
    anonymous: Literal["address", "refuse"] = "address"

    def __post_init__(self) -> None:
        _freeze(self, "overrides")

    @property
    def enabled(self) -> bool:
        return bool(self.default.limits()) or any(o.limits() for o in self.overrides.values())

    def limits_for(self, principal: str) -> dict[str, float]:
        override = self.overrides.get(principal)
        return {**self.default.limits(), **(override.limits() if override is not None else {})}

    def validate(self, where: str) -> None:
        self.default.validate(f"{where}.default")
        for pid, limits in self.overrides.items():
            if not pid.startswith(PRINCIPAL_ID_PREFIXES) or len(pid) > 300:
                _bad(f"{where}.overrides.{pid}", pid, "a principal id (sub:<subject>, key:<hash> or addr:<address>); "
                     "`ragtoll principal-id` prints the id of a subject or credential")
            limits.validate(f"{where}.overrides.{pid}")


@dataclass(frozen=True)
class TelemetryConfig:
    capture_content: bool = False
    content_max_chars: int = 2048
    service_name: str = "ragtoll"
    # thread: the SDK's batch thread in ragtoll's own process encodes and sends spans (holding the GIL
    # meanwhile); process: a child process does (instrumentation/export.py), which frees ragtoll's
    # core but costs more CPU in all (the copy and rebuild): measured, docs/performance.md
    export: Literal["process", "thread"] = "thread"

    def validate(self, where: str) -> None:
        if self.content_max_chars < 0:
            _bad(f"{where}.content_max_chars", self.content_max_chars, "at least 0 (default 2048)")
        if not self.service_name:
            _bad(f"{where}.service_name", self.service_name, "a non-empty service name (default ragtoll)")


@dataclass(frozen=True)
class Settings:
    server: ServerConfig = ServerConfig()
    store: str = "memory"
    store_timeout_ms: int = 250
    on_store_error: Literal["open", "closed"] = "open"
    admin: AdminConfig = AdminConfig()
    upstreams: tuple[UpstreamConfig, ...] = ()
    tasks: TasksConfig = TasksConfig()
    budgets: BudgetsConfig = BudgetsConfig()
    pricing: Mapping[str, PriceEntry] = EMPTY  # model or route name (or `default`) -> price
    cache: CacheConfig = CacheConfig()
    identity: IdentityConfig = IdentityConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    principals: PrincipalsConfig = PrincipalsConfig()
    context: ContextConfig = ContextConfig()

    def __post_init__(self) -> None:
        _freeze(self, "upstreams", "pricing")

    def validate(self) -> None:
        """Every section's own rules, then the few that span sections: upstream names, prefixes
        and origins shared between upstreams, and `cache.embedder` naming an upstream."""
        names: set[str] = set()
        prefixes: dict[str, str] = {}
        origins: dict[str, tuple[str, UpstreamConfig]] = {}
        for i, up in enumerate(self.upstreams):
            where = f"upstreams[{i}]"
            up.validate(where)
            if up.name in names:
                _bad(f"{where}.name", up.name, "a name not used by another upstream")
            names.add(up.name)
            prefix = up.route_prefix
            for other, owner in prefixes.items():
                if prefix == other or prefix.startswith(other + "/") or other.startswith(prefix + "/"):
                    _bad(f"{where}.prefix", prefix, f"a prefix that does not overlap {other!r} of upstream {owner!r}")
            prefixes[prefix] = up.name
            _check_one_transport(where, up, origins)
        self.budgets.validate("budgets")
        for name, price in self.pricing.items():
            price.validate(f"pricing.{name}")
        if self.store_timeout_ms <= 0:
            _bad("store_timeout_ms", self.store_timeout_ms, "a positive number of milliseconds (e.g. 250)")
        if not re.match(r"^(memory|redis://|rediss://|redis\+cluster://|unix://)", self.store):
            _bad("store", self.store, "memory, redis://host:6379/0, rediss://..., or redis+cluster://host:port")
        self.server.validate("server")
        self.admin.validate("admin")
        self.cache.validate("cache")
        emb = self.cache.embedder
        if emb not in ("none", "local") and not (emb.startswith("upstream:") and emb[9:] in names):
            _bad("cache.embedder", emb,
                 f"none, local, or upstream:<name> with a configured upstream ({', '.join(sorted(names))})")
        self.tasks.validate("tasks")
        self.identity.validate("identity")
        self.telemetry.validate("telemetry")
        self.principals.validate("principals")
        self.context.validate("context")
        for name in self.context.routes:
            if name not in names:
                _bad(f"context.routes.{name}", name,
                     f"the name of a configured upstream ({', '.join(sorted(names))})")


def _check_one_transport(where: str, up: UpstreamConfig, seen: dict[str, tuple[str, UpstreamConfig]]) -> None:
    """Upstreams that share an origin share its connections, so they must agree on how to reach it."""
    origin = up.origin
    if origin not in seen:
        seen[origin] = (where, up)
        return
    other_where, other = seen[origin]
    for name in ("engine", "tls", "http2", "proxy", "limits"):
        if getattr(up, name) != getattr(other, name):
            _bad(f"{where}.{name}", getattr(up, name),
                 f"the same {name} as {other_where} ({other.name!r}), which has the same origin {origin}")


# With no file and no RAGTOLL_UPSTREAM_* variables, this is the route the embedded default serves,
# so `OPENAI_BASE_URL=http://127.0.0.1:8787/openai/v1` works out of the box.
DEFAULT_UPSTREAMS: tuple[Mapping[str, str], ...] = (
    FrozenMap({"name": "openai", "kind": "llm", "api": "openai", "url": "https://api.openai.com", "prefix": "/openai"}),
)


# --- entry points ----------------------------------------------------------------------------------


def load(env: Mapping[str, str] | None = None, path: str | None = None) -> Settings:
    """Settings from an optional YAML file, then `RAGTOLL_*` overrides, validated.

    `path` defaults to `RAGTOLL_CONFIG`. Nested keys are addressed with `__`
    (`RAGTOLL_SERVER__PORT=9000`); `RAGTOLL_UPSTREAM_<NAME>=<kind>:<api>:<url>` adds a route.
    Values are read as JSON scalars when they parse as such, else as strings.
    """
    env = os.environ if env is None else env
    path = path or env.get("RAGTOLL_CONFIG") or None
    raw: dict[str, Any] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                loaded = yaml.safe_load(fh)
        except OSError as exc:
            raise ConfigError(f"Config file {path!r} cannot be read: {exc.strerror}.") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"Config file {path!r} is not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"Config file {path!r} must hold a mapping at the top, not {_kind(loaded)}.")
        raw = loaded
    _apply_env(raw, env)
    if not raw.get("upstreams"):
        raw["upstreams"] = [dict(u) for u in DEFAULT_UPSTREAMS]
    return parse(raw)


def parse(raw: Mapping[str, Any]) -> Settings:
    """Settings from an already-parsed mapping (YAML, JSON, tests, the demo), validated."""
    settings: Settings = _build(Settings, raw, "")
    settings.validate()
    return settings


def validate(settings: Settings) -> None:
    """Every section's rules and those across sections (`Settings.validate`)."""
    settings.validate()


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


# --- RAGTOLL_* variables over the file ---------------------------------------------------------------


def _apply_env(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    top = {f.name for f in dataclasses.fields(Settings)}
    upstreams: list[dict[str, Any]] = []
    for name in sorted(env):
        if not name.startswith("RAGTOLL_"):
            continue
        rest = name[len("RAGTOLL_"):]
        value = env[name]
        if rest.startswith("UPSTREAM_") and "__" not in rest:
            upstreams.append(_upstream_from_env(name, rest[len("UPSTREAM_"):].lower(), value))
            continue
        parts = [p.lower() for p in rest.split("__")]
        if parts[0] not in top:
            continue  # not a config key (RAGTOLL_ADMIN_TOKEN, RAGTOLL_TASK_ID, ...)
        node = raw
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = _scalar(value)
    if upstreams:
        existing = raw.get("upstreams") or []
        if not isinstance(existing, list):
            raise ConfigError(f"Config 'upstreams' has value {existing!r}. Expected a list of upstreams.")
        by_name = {u.get("name"): u for u in existing if isinstance(u, dict)}
        for up in upstreams:
            by_name[up["name"]] = up
        raw["upstreams"] = list(by_name.values())


def _upstream_from_env(var: str, name: str, value: str) -> dict[str, Any]:
    kind, _, rest = value.partition(":")
    api, _, url = rest.partition(":")
    if not url or kind not in KINDS:
        raise ConfigError(
            f"Config '{var}' has value {value!r}. Expected <kind>:<api>:<url> with kind one of "
            f"{', '.join(KINDS)}, e.g. llm:openai:https://api.openai.com."
        )
    return {"name": name.replace("_", "-"), "kind": kind, "api": api, "url": url}


def _scalar(value: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        return value


# --- a small typed builder: mapping -> frozen dataclass, with errors that name the key --------------


_SCHEMAS: dict[type[Any], tuple[tuple[str, Any, bool], ...]] = {}


def _schema(cls: type[Any]) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of each field, the string annotations resolved once per class."""
    if cls not in _SCHEMAS:
        hints = typing.get_type_hints(cls)
        _SCHEMAS[cls] = tuple(
            (f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls))
    return _SCHEMAS[cls]


def _build(cls: type[Any], raw: Any, path: str) -> Any:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"Config '{path or '<top>'}' has value {raw!r}. Expected a mapping.", key=path)
    schema = _schema(cls)
    for key in raw:
        if not any(key == name for name, _, _ in schema):
            known = sorted(name for name, _, _ in schema)
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(
                f"Config '{where}' is not a known key. Expected one of: {', '.join(known)}.", key=where
            )
    kwargs: dict[str, Any] = {}
    for name, tp, required in schema:
        where = f"{path}.{name}" if path else name
        if name in raw:
            kwargs[name] = _coerce(tp, raw[name], where)
        elif required:
            raise ConfigError(f"Config '{where}' is required but missing.", key=where)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path)
    if origin is Literal:
        if value not in args:
            _bad(path, value, "one of: " + ", ".join(str(a) for a in args))
        return value
    if origin is tuple:  # tuple[X, ...]: a YAML or JSON list
        if not isinstance(value, (list, tuple)):
            _bad(path, value, "a list")
        return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is Mapping:
        if not isinstance(value, Mapping):
            _bad(path, value, "a mapping")
        return FrozenMap({str(k): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()})
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            _bad(path, value, "true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _bad(path, value, "an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _bad(path, value, "a number")
        try:
            return float(value)
        except OverflowError:  # an integer past 1.8e308
            _bad(path, value, "a number (at most 1.8e308)")
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            _bad(path, value, "a string")
        return str(value)
    if tp is Any:
        return value
    raise TypeError(f"config type {tp!r} at {path} is not supported")  # a bug in this module, not user input
