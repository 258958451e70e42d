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
    sign = sub.add_parser("sign-budget", help="print signed budget baggage that may raise a task's limits")
    sign.add_argument("--task-id", required=True)
    sign.add_argument("--key-env", default="RAGTOLL_BUDGET_HMAC_KEY", help="variable holding the HMAC key")
    sign.add_argument("--key-file", help="file holding the HMAC key (instead of --key-env)")
    sign.add_argument("--ttl", type=int, default=3600, help="seconds until the signature expires")
    sign.add_argument("limits", nargs="+", metavar="DIMENSION=VALUE", help="e.g. max_steps=40 max_cost_usd=0.5")
    _add_evaluation_commands(sub)
    args = parser.parse_args(argv)
    if args.command == "sign-budget":
        return _sign(args)
    if args.command in ("demo", "report", "recommend"):
        return _run_evaluation_command(args)
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


def _sign(args: argparse.Namespace) -> int:
    import time

    from .signing import load_key, sign_budget

    try:
        key = load_key(None if args.key_file else args.key_env, args.key_file, os.environ)
        if key is None:
            raise ConfigError(f"no HMAC key: set {args.key_env} or pass --key-file")
        limits = {}
        for item in args.limits:
            name, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"limit {item!r} is not DIMENSION=VALUE (e.g. max_steps=40)")
            limits[name] = float(value)
        print(sign_budget(args.task_id, limits, key, time.time() + args.ttl))
    except (ConfigError, ValueError) as exc:
        print(f"ragtoll: {exc}", file=sys.stderr)
        return 2
    return 0


SWITCH_INTERVAL_S = 0.0005


def _serve(args: argparse.Namespace) -> int:
    # httpx (imported by its OTel instrumentation) loads its command-line tool at import when
    # `rich` and `click` are installed, as in many images: ~3 MB of RSS a proxy never uses.
    sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
    import dataclasses

    import uvicorn
    from opentelemetry import metrics, trace
    from ragtoll.instrumentation import setup

    from .app import build_app
    from .config import Settings
    from .server import http_protocol

    settings = _load(args.config)
    assert isinstance(settings, Settings)
    server = settings.server
    if args.host or args.port:
        server = dataclasses.replace(server, host=args.host or server.host, port=args.port or server.port)
        settings = dataclasses.replace(settings, server=server)
    from ragtoll.instrumentation.metrics import prometheus_reader

    prometheus = prometheus_reader()
    tracer_provider = setup.tracer_provider(os.environ, settings.telemetry.service_name)
    meter_provider = setup.meter_provider(os.environ, settings.telemetry.service_name, extra_readers=(prometheus,))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    # Span export runs on the SDK's batch thread. When it holds the GIL as a request arrives, the
    # event loop waits out the switch interval (default 5 ms) before it runs again; 0.5 ms bounds
    # that wait. Measured (bench/bench_proxy.py harness): p99 added latency -1.1 ms, throughput -3%.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    app = build_app(settings, tracer_provider=tracer_provider, meter_provider=meter_provider, prometheus=prometheus)
    print(f"ragtoll listening on http://{server.host}:{server.port} "
          f"({len(settings.upstreams)} upstream(s), store {settings.store})", file=sys.stderr)
    uvicorn.run(
        # uvicorn's HTTP/1.1 protocol (httptools) with a response head sent with the first body bytes
        app, host=server.host, port=server.port, loop="auto", http=http_protocol(),
        access_log=server.access_log, log_level="warning", lifespan="on",
        proxy_headers=False, server_header=False, date_header=False,
    )
    tracer_provider.shutdown()
    meter_provider.shutdown()
    return 0


# ---- demo | report | recommend (issue 8); imports stay inside the handlers ----------------------


def _add_evaluation_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = sub.add_parser("demo", help="run the bundled RAG stack and agent through ragtoll, shadow vs enforced")
    demo.add_argument("--quick", action="store_true", help="a shortened workload (seconds, for smoke tests)")
    demo.add_argument("--keep-running", action="store_true", help="leave the stack and ragtoll up, print their URLs")
    demo.add_argument("--records", metavar="DIR",
                      help="keep the task records in DIR/shadow.jsonl and DIR/enforced.jsonl")
    demo.add_argument("--format", choices=("table", "json"), default="table")
    for name, helptext in (("report", "the evaluation table over task records"),
                           ("recommend", "suggested budget limits per profile from observed tasks")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("records", nargs="?", help="task records JSONL file (or use --redis-url and --stream)")
        p.add_argument("--redis-url", help="read a Redis Stream of task records instead of a file")
        p.add_argument("--stream", default="ragtoll:records", help="stream key (default: ragtoll:records)")
        if name == "report":
            p.add_argument("--by", choices=("profile", "class", "route"), default="profile")
            p.add_argument("--format", choices=("table", "json", "csv"), default="table")
            p.add_argument("--plot", metavar="FILE", help="write cost and budget-use pictures (.html or .svg)")
        else:
            p.add_argument("--percentile", type=float, default=95.0, help="percentile of correct tasks' use (95)")
            p.add_argument("--headroom", type=float, default=1.2, help="multiplier on that percentile (1.2)")


def _run_evaluation_command(args: argparse.Namespace) -> int:
    from .errors import RagtollError

    try:
        if args.command == "demo":
            try:
                from .demo.runner import main as demo_main
            except ImportError as exc:  # the demo's agent is written against the openai SDK
                print(f"ragtoll: the demo needs the demo extra ({exc.name} is missing); in the ragtoll "
                      "checkout: pip install -e '.[demo]'", file=sys.stderr)
                return 2

            return demo_main(quick=args.quick, keep_running=args.keep_running, records=args.records,
                             fmt=args.format)
        from . import report

        if args.redis_url:
            records = report.read_stream(args.redis_url, args.stream)
        elif args.records:
            records = report.read_jsonl(args.records)
        else:
            print(f"ragtoll {args.command}: give a task records file or --redis-url URL", file=sys.stderr)
            return 2
        if args.command == "recommend":
            advice = report.recommend(records, args.percentile, args.headroom)
            sys.stdout.write(report.format_advice(advice, args.percentile, args.headroom))
            return 0
        rows = report.summarize(records, args.by)
        sys.stdout.write(report.format_rows(rows, args.format, args.by))
        if args.plot:
            from . import report_plot

            fmt = "svg" if args.plot.lower().endswith(".svg") else "html"
            page = report_plot.render(records, args.by, fmt, report.format_rows(rows, "table", args.by))
            with open(args.plot, "w", encoding="utf-8") as fh:
                fh.write(page)
            print(f"wrote {args.plot}", file=sys.stderr)
        return 0
    except (RagtollError, OSError) as exc:
        print(f"ragtoll {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
