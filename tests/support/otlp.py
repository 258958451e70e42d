"""A loopback OTLP/HTTP receiver that decodes what exporters send (what Jaeger would ingest)."""

from __future__ import annotations

import gzip
import threading
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from .asgi import read_body


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.spans: list[dict[str, Any]] = []
        self.metric_names: set[str] = set()
        self.resources: list[dict[str, Any]] = []
        self.trace_requests: list[ExportTraceServiceRequest] = []  # as decoded, for exact comparisons

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if body is None:
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if scope["path"] == "/v1/traces":
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            with self.lock:
                self.trace_requests.append(req)
                for rs in req.resource_spans:
                    resource = {a.key: _value(a.value) for a in rs.resource.attributes}
                    self.resources.append(resource)
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            self.spans.append({
                                "name": s.name, "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(), "kind": s.kind,
                                "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                                "attributes": {a.key: _value(a.value) for a in s.attributes},
                                "events": [{"name": e.name, "attributes": {a.key: _value(a.value) for a in e.attributes}}
                                           for e in s.events],
                                "scope": ss.scope.name, "resource": resource,
                            })
        elif scope["path"] == "/v1/metrics":
            req = ExportMetricsServiceRequest()
            req.ParseFromString(body)
            with self.lock:
                for rm in req.resource_metrics:
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            self.metric_names.add(m.name)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-protobuf")]})
        await send({"type": "http.response.body", "body": b""})
