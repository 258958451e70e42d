"""Configuration: frozen dataclasses per section, loaded from YAML and `RAGTOLL_*` variables.

`load(env, path)` is the only entry point; it validates everything once and raises `ConfigError`
naming the key, the bad value and what would be valid. Nothing else in ragtoll reads the
environment for configuration. Imports no I/O library besides yaml.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

import orjson
import yaml
from ragtoll.instrumentation.semconv import DIMENSIONS

from .errors import ConfigError

KINDS = ("llm", "embeddings", "retrieval", "rerank", "other")
DEFAULT_PORT = 8787
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_INSPECT_BYTES = 8 * 1024 * 1024
# The JSONL task-record sink rotates its file past this size and keeps this many rotated files.
DEFAULT_RECORDS_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_RECORDS_KEEP = 3
MIN_RECORDS_MAX_BYTES = 64 * 1024
MAX_RECORDS_KEEP = 100
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_PREFIX = re.compile(r"^(/[A-Za-z0-9._~-]+)+$")


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
    # The most of one response ragtoll decodes to read it (a buffered retrieval body, the SSE it
    # observes): past it, the rest passes through unread and the span says so.
    max_inspect_bytes: int = DEFAULT_MAX_INSPECT_BYTES
    max_event_bytes: int = 1024 * 1024  # one SSE event; a longer one ends the stream's observation
    # On SIGTERM: calls in flight get this long to finish before ragtoll ends its tasks and exits
    # (keep it under the pod's terminationGracePeriodSeconds).
    shutdown_grace_s: float = 20.0


@dataclass(frozen=True)
class AdminConfig:
    token_env: str = "RAGTOLL_ADMIN_TOKEN"
    token_file: str | None = None


@dataclass(frozen=True)
class Timeouts:
    """Seconds. `read` is the longest wait for the next byte, so long streams are fine."""

    connect: float = 5.0
    read: float = 120.0
    write: float = 30.0
    pool: float = 5.0


@dataclass(frozen=True)
class Limits:
    max_connections: int = 200
    max_keepalive_connections: int = 50  # HTTP/2 upstreams; aiohttp keeps any idle connection for keepalive_s
    keepalive_s: float = 15.0  # an idle connection is closed after this


@dataclass(frozen=True)
class TlsConfig:
    """How ragtoll verifies an https upstream and, for mTLS, proves itself to it."""

    ca_file: str | None = None  # PEM bundle of the CAs to trust instead of the public ones (certifi)
    cert_file: str | None = None  # client certificate (PEM) for mutual TLS
    key_file: str | None = None  # its private key (PEM)
    verify: bool = True  # false: no certificate check at all (never in production)


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    kind: Literal["llm", "embeddings", "retrieval", "rerank", "other"]
    url: str
    prefix: str = ""
    api: str = "passthrough"
    trusted: bool = False
    fields: dict[str, str] = field(default_factory=dict)
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    tls: TlsConfig = TlsConfig()
    # The HTTP engine under the one client: aiohttp (HTTP/1.1; the fastest measured, bench/) or
    # httpx (httpx2's own transport, httpcore2; the one that speaks HTTP/2).
    engine: Literal["aiohttp", "httpx"] = "aiohttp"
    http2: bool = False  # speak HTTP/2 to it (needs engine: httpx; TLS with ALPN, or h2c prior knowledge)
    proxy: str | None = None  # an outbound HTTP proxy; none by default, and proxy variables are never read

    @property
    def route_prefix(self) -> str:
        return self.prefix or f"/{self.name}"

    @property
    def origin(self) -> str:
        """scheme://host[:port] of `url`, lowercased (upstreams with one origin share its connections)."""
        scheme, _, rest = self.url.partition("://")
        return f"{scheme.lower()}://{rest.split('/', 1)[0].lower()}"


