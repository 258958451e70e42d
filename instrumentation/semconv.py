"""Attribute, event and metric names: the span contract in one place.

`gen_ai.*` are spelled as the OpenTelemetry GenAI semantic conventions spell them; `ragtoll.*`
are ragtoll's own. Imports nothing.
"""

from __future__ import annotations

# --- OpenTelemetry GenAI conventions ------------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHED_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_USAGE_CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_DATA_SOURCE_ID = "gen_ai.data_source.id"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"  # metric attribute: input | output

HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
HTTP_ROUTE = "http.route"
URL_PATH = "url.path"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"

# --- ragtoll ------------------------------------------------------------------------------------
TASK_ID = "ragtoll.task.id"
TASK_SOURCE = "ragtoll.task.source"
TASK_NOTES = "ragtoll.task.notes"
TASK_MATCH = "ragtoll.task.match"  # conversation sources: the rule that tied the call to its conversation
TASK_CONFIDENCE = "ragtoll.task.confidence"  # conversation sources: how sure that rule is (1.0: exact)
TASK_END_REASON = "ragtoll.task.end_reason"  # explicit | idle | call (a per-call task) | shutdown
TASK_CALLS = "ragtoll.task.calls"  # ragtoll.task summary span: calls of the task
# ragtoll.task summary span: the task record's totals, `ragtoll.task.<record key>`
TASK_TOTALS = ("steps", "retrieval_calls", "unique_queries", "rerank_calls", "context_tokens",
               "completion_tokens", "cache_hits", "duration_ms", "chunks_seen", "stalled_retrievals")
TASK_CLASS = "ragtoll.task.class"
TASK_ROUTE = "ragtoll.task.route"
TASK_CORRECT = "ragtoll.task.correct"  # the outcome posted with the end call, when there is one
TASK_GROUNDEDNESS = "ragtoll.task.groundedness"  # the last answer's groundedness (task record), when graded


def task_total(key: str) -> str:
    return f"ragtoll.task.{key}"
UPSTREAM = "ragtoll.upstream"
UPSTREAM_KIND = "ragtoll.upstream.kind"
PROFILE = "ragtoll.budget.profile"
PROFILE_SOURCE = "ragtoll.budget.profile.source"
QUERY_CLASS = "ragtoll.query.class"
QUERY_CLASS_REASON = "ragtoll.query.class.reason"
BUDGET_MODE = "ragtoll.budget.mode"
BUDGET_EXCEEDED = "ragtoll.budget.exceeded"
BUDGET_EXCEEDED_DIMENSION = "ragtoll.budget.exceeded.dimension"
BUDGET_WOULD_REJECT = "ragtoll.budget.would_reject"
BUDGET_STREAM_CUT = "ragtoll.budget.stream_cut"
BUDGET_FINISHED = "ragtoll.budget.finished"  # on_exhausted: finish: the limit the call went past, tools disabled
# worst-case admission: the output cap (tokens per answer) ragtoll wrote into the call, the task having less left
BUDGET_OUTPUT_CAP = "ragtoll.budget.output_cap"
# a stream: output tokens its reservation held at the end (reservation plus extensions), and how many extensions
BUDGET_STREAM_HELD = "ragtoll.budget.stream.held_tokens"
BUDGET_STREAM_EXTENSIONS = "ragtoll.budget.stream.extensions"
BUDGET_NOTES = "ragtoll.budget.notes"  # why budget baggage or a profile request was ignored
BUDGET_SCOPE = "ragtoll.budget.scope"  # task | principal: whose budget refused (or would refuse) the call
PRINCIPAL_ID = "ragtoll.principal.id"  # sub:<subject>, key:<credential hash> or addr:<address>
PRINCIPAL_NEW_TASK = "ragtoll.principal.new_task"  # this call started a task of the principal


# The budget dimensions, in the order spans and headers list them: the one definition, which the
# proxy's config, the agent hook and the metrics' label allow-list all read.
DIMENSIONS = (
    "max_steps",
    "max_calls",
    "max_retrieval_calls",
    "max_unique_queries",
    "max_rerank_calls",
    "max_context_tokens",
    "max_prompt_tokens",
    "max_completion_tokens",
    "max_cost_usd",
    "max_latency_ms",
    "max_stalled_retrievals",
    "max_fruitless_retrievals",
)
# The limits of a principal across its tasks (`principals:`), rejected with scope `principal`.
PRINCIPAL_DIMENSIONS = ("max_new_tasks_per_minute", "max_concurrent_tasks", "max_cost_usd_per_hour",
                        "max_cost_usd_per_day")


def budget_limit(dimension: str) -> str:
    return f"ragtoll.budget.{dimension}.limit"


