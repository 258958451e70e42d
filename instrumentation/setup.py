"""Tracer and meter providers from the standard `OTEL_*` variables.

With no exporter configured nothing is exported and nothing errors. OTLP over HTTP/protobuf is the
default protocol; `OTEL_EXPORTER_OTLP_PROTOCOL=grpc` switches to gRPC. Jaeger ingests either. Spans
are exported from the SDK's batch thread in this process by default (`telemetry.export: thread`), or
from a child process (`process`, export.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from .export import ProcessSpanExporter

DEFAULT_EXPORT_BATCH = 64
DEFAULT_EXPORT_DELAY_MS = 200
EXPORT_MODES = ("process", "thread")


def _enabled(env: Mapping[str, str], signal: str) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    exporter = env.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp").lower()
    if exporter in ("none", ""):
        return False
    return bool(
        env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def _protocol(env: Mapping[str, str], signal: str) -> str:
    return env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )


def _endpoint(env: Mapping[str, str], signal: str, grpc: bool) -> str:
    """The signal's endpoint as the OTLP spec derives it (a signal-specific one is used as-is)."""
    specific = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT")
    if specific:
        return specific
    base = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
    return base if grpc else f"{base.rstrip('/')}/v1/{signal}"


def _resource(env: Mapping[str, str], service_name: str) -> Resource:
    base = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
    return base.merge(OTELResourceDetector().detect()) if env.get("OTEL_RESOURCE_ATTRIBUTES") else base


def _session() -> Any:
    """The OTLP/HTTP exporters' requests session, without `trust_env`: a session that trusts the
    environment looks up ~/.netrc and the proxy variables again for every export (measured: about a
    tenth of the export thread's time), and ragtoll reads no proxy variables anywhere."""
    import requests

    session = requests.Session()
    session.trust_env = False
    return session


def span_exporter(env: Mapping[str, str]) -> SpanExporter | None:
    """The OTLP span exporter the `OTEL_*` variables ask for, or None."""
    if not _enabled(env, "traces"):
        return None
    if _protocol(env, "traces") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=_endpoint(env, "traces", grpc=True))
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=_endpoint(env, "traces", grpc=False), session=_session())


def tracer_provider(env: Mapping[str, str], service_name: str = "ragtoll", *, export: str = "thread"
                    ) -> TracerProvider:
    """The provider, with a batch processor when an exporter is configured. `export`: `thread` (the
    default, `telemetry.export`) encodes and sends on the SDK's batch thread here, holding this
    process's GIL while it encodes; `process` hands each batch to a child process that encodes and
    sends it (export.py)."""
    if export not in EXPORT_MODES:
        raise ValueError(f"export must be one of {EXPORT_MODES}, not {export!r}")
    provider = TracerProvider(resource=_resource(env, service_name))
    exporter = span_exporter(env) if export == "thread" or not _enabled(env, "traces") else \
        ProcessSpanExporter(env, provider.resource)
    if exporter is not None:
        # Small batches often: whatever this process does per batch (encoding in `thread` mode,
        # copying in `process` mode) holds the GIL, and the SDK's 512-span batches every 5 s stalled
        # requests for ~5 ms at p99 (bench/bench_proxy.py). The standard OTEL_BSP_* variables still win.
        batch = None if "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" in env else DEFAULT_EXPORT_BATCH
        delay = None if "OTEL_BSP_SCHEDULE_DELAY" in env else DEFAULT_EXPORT_DELAY_MS
        provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=batch,
                                                       schedule_delay_millis=delay))
    return provider


def meter_provider(
    env: Mapping[str, str], service_name: str = "ragtoll", extra_readers: tuple[MetricReader, ...] = ()
) -> MeterProvider:
    readers: list[MetricReader] = list(extra_readers)
    if _enabled(env, "metrics"):
        if _protocol(env, "metrics") == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcM

            readers.append(PeriodicExportingMetricReader(GrpcM(endpoint=_endpoint(env, "metrics", grpc=True))))
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpM

            readers.append(PeriodicExportingMetricReader(HttpM(endpoint=_endpoint(env, "metrics", grpc=False),
                                                               session=_session())))
    return MeterProvider(metric_readers=readers, resource=_resource(env, service_name))