@dataclass(frozen=True)
class TasksConfig:
    header: str = "x-ragtoll-task-id"
    untracked: Literal["session", "per-call", "reject"] = "session"
    idle_timeout_s: float = 60.0


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
    mode: Literal["enforce", "shadow"] | None = None
    allow_selection: bool = True

    def limits(self) -> dict[str, float]:
        return {d: v for d in DIMENSIONS if (v := getattr(self, d)) is not None}


@dataclass(frozen=True)
class ProfileRule:
    """Choose `profile` when the route is `route` and/or header `header` equals `equals`."""

    profile: str
    route: str | None = None
    header: str | None = None
    equals: str | None = None


@dataclass(frozen=True)
class BudgetsConfig:
    enabled: bool = True  # false: no budget stage at all (tracing-only proxy; the benchmark's baseline)
    mode: Literal["enforce", "shadow"] = "enforce"
    default_profile: str = "bounded"
    classes: dict[str, str] = field(default_factory=dict)
    profiles: dict[str, Profile] = field(
        default_factory=lambda: {
            "bounded": Profile(
                max_steps=8, max_retrieval_calls=6, max_unique_queries=4, max_rerank_calls=3,
                max_context_tokens=24000, max_latency_ms=30000, max_cost_usd=0.05, max_stalled_retrievals=2,
            )
        }
    )
    rules: list[ProfileRule] = field(default_factory=list)
    reject_status: int = 429
    warn_fraction: float = 0.8
    default_max_output_tokens: int = 1024
    hmac_key_env: str = "RAGTOLL_BUDGET_HMAC_KEY"
    hmac_key_file: str | None = None
    task_ttl_s: int = 86_400  # TTL of every store key of a task, refreshed on each call
    records_file: str = "ragtoll-tasks.jsonl"  # task records sink (JSONL) unless the store is Redis
    records_max_bytes: int = DEFAULT_RECORDS_MAX_BYTES  # JSONL sink: rotate to records_file.1 past this
    records_keep: int = DEFAULT_RECORDS_KEEP  # JSONL sink: rotated files kept (.1 newest ... .N oldest)
    records_stream: str = "ragtoll:records"  # task records sink (Redis Stream) when the store is Redis


@dataclass(frozen=True)
class PriceEntry:
    input_per_mtok: float | None = None
    cached_input_per_mtok: float | None = None
    output_per_mtok: float | None = None
    per_call: float | None = None


@dataclass(frozen=True)
class CacheConfig:
    enabled: bool = True
    ttl_s: int = 3600
    embedder: str = "none"
    acl_public: str = "public"
    # semantic tier: candidates at or above `similarity` are verified before any is served
    similarity: float = 0.85
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
    sources: dict[str, str] = field(default_factory=dict)  # static source versions by route name
    version_field: str | None = None  # top-level response field holding the source version
    authz_url: str | None = None  # external check: POST {principal, chunk_ids} -> {allowed: [...]}
    authz_ttl_s: float = 30.0
    authz_timeout_s: float = 0.5
    audit_fraction: float = 0.0  # share of semantic hits re-run upstream off the request path
    audit_target: float = 0.95  # agreement below this raises the partition's threshold
    audit_step: float = 0.02


@dataclass(frozen=True)
class JwtConfig:
    secret_env: str = "RAGTOLL_JWT_SECRET"
    jwks_file: str | None = None
    algorithms: list[str] = field(default_factory=lambda: ["HS256"])
    audience: str | None = None
    issuer: str | None = None
    groups_claim: str = "groups"
    tenant_claim: str = "tenant"
    leeway_s: float = 0.0


@dataclass(frozen=True)
class HeaderIdentityConfig:
    subject: str = "x-auth-subject"
    groups: str = "x-auth-groups"
    tenant: str = "x-auth-tenant"


@dataclass(frozen=True)
class IdentityConfig:
    mode: Literal["none", "header", "jwt"] = "none"
    jwt: JwtConfig = JwtConfig()
    header: HeaderIdentityConfig = HeaderIdentityConfig()


