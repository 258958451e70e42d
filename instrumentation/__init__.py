"""ragtoll.instrumentation: telemetry shared by the proxy and the agent side.

`semconv` names every attribute and metric; `setup` builds providers from `OTEL_*` settings.
"""
