"""ragtoll's metric instruments, made once per MeterProvider, and their Prometheus exposition.

`Metrics.record_call` / `record_task_end` take plain values; every attribute goes through an
allow-list of keys and a bounded value set, so no task id, trace id or other unbounded value can
become a label. `prometheus_reader` + `render_prometheus` serve `GET /metrics` from a registry of
their own (never prometheus_client's global one).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from . import semconv as sc

METER_NAME = "ragtoll.proxy"
OTHER = "_OTHER"  # what an out-of-set or id-like value is recorded as

# GenAI semconv advisory buckets (gen_ai.client.* metric definitions)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
# ragtoll's own: overhead is milliseconds-scale, costs are fractions of a cent to dollars
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
COST_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 10.0)
CALLS_BUCKETS = (1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233)
SHARE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

OPERATIONS = frozenset({"chat", "text_completion", "embeddings", "retrieval", "rerank", "other"})
KINDS = frozenset({"llm", "embeddings", "retrieval", "rerank", "other"})
OUTCOMES = frozenset({"ok", "rejected", "upstream_error", "client_disconnect", "error", "cache_hit"})
CACHE_RESULTS = frozenset({"hit", "miss", "bypass", "denied", "stale", "error"})
CACHE_TIERS = frozenset({"exact", "semantic", "embeddings", "rerank", "none"})
END_REASONS = frozenset({"explicit", "idle", "call", "shutdown", "exceeded", "expired"})
DEGRADED_BOUNDS = frozenset({"local", "none"})

# Every attribute key any ragtoll metric may carry. Nothing per task, per trace or per user.
ALLOWED_KEYS = frozenset({
    sc.GEN_AI_OPERATION_NAME, sc.GEN_AI_PROVIDER_NAME, sc.GEN_AI_REQUEST_MODEL, sc.GEN_AI_RESPONSE_MODEL,
    sc.GEN_AI_TOKEN_TYPE, sc.ERROR_TYPE, sc.UPSTREAM, sc.UPSTREAM_KIND, sc.OUTCOME,
    sc.BUDGET_EXCEEDED_DIMENSION, sc.BUDGET_MODE, sc.CACHE_RESULT, sc.CACHE_TIER, sc.PROFILE,
    sc.COST_ESTIMATED, sc.BUDGET_EXCEEDED, sc.TASK_END_REASON, sc.BUDGET_DEGRADED_BOUND,
})

# Shapes of ids that must never be label values even when they fit a set's size: 128/64-bit hex
# (trace/span ids, derived task ids), UUIDs, ragtoll session ids, long digit runs.
_ID_LIKE = re.compile(
    r"(^|[^0-9a-f])[0-9a-f]{16,}($|[^0-9a-f])|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}|^session-|[0-9]{9,}",
    re.IGNORECASE,
)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,79}$")


class BoundedValues:
    """The first `limit` distinct well-formed values of one attribute pass; later ones become
    `_OTHER`. For values that come from requests (model names), which a client could vary at will."""

    def __init__(self, limit: int, known: Iterable[str] = ()) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        for value in known:
            self._seen.add(value)

    def __call__(self, value: str | None) -> str | None:
        if value is None:
            return None
        if not _LABEL_VALUE.match(value) or _ID_LIKE.search(value):
            return OTHER
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) >= self.limit:
                return OTHER
            self._seen.add(value)
        return value


def _one_of(values: frozenset[str], value: str | None) -> str | None:
    if value is None:
        return None
    return value if value in values else OTHER


class Metrics:
    """All of ragtoll's instruments, created once from `meter_provider` (default: the global one).

    Thread-safe; the record methods never raise for odd values (they are mapped to `_OTHER`).
    `upstreams`, `profiles` and `models` pre-seed the bounded sets (config names are always kept).
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None, *, upstreams: Iterable[str] = (),
                 profiles: Iterable[str] = (), models: Iterable[str] = (), max_models: int = 64,
                 version: str = "") -> None:
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(METER_NAME, version or None)
        self._upstreams = BoundedValues(len(set(upstreams)) + 8, upstreams)
        self._profiles = BoundedValues(len(set(profiles)) + 8, profiles)
        self._models = BoundedValues(max_models, models)
        self._errors = BoundedValues(32)
        self.token_usage = meter.create_histogram(
            sc.METRIC_TOKEN_USAGE, unit="{token}", description="Number of input and output tokens used",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS)
        self.operation_duration = meter.create_histogram(
            sc.METRIC_OPERATION_DURATION, unit="s", description="GenAI operation duration",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self.calls = meter.create_counter(
            sc.METRIC_CALLS, unit="{call}", description="Calls through ragtoll by upstream kind and outcome")
        self.rejections = meter.create_counter(
            sc.METRIC_REJECTIONS, unit="{call}", description="Calls rejected by a budget, by dimension")
        self.cache_lookups = meter.create_counter(
            sc.METRIC_CACHE_LOOKUPS, unit="{lookup}", description="Evidence cache lookups by result and tier")
        self.cost = meter.create_counter(
            sc.METRIC_COST, unit="USD", description="Cost of calls in US dollars (settled)")
        self.overhead = meter.create_histogram(
            sc.METRIC_OVERHEAD, unit="s", description="Time ragtoll added to a call, excluding upstream time",
            explicit_bucket_boundaries_advisory=OVERHEAD_BUCKETS)
        self.task_cost = meter.create_histogram(
            sc.METRIC_TASK_COST, unit="USD", description="Total cost of a task when it ends",
            explicit_bucket_boundaries_advisory=COST_BUCKETS)
        self.task_calls = meter.create_histogram(
            sc.METRIC_TASK_CALLS, unit="{call}", description="Calls of a task when it ends",
            explicit_bucket_boundaries_advisory=CALLS_BUCKETS)
        self.task_groundedness = meter.create_histogram(
            sc.METRIC_TASK_GROUNDEDNESS, unit="1",
            description="Share of the claims of a task's last answer that the evidence it retrieved backs",
            explicit_bucket_boundaries_advisory=SHARE_BUCKETS)
        self.task_input_tokens = meter.create_counter(
            sc.METRIC_TASK_INPUT_TOKENS, unit="{token}",
            description="LLM input tokens of ended tasks (the upstream's usage, else ragtoll's count)")
        self.task_cached_input_tokens = meter.create_counter(
            sc.METRIC_TASK_CACHED_INPUT_TOKENS, unit="{token}",
            description="LLM input tokens of ended tasks that the provider served from its prompt cache")
        self.task_evidence_tokens = meter.create_counter(
            sc.METRIC_TASK_EVIDENCE_TOKENS, unit="{token}",
            description="Prompt tokens of ended tasks that were evidence the task retrieved")
        self.task_evidence_resent_tokens = meter.create_counter(
            sc.METRIC_TASK_EVIDENCE_RESENT_TOKENS, unit="{token}",
            description="Prompt tokens of ended tasks that were evidence an earlier prompt had already sent")
        self.degraded_admissions = meter.create_counter(
            sc.METRIC_BUDGET_DEGRADED_ADMISSIONS, unit="{call}",
            description="Calls admitted while the budget store's answer was unknown, by what bounded them "
                        "(local: the replica's local ledger; none: nothing)")

        self.records_lost = meter.create_counter(
            sc.METRIC_TASK_RECORDS_LOST, unit="{record}",
            description="Task records not written: the sink failed, or it stalled and more than 10,000 "
                        "records of per-call tasks were waiting")

    def record_call(
        self,
        *,
        operation: str,
        provider: str,
        upstream: str,
        kind: str,
        outcome: str,
        duration_s: float,
        upstream_s: float = 0.0,
        request_model: str | None = None,
        response_model: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cost_usd: float | None = None,
        cost_estimated: bool = False,
        error_type: str | None = None,
        rejected_dimension: str | None = None,
        budget_mode: str | None = None,
        cache_result: str | None = None,
        cache_tier: str | None = None,
    ) -> None:
        """One finished call. `duration_s` is the whole call as the client saw it, `upstream_s` the
        part spent waiting on the upstream (0 for local answers); overhead is the difference.
        Token usage is recorded only when known; a rejected call has no GenAI duration (it never
        reached a model) but counts as a call and a rejection."""
        gen_ai = self._attributes({
            sc.GEN_AI_OPERATION_NAME: _one_of(OPERATIONS, operation),
            sc.GEN_AI_PROVIDER_NAME: self._upstreams(provider),
            sc.GEN_AI_REQUEST_MODEL: self._models(request_model),
            sc.GEN_AI_RESPONSE_MODEL: self._models(response_model),
        })
        kind_attrs = self._attributes({sc.UPSTREAM_KIND: _one_of(KINDS, kind),
                                       sc.OUTCOME: _one_of(OUTCOMES, outcome)})
        self.calls.add(1, kind_attrs)
        if outcome != "rejected":
            duration_attrs = dict(gen_ai)
            if error_type is not None:
                duration_attrs[sc.ERROR_TYPE] = self._errors(error_type) or OTHER
            self.operation_duration.record(max(duration_s, 0.0), duration_attrs)
        for token_type, count in (("input", input_tokens), ("output", output_tokens)):
            if count is not None and count >= 0:
                self.token_usage.record(count, {**gen_ai, sc.GEN_AI_TOKEN_TYPE: token_type})
        if rejected_dimension is not None:
            self.rejections.add(1, self._attributes({
                sc.BUDGET_EXCEEDED_DIMENSION: _one_of(_DIMENSIONS, rejected_dimension),
                sc.BUDGET_MODE: _one_of(frozenset({"enforce", "shadow"}), budget_mode),
            }))
        if cache_result is not None:
            self.record_cache_lookup(cache_result, cache_tier)
        if cost_usd is not None and cost_usd > 0:
            self.cost.add(cost_usd, self._attributes({
                sc.UPSTREAM: self._upstreams(upstream), sc.UPSTREAM_KIND: _one_of(KINDS, kind),
                sc.GEN_AI_REQUEST_MODEL: self._models(request_model), sc.COST_ESTIMATED: bool(cost_estimated),
            }))
        self.overhead.record(max(duration_s - upstream_s, 0.0), self._attributes({
            sc.UPSTREAM_KIND: _one_of(KINDS, kind), sc.OUTCOME: _one_of(OUTCOMES, outcome)}))

    def record_degraded_admission(self, bound: str) -> None:
        """One call admitted while the budget store's answer was unknown; `bound`: local or none."""
        self.degraded_admissions.add(1, self._attributes({sc.BUDGET_DEGRADED_BOUND: _one_of(DEGRADED_BOUNDS, bound)}))

    def record_records_lost(self, count: int) -> None:
        """`count` task records the sink did not take (task ends are not undone: their records are gone)."""
        self.records_lost.add(count)

    def record_cache_lookup(self, result: str, tier: str | None = None) -> None:
        self.cache_lookups.add(1, self._attributes({
            sc.CACHE_RESULT: _one_of(CACHE_RESULTS, result),
            sc.CACHE_TIER: _one_of(CACHE_TIERS, tier or "none")}))

    def record_task_end(self, *, cost_usd: float, calls: int, profile: str | None = None,
                        exceeded: bool = False, reason: str = "idle", groundedness: float | None = None,
                        input_tokens: int | None = None, cached_input_tokens: int | None = None,
                        evidence_tokens: int | None = None, evidence_resent_tokens: int | None = None) -> None:
        """One task ended (explicit end or idle timeout): its total cost and call count, its last
        answer's groundedness (when graded), its LLM input and evidence tokens (None: the record has
        none; 0 is added, so a ratio of two counters reads 0, not "no data")."""
        attrs = self._attributes({sc.PROFILE: self._profiles(profile), sc.BUDGET_EXCEEDED: bool(exceeded),
                                  sc.TASK_END_REASON: _one_of(END_REASONS, reason)})
        self.task_cost.record(max(cost_usd, 0.0), attrs)
        self.task_calls.record(max(calls, 0), attrs)
        if groundedness is not None:
            self.task_groundedness.record(min(max(groundedness, 0.0), 1.0), attrs)
        for counter, n in ((self.task_input_tokens, input_tokens), (self.task_cached_input_tokens, cached_input_tokens),
                           (self.task_evidence_tokens, evidence_tokens),
                           (self.task_evidence_resent_tokens, evidence_resent_tokens)):
            if n is not None and n >= 0:
                counter.add(n, attrs)

    @staticmethod
    def _attributes(raw: Mapping[str, str | bool | None]) -> dict[str, str | bool]:
        unknown = set(raw) - ALLOWED_KEYS
        if unknown:  # a programming error, caught by the tests, never by a request
            raise ValueError(f"metric attribute keys not allowed: {sorted(unknown)}")
        return {k: v for k, v in raw.items() if v is not None}


_DIMENSIONS = frozenset(sc.DIMENSIONS) | frozenset(sc.PRINCIPAL_DIMENSIONS)


class PrometheusReader(PrometheusMetricReader):
    """A PrometheusMetricReader bound to its own registry, so several apps in one process (tests,
    embedding) never collide in prometheus_client's global REGISTRY."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        super().__init__(registry=self.registry)


def prometheus_reader() -> PrometheusReader:
    """A reader to pass to the MeterProvider (`setup.meter_provider(env, extra_readers=(r,))`)."""
    return PrometheusReader()


def render_prometheus(reader: PrometheusReader, accept: str = "") -> tuple[bytes, str]:
    """The body and content type of `GET /metrics`: Prometheus text, or OpenMetrics when the
    scraper's `Accept` header asks for it."""
    encoder, content_type = choose_encoder(accept)
    return encoder(reader.registry), content_type