@dataclass(frozen=True)
class TelemetryConfig:
    capture_content: bool = False
    content_max_chars: int = 2048
    service_name: str = "ragtoll"


@dataclass(frozen=True)
class Settings:
    server: ServerConfig = ServerConfig()
    store: str = "memory"
    store_timeout_ms: int = 250
    on_store_error: Literal["open", "closed"] = "open"
    admin: AdminConfig = AdminConfig()
    upstreams: list[UpstreamConfig] = field(default_factory=list)
    tasks: TasksConfig = TasksConfig()
    budgets: BudgetsConfig = BudgetsConfig()
    pricing: dict[str, PriceEntry] = field(default_factory=dict)
    cache: CacheConfig = CacheConfig()
    identity: IdentityConfig = IdentityConfig()
    telemetry: TelemetryConfig = TelemetryConfig()


# With no file and no RAGTOLL_UPSTREAM_* variables, this is the route the embedded default serves,
# so `OPENAI_BASE_URL=http://127.0.0.1:8787/openai/v1` works out of the box.
DEFAULT_UPSTREAMS: list[dict[str, Any]] = [
    {"name": "openai", "kind": "llm", "api": "openai", "url": "https://api.openai.com", "prefix": "/openai"}
]


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
    settings = _build(Settings, raw, "")
    validate(settings)
    return settings


def parse(raw: Mapping[str, Any]) -> Settings:
    """Settings from an already-parsed mapping (tests, the demo), validated."""
    settings = _build(Settings, dict(raw), "")
    validate(settings)
    return settings