def budget_used(dimension: str) -> str:
    return f"ragtoll.budget.{dimension}.used"


def budget_remaining(dimension: str) -> str:
    """Only where it is not max(0, limit - used): the per-call prompt ceiling, and tokens and cost held
    by reservations in flight (proxy/stages/budget_span.py); elsewhere a reader computes it."""
    return f"ragtoll.budget.{dimension}.remaining"


COST_USD = "ragtoll.cost.usd"
COST_ESTIMATED = "ragtoll.cost.estimated"
PROMPT_TOKENS_ESTIMATE = "ragtoll.usage.input_tokens.estimate"
PROMPT_TOKENS_ESTIMATED = "ragtoll.usage.input_tokens.estimated"
PROMPT_TOKENS_DELTA = "ragtoll.usage.input_tokens.estimate_error"  # upstream count minus ragtoll's estimate
CACHE_RESULT = "ragtoll.cache.result"
CACHE_HIT = "ragtoll.cache.hit"
CACHE_TIER = "ragtoll.cache.tier"
CACHE_SIMILARITY = "ragtoll.cache.similarity"
CACHE_REASON = "ragtoll.cache.reason"
CACHE_LOOKUP_MS = "ragtoll.cache.lookup_ms"
CACHE_THRESHOLD = "ragtoll.cache.threshold"
CACHE_VIEW = "ragtoll.cache.view"  # the principal-view rule a hit passed: shared | inside | owner
CACHE_FRESHNESS = "ragtoll.cache.freshness"  # why a hit was fresh enough: young | confirmed | probed | inflight
CACHE_AGE_S = "ragtoll.cache.age_s"  # seconds since the upstream answered with a hit's evidence
CACHE_VERSION = "ragtoll.cache.version"  # the source (partition) version a lookup used
CACHE_WAITED_MS = "ragtoll.cache.waited_ms"  # time a duplicate waited for the retrieval in flight
CACHE_AUDIT_SAME_TOP = "ragtoll.cache.audit.same_top"
CACHE_AUDIT_OVERLAP = "ragtoll.cache.audit.overlap"
CACHE_AUDIT_AGREES = "ragtoll.cache.audit.agrees"
CACHE_MAX_ERROR = "ragtoll.cache.max_error"  # the route's error bound (cache.max_error, tightened by the audit)
CACHE_P_WRONG = "ragtoll.cache.p_wrong"  # the calibrated estimate of a semantic candidate's chance of being wrong
EVIDENCE_NEW_CHUNKS = "ragtoll.evidence.new_chunks"
EVIDENCE_STALLED = "ragtoll.evidence.stalled_retrievals"  # consecutive fruitless retrievals (progress verdicts)
EVIDENCE_FRUITLESS = "ragtoll.evidence.fruitless_retrievals"  # fruitless retrievals in the task so far
PROGRESS_PREFIX = "ragtoll.progress."  # the verdict on a retrieval: fruitful, reason, novelty, new_top, ...
EVIDENCE_PROMPT_TOKENS = "ragtoll.evidence.prompt_tokens"  # prompt tokens that are retrieved evidence
EVIDENCE_DUPLICATE_TOKENS = "ragtoll.evidence.duplicate_tokens"  # ... already sent in an earlier prompt
# an LLM answer (text, no tool call) against the chunks its task retrieved (proxy/core/grounding.py)
EVIDENCE_GROUNDEDNESS = "ragtoll.evidence.groundedness"  # supported claims / claims
EVIDENCE_CLAIMS = "ragtoll.evidence.claims"
EVIDENCE_CLAIMS_SUPPORTED = "ragtoll.evidence.claims_supported"
EVIDENCE_CITATIONS = "ragtoll.evidence.citations"  # chunk ids the answer cites
EVIDENCE_CITATIONS_RETRIEVED = "ragtoll.evidence.citations_retrieved"  # ... that the task retrieved
# the context economy (proxy/stages/context.py): what ragtoll rewrote in an LLM request, and what it earned
CONTEXT_CACHE_KEY = "ragtoll.context.cache_key"  # the prompt_cache_key mode ragtoll set: task | system
CONTEXT_BREAKPOINTS_ADDED = "ragtoll.context.breakpoints_added"  # cache_control blocks ragtoll added
CONTEXT_BREAKPOINTS_CLIENT = "ragtoll.context.breakpoints_client"  # ... the client's own (never moved)
CONTEXT_CHUNKS_REFERENCED = "ragtoll.context.chunks_referenced"  # chunks sent as a reference to an earlier copy
CONTEXT_CHARS_SAVED = "ragtoll.context.chars_saved"  # characters of chunk text not sent again
CONTEXT_REWRITE_US = "ragtoll.context.rewrite_us"  # microseconds the rewrites took
CONTEXT_DEPTH_KEPT = "ragtoll.context.depth.kept"  # retrieval results passed on (adaptive depth)
CONTEXT_DEPTH_RETURNED = "ragtoll.context.depth.returned"  # ... of those the source returned
CONTEXT_DEPTH_REASON = "ragtoll.context.depth.reason"  # gap | floor | weak-low | weak-tie | widened
CONTEXT_DEPTH_WIDENED_FROM = "ragtoll.context.depth.widened_from"  # the top_k a widened search asked for
CONTEXT_BUDGET_NOTE = "ragtoll.context.budget_note"  # characters of the budget note appended to the prompt
CONTEXT_CACHED_SHARE = "ragtoll.context.cached_input_share"  # cache reads / input tokens (upstream usage)
QUERY_NEW = "ragtoll.query.new"
# the length of a query past server.max_query_chars: keyed by hash, never read further
QUERY_OVERSIZED = "ragtoll.query.oversized_chars"
PARSE_ERROR = "ragtoll.parse_error"
RESPONSE_UNREAD = "ragtoll.response.unread"  # why ragtoll stopped reading a response (it passed on unread)
DEGRADED = "ragtoll.degraded"
# what bounded a call admitted while the budget store's answer was unknown: `local` (the replica's
# local ledger, same limits per task) or `none` (nothing: forwarded unbudgeted)
BUDGET_DEGRADED_BOUND = "ragtoll.budget.degraded.bound"
OUTCOME = "ragtoll.outcome"
STREAM = "ragtoll.stream"
BYTES_OUT = "ragtoll.response.bytes"

