"""`ragtoll serve | check-config`: the command line.

Config errors exit with status 2 and one line naming the key, the value and what is valid.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .errors import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ragtoll", description="Budgets and traces for agentic RAG calls.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML config file (default: $RAGTOLL_CONFIG, else embedded defaults)")
    serve.add_argument("--host", help="override server.host")
    serve.add_argument("--port", type=int, help="override server.port")
    check = sub.add_parser("check-config", help="validate a config file and exit")
    check.add_argument("config", nargs="?", help="YAML config file (default: $RAGTOLL_CONFIG)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return _check(args)


def _load(path: str | None) -> object:
    from . import config

    try:
        return config.load(os.environ, path)
    except ConfigError as exc:
        print(f"ragtoll: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _check(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    upstreams = getattr(settings, "upstreams", [])
    print(f"ok: {len(upstreams)} upstream(s): " + ", ".join(f"{u.route_prefix} -> {u.url}" for u in upstreams))
    return 0


def _serve(args: argparse.Namespace) -> int:
    import dataclasses

    import uvicorn
    from opentelemetry import metrics, trace

    from ..instrumentation import setup
    from .app import build_app
    from .config import Settings

    settings = _load(args.config)
    assert isinstance(settings, Settings)
    server = settings.server
    if args.host or args.port:
        server = dataclasses.replace(server, host=args.host or server.host, port=args.port or server.port)
        settings = dataclasses.replace(settings, server=server)
    tracer_provider = setup.tracer_provider(os.environ, settings.telemetry.service_name)
    meter_provider = setup.meter_provider(os.environ, settings.telemetry.service_name)
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    app = build_app(settings, tracer_provider=tracer_provider, meter_provider=meter_provider)
    print(f"ragtoll listening on http://{server.host}:{server.port} "
          f"({len(settings.upstreams)} upstream(s), store {settings.store})", file=sys.stderr)
    uvicorn.run(
        app, host=server.host, port=server.port, loop="auto", http="auto",
        access_log=server.access_log, log_level="warning", lifespan="on",
        proxy_headers=False, server_header=False, date_header=False,
    )
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