def validate(settings: Settings) -> None:
    """Cross-field rules the types cannot express."""
    names: set[str] = set()
    prefixes: dict[str, str] = {}
    origins: dict[str, tuple[str, UpstreamConfig]] = {}
    for i, up in enumerate(settings.upstreams):
        where = f"upstreams[{i}]"
        if not _NAME.match(up.name):
            _bad(f"{where}.name", up.name, "lowercase letters, digits, '-' or '_', at most 63 characters")
        if up.name in names:
            _bad(f"{where}.name", up.name, "a name not used by another upstream")
        names.add(up.name)
        if not re.match(r"^https?://[^/\s?#]+(/[^\s?#]*)?$", up.url):
            _bad(f"{where}.url", up.url, "an absolute http:// or https:// URL without query or fragment")
        prefix = up.route_prefix
        if not _PREFIX.match(prefix) or ".." in prefix.split("/"):
            _bad(f"{where}.prefix", prefix, "a path such as /openai (letters, digits, '.', '_', '~', '-')")
        if prefix == "/admin" or prefix.startswith("/admin/") or prefix in ("/healthz", "/readyz", "/metrics"):
            _bad(f"{where}.prefix", prefix, "a prefix outside the reserved /admin, /healthz, /readyz, /metrics")
        for other, owner in prefixes.items():
            if prefix == other or prefix.startswith(other + "/") or other.startswith(prefix + "/"):
                _bad(f"{where}.prefix", prefix, f"a prefix that does not overlap {other!r} of upstream {owner!r}")
        prefixes[prefix] = up.name
        _check_adapter(where, up)
        _check_transport(where, up, origins)
    b = settings.budgets
    if b.default_profile not in b.profiles:
        _bad("budgets.default_profile", b.default_profile, f"one of the profiles: {', '.join(sorted(b.profiles))}")
    for cls, prof in b.classes.items():
        if prof not in b.profiles:
            _bad(f"budgets.classes.{cls}", prof, f"one of the profiles: {', '.join(sorted(b.profiles))}")
    for i, rule in enumerate(b.rules):
        if rule.profile not in b.profiles:
            _bad(f"budgets.rules[{i}].profile", rule.profile, f"one of the profiles: {', '.join(sorted(b.profiles))}")
        if rule.route is None and rule.header is None:
            _bad(f"budgets.rules[{i}]", "{}", "a rule with `route`, `header` + `equals`, or both")
    for name, prof in b.profiles.items():
        for dim, value in prof.limits().items():
            if not math.isfinite(value) or value < 0:
                _bad(f"budgets.profiles.{name}.{dim}", value, "a finite number >= 0 (omit the key for no limit)")
    if settings.store_timeout_ms <= 0:
        _bad("store_timeout_ms", settings.store_timeout_ms, "a positive number of milliseconds (e.g. 250)")
    for i, up in enumerate(settings.upstreams):
        for name in ("connect", "read", "write", "pool"):
            value = getattr(up.timeouts, name)
            if not math.isfinite(value) or value <= 0:
                _bad(f"upstreams[{i}].timeouts.{name}", value, "a positive number of seconds")
    if not 400 <= b.reject_status <= 599:
        _bad("budgets.reject_status", b.reject_status, "an HTTP error status between 400 and 599")
    if b.task_ttl_s < 60:
        _bad("budgets.task_ttl_s", b.task_ttl_s, "at least 60 seconds")
    if not 0 < b.warn_fraction <= 1:
        _bad("budgets.warn_fraction", b.warn_fraction, "a fraction in (0, 1]")
    if b.records_max_bytes < MIN_RECORDS_MAX_BYTES:
        _bad("budgets.records_max_bytes", b.records_max_bytes,
             f"at least {MIN_RECORDS_MAX_BYTES} bytes (64 KiB); the default is {DEFAULT_RECORDS_MAX_BYTES} (16 MiB)")
    if not 1 <= b.records_keep <= MAX_RECORDS_KEEP:
        _bad("budgets.records_keep", b.records_keep,
             f"a number of rotated files from 1 to {MAX_RECORDS_KEEP} (default {DEFAULT_RECORDS_KEEP})")
    if not re.match(r"^(memory|redis://|rediss://|redis\+cluster://|unix://)", settings.store):
        _bad("store", settings.store, "memory, redis://host:6379/0, rediss://..., or redis+cluster://host:port")
    if not 1 <= settings.server.port <= 65535:
        _bad("server.port", settings.server.port, "a TCP port between 1 and 65535")
    _check_server(settings.server)
    emb = settings.cache.embedder
    if emb not in ("none", "local") and not (emb.startswith("upstream:") and emb[9:] in names):
        _bad("cache.embedder", emb, f"none, local, or upstream:<name> with a configured upstream ({', '.join(sorted(names))})")
    margin = settings.cache.min_top_margin
    if not math.isfinite(margin) or margin < 0:
        _bad("cache.min_top_margin", margin, "a number >= 0 (0 turns the ranking check off; default 0.25)")
    if not re.match(r"^[a-z0-9-]+$", settings.tasks.header.lower()):
        _bad("tasks.header", settings.tasks.header, "an HTTP header name")


def _check_server(srv: ServerConfig) -> None:
    if srv.max_body_bytes < 1024:
        _bad("server.max_body_bytes", srv.max_body_bytes, "at least 1024")
    # granian (hyper) takes the head timeout in whole milliseconds, 1 ms to 60 s
    if not math.isfinite(srv.header_timeout_s) or not 0.001 <= srv.header_timeout_s <= 60:
        _bad("server.header_timeout_s", srv.header_timeout_s, "seconds between 0.001 and 60 (default 10)")
    if not math.isfinite(srv.body_timeout_s) or srv.body_timeout_s <= 0:
        _bad("server.body_timeout_s", srv.body_timeout_s, "a positive number of seconds (default 30)")
    if not math.isfinite(srv.shutdown_grace_s) or not 0 <= srv.shutdown_grace_s <= 3600:
        _bad("server.shutdown_grace_s", srv.shutdown_grace_s, "seconds between 0 and 3600 (default 20)")
    if srv.max_connections < 1:
        _bad("server.max_connections", srv.max_connections, "at least 1 (default 1024)")
    if srv.max_inspect_bytes < 64 * 1024:
        _bad("server.max_inspect_bytes", srv.max_inspect_bytes, "at least 65536 (default 8388608)")
    if not 1024 <= srv.max_event_bytes <= srv.max_inspect_bytes:
        _bad("server.max_event_bytes", srv.max_event_bytes,
             f"between 1024 and server.max_inspect_bytes ({srv.max_inspect_bytes}); default 1048576")