# content capture (telemetry.capture_content; off by default): JSON lists of texts, size-limited
CONTENT_PROMPT = "gen_ai.input.messages"
CONTENT_COMPLETION = "gen_ai.output.messages"
CONTENT_QUERY = "ragtoll.retrieval.query"
CONTENT_CHUNKS = "ragtoll.retrieval.documents"

# --- events -------------------------------------------------------------------------------------
EVENT_CHARGE = "ragtoll.budget.charge"
EVENT_WARNING = "ragtoll.budget.warning"
EVENT_EXCEEDED = "ragtoll.budget.exceeded"
EVENT_DEGRADED = "ragtoll.store.degraded"
EVENT_CACHE_AUDIT = "ragtoll.cache.audit"

# --- span names ---------------------------------------------------------------------------------
TASK_SPAN = "ragtoll.task"

# --- metrics ------------------------------------------------------------------------------------
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
METRIC_CALLS = "ragtoll.calls"
METRIC_REJECTIONS = "ragtoll.rejections"
METRIC_CACHE_LOOKUPS = "ragtoll.cache.lookups"
METRIC_CACHE_AUDITS = "ragtoll.cache.audits"
METRIC_CACHE_AUDIT_ERROR_RATE = "ragtoll.cache.audit.error_rate"
METRIC_CACHE_MAX_ERROR = "ragtoll.cache.max_error"
METRIC_COST = "ragtoll.cost"
METRIC_OVERHEAD = "ragtoll.proxy.overhead"
METRIC_TASK_COST = "ragtoll.task.cost"
METRIC_TASK_CALLS = "ragtoll.task.calls"
# at each task end, from its record (Prometheus: ragtoll_task_groundedness_bucket/_sum/_count,
# ragtoll_task_input_tokens_total, ..._cached_input_tokens_total, ..._evidence_tokens_total,
# ..._evidence_resent_tokens_total)
METRIC_TASK_GROUNDEDNESS = "ragtoll.task.groundedness"  # the last answer's share of supported claims
METRIC_TASK_INPUT_TOKENS = "ragtoll.task.input_tokens"  # LLM input tokens (the record's context_tokens)
METRIC_TASK_CACHED_INPUT_TOKENS = "ragtoll.task.cached_input_tokens"  # ... of those, the provider's cache reads
METRIC_TASK_EVIDENCE_TOKENS = "ragtoll.task.evidence_tokens"  # retrieved evidence in the tasks' prompts
METRIC_TASK_EVIDENCE_RESENT_TOKENS = "ragtoll.task.evidence_resent_tokens"  # ... already sent before
# calls admitted while the budget store's answer was unknown (Prometheus:
# ragtoll_budget_degraded_admissions_total), by BUDGET_DEGRADED_BOUND
METRIC_BUDGET_DEGRADED_ADMISSIONS = "ragtoll.budget.degraded_admissions"
METRIC_TASK_RECORDS_LOST = "ragtoll.task.records_lost"  # task records the sink did not take