def _check_transport(where: str, up: UpstreamConfig, seen: dict[str, tuple[str, UpstreamConfig]]) -> None:
    """TLS files that exist, a proxy URL, and one transport per origin: upstreams that share an
    origin share its connections, so they must agree on how to reach it."""
    for name in ("ca_file", "cert_file", "key_file"):
        path = getattr(up.tls, name)
        if path is not None and not os.path.isfile(path):
            _bad(f"{where}.tls.{name}", path, "the path of a readable PEM file")
    if up.tls.key_file is not None and up.tls.cert_file is None:
        _bad(f"{where}.tls.key_file", up.tls.key_file, "a key together with tls.cert_file (the client certificate)")
    if not math.isfinite(up.limits.keepalive_s) or up.limits.keepalive_s <= 0:
        _bad(f"{where}.limits.keepalive_s", up.limits.keepalive_s, "a positive number of seconds (default 15)")
    if up.limits.max_connections < 1:
        _bad(f"{where}.limits.max_connections", up.limits.max_connections, "at least 1 (default 200)")
    if up.proxy is not None and not re.match(r"^https?://[^/\s?#]+/?$", up.proxy):
        _bad(f"{where}.proxy", up.proxy, "an http:// or https:// proxy URL such as http://proxy:3128, or null")
    if up.http2 and up.engine != "httpx":
        _bad(f"{where}.http2", True, "false, or engine: httpx (aiohttp speaks only HTTP/1.1)")
    if up.http2 and up.proxy is not None:
        _bad(f"{where}.http2", True, "false when a proxy is set (HTTP/2 upstreams are reached directly)")
    origin = up.origin
    if origin in seen:
        other_where, other = seen[origin]
        for name in ("engine", "tls", "http2", "proxy", "limits"):
            if getattr(up, name) != getattr(other, name):
                _bad(f"{where}.{name}", getattr(up, name),
                     f"the same {name} as {other_where} ({other.name!r}), which has the same origin {origin}")
    else:
        seen[origin] = (where, up)


def _check_adapter(where: str, up: UpstreamConfig) -> None:
    from . import adapters  # the registry's public functions; imported late only to keep check-config light

    if up.api not in adapters.names():
        _bad(f"{where}.api", up.api, f"one of the adapters: {', '.join(adapters.names())}")
    keys = adapters.field_keys(up.api)  # adapters driven by `fields:` paths say which they read
    if keys is not None:
        for key in sorted(set(up.fields) - keys):
            _bad(f"{where}.fields.{key}", up.fields[key], f"a field of {up.api}: one of {', '.join(sorted(keys))}")


def _bad(key: str, value: Any, valid: str) -> typing.NoReturn:
    raise ConfigError(f"Config '{key}' has value {value!r}. Expected {valid}.", key=key)


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


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


def _build(cls: type[Any], raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"Config '{path or '<top>'}' has value {raw!r}. Expected a mapping.", key=path)
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            raise ConfigError(
                f"Config '{where}' is not a known key. Expected one of: {', '.join(sorted(known))}.", key=where
            )
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        if f.name in raw:
            kwargs[f.name] = _coerce(hints[f.name], raw[f.name], where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
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
    if origin is list:
        if not isinstance(value, list):
            _bad(path, value, "a list")
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            _bad(path, value, "a mapping")
        return {str(k): _coerce(args[1], v, f"{path}.{k}") for k, v in value.items()}
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
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            _bad(path, value, "a string")
        return str(value)
    if tp is Any:
        return value
    raise TypeError(f"config type {tp!r} at {path} is not supported")  # a bug in this module, not user input
