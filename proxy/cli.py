"""`ragtoll serve | check-config | sign-budget | sign-outcome | principal-id | ...`: the command line.

Config errors exit with status 2 and one line naming the key, the value and what is valid.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import ConfigError
from .redact import redact


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
    sign.add_argument("--profile", help="also grant this profile (baggage ragtoll.budget.profile), even a more generous one")
    sign.add_argument("limits", nargs="*", metavar="DIMENSION=VALUE", help="e.g. max_steps=40 max_cost_usd=0.5")
    verdict = sub.add_parser("sign-outcome", help="print signed baggage recording a task's verdict")
    verdict.add_argument("--task-id", required=True)
    verdict.add_argument("--key-env", default="RAGTOLL_BUDGET_HMAC_KEY", help="variable holding the HMAC key")
    verdict.add_argument("--key-file", help="file holding the HMAC key (instead of --key-env)")
    verdict.add_argument("verdict", choices=("correct", "incorrect"))
    _add_principal_command(sub)
    _add_evaluation_commands(sub)
    args = parser.parse_args(argv)
    if args.command in ("sign-budget", "sign-outcome"):
        return _sign(args)
    if args.command == "principal-id":
        return _principal_id(args)
    if args.command in ("demo", "report", "recommend"):
        return _run_evaluation_command(args)
    if args.command == "serve":
        return _serve(args)
    return _check(args)


def _load(path: str | None) -> object:
    from . import adapters, config

    try:
        settings = config.load(os.environ, path)
        adapters.check(settings.upstreams)
        return settings
    except ConfigError as exc:
        print(f"ragtoll: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _check(args: argparse.Namespace) -> int:
    settings: Any = _load(args.config)
    upstreams = getattr(settings, "upstreams", [])
    print(f"ok: {len(upstreams)} upstream(s): " + ", ".join(f"{u.route_prefix} -> {redact(u.url)}" for u in upstreams))
    for line in _cache_summary(settings):
        print(line)
    return 0


def _cache_summary(settings: Any) -> list[str]:
    """How the evidence cache will treat each retrieval route: who it is shared with, how fresh."""
    cache, identity = settings.cache, settings.identity
    routes = [u for u in settings.upstreams if u.kind == "retrieval"]
    if not cache.enabled or not routes:
        return []
    who = {"none": "none (anonymous callers, keyed by credential)",
           "header": "header (trusted gateway; a groups-only header is a principal, a repeated one a 400)",
           "jwt": "jwt (a repeated Authorization header is a 400)"}[identity.mode]
    lines = [f"evidence cache: identity {who}"]
    if cache.embedder != "none":
        from .cache.calibration import shipped

        model = shipped() if cache.max_error < 1 else None
        lines.append(f"  semantic hits: similarity >= {cache.similarity:g}, the vetoes, then "
                     + (f"served when the estimated chance of a wrong hit is <= {cache.max_error:g} "
                        f"(cache.max_error; the audit of {cache.audit_fraction:g} of hits tightens a route's "
                        "bound when its live error rate drifts above it)" if model is not None else
                        "the vetoes alone (cache.max_error 1, or no calibration shipped)"))
    for u in routes:
        scoped = u.cache.filters_by_caller if u.cache.filters_by_caller is not None else identity.mode != "none"
        bound = u.cache.max_staleness_s or cache.max_staleness_s
        probe = f"probe {u.cache.probe.method} {u.cache.probe.path}" if u.cache.probe else "no probe"
        lines.append(f"  {u.route_prefix}: {'per caller view' if scoped else 'shared by ACL'}, "
                     f"served up to {bound:g} s old without a confirmed version, {probe}")
    return lines


def _sign(args: argparse.Namespace) -> int:
    import time

    from .core.signing import sign_budget, sign_outcome
    from .secrets import hmac_key

    try:
        key = hmac_key(os.environ, None if args.key_file else args.key_env, args.key_file)
        if key is None:
            raise ConfigError(f"no HMAC key: set {args.key_env} or pass --key-file")
        if args.command == "sign-outcome":
            print(sign_outcome(args.task_id, args.verdict == "correct", key))
            return 0
        limits = {}
        for item in args.limits:
            name, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(f"limit {item!r} is not DIMENSION=VALUE (e.g. max_steps=40)")
            limits[name] = float(value)
        print(sign_budget(args.task_id, limits, key, time.time() + args.ttl, profile=args.profile))
    except (ConfigError, ValueError) as exc:
        print(f"ragtoll: {exc}", file=sys.stderr)
        return 2
    return 0


def _add_principal_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pid = sub.add_parser("principal-id", help="print the principal id (for principals.overrides) of a subject, "
                                              "credential or address")
    pid.add_argument("--subject", help="a verified identity: the JWT `sub`, or the gateway's subject header")
    pid.add_argument("--tenant", default="", help="its tenant (JWT tenant claim / tenant header), if any")
    for header in ("authorization", "api-key", "x-api-key", "x-chroma-token"):
        pid.add_argument(f"--{header}", metavar="VALUE",
                         help=f"the {header} header the caller sends ('-': read it from stdin); give the one "
                              "header the route's upstream authenticates by")
    pid.add_argument("--address", help="the client address (callers that send no credential)")


def _principal_id(args: argparse.Namespace) -> int:
    """The id the proxy gives such a caller (core/principals.py): subject, else credential, else address."""
    from .core.principals import canonical_credential, principal_id

    names = ("authorization", "api-key", "x-api-key", "x-chroma-token")
    headers = {h: getattr(args, h.replace("-", "_")) or "" for h in names}
    for h, value in headers.items():
        if value == "-":
            headers[h] = sys.stdin.readline().rstrip("\r\n")
    given = [h for h in names if headers[h]]
    if len(given) > 1:
        print("ragtoll: give one credential header, the one the route's upstream authenticates by "
              "(its adapter's first; docs: Task identity)", file=sys.stderr)
        return 2
    if not (args.subject or given or args.address):
        print("ragtoll: give --subject, a credential (--authorization, --api-key, --x-api-key, --x-chroma-token) "
              "or --address", file=sys.stderr)
        return 2
    print(principal_id(args.subject, args.tenant, canonical_credential(headers, names), args.address or ""))
    return 0


def served_app(settings: Any) -> tuple[Any, Any, Any]:
    """The app `ragtoll serve` runs, with tracing and metrics from the OTEL_* variables and `/metrics`:
    (app, tracer_provider, meter_provider); the caller shuts the providers down."""
    from opentelemetry import metrics, trace
    from ragtoll.instrumentation import setup
    from ragtoll.instrumentation.metrics import prometheus_reader

    from .app import build_app

    prometheus = prometheus_reader()
    tracer_provider = setup.tracer_provider(os.environ, settings.telemetry.service_name,
                                            export=settings.telemetry.export)
    meter_provider = setup.meter_provider(os.environ, settings.telemetry.service_name, extra_readers=(prometheus,))
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    app = build_app(settings, tracer_provider=tracer_provider, meter_provider=meter_provider, prometheus=prometheus)
    return app, tracer_provider, meter_provider


def _serve(args: argparse.Namespace) -> int:
    import dataclasses

    import uvloop

    from .config import Settings
    from .server import metrics_listener, raise_open_files_limit, serve

    settings = _load(args.config)
    assert isinstance(settings, Settings)
    server = settings.server
    if args.host or args.port:
        server = dataclasses.replace(server, host=args.host or server.host, port=args.port or server.port)
        settings = dataclasses.replace(settings, server=server)
    # a descriptor per client connection, per upstream connection, and some to spare
    raise_open_files_limit(server.max_connections + sum(u.limits.max_connections for u in settings.upstreams) + 256)
    app, tracer_provider, meter_provider = served_app(settings)
    metrics_at = f", metrics on http://{server.metrics_host}:{server.metrics_port}/metrics" if server.metrics_port else ""
    app.on_started = lambda: print(
        f"ragtoll listening on http://{server.host}:{server.port} "
        f"({len(settings.upstreams)} upstream(s), store {redact(settings.store)}{metrics_at})", file=sys.stderr, flush=True)
    where = f"{server.host}:{server.port}"
    try:
        with contextlib.ExitStack() as listeners:
            if server.metrics_port is not None:
                where = f"{server.metrics_host}:{server.metrics_port} (server.metrics_port)"
                listeners.enter_context(metrics_listener(app.prometheus.registry, server.metrics_host,
                                                         server.metrics_port))
                where = f"{server.host}:{server.port}"
            uvloop.run(serve(app, server, on_signal=app.drain))
    except OSError as exc:  # the port is taken, the address does not exist, ...
        print(f"ragtoll: cannot listen on {where}: {exc.strerror or exc}", file=sys.stderr)
        return 3
    finally:
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
    demo.add_argument("--plot", metavar="FILE",
                      help="write the shadow-vs-enforced figure (.png, .svg or .pdf; needs matplotlib)")
    report = sub.add_parser("report", help="the evaluation table over task records; several files compare runs")
    report.add_argument("records", nargs="*", metavar="FILE",
                        help="task records JSONL files, one run each (or use --redis-url and --stream)")
    report.add_argument("--label", action="append", metavar="NAME",
                        help="name of the run, once per file in order (default: the file's stem)")
    report.add_argument("--by", choices=("profile", "class", "route"), default="profile")
    report.add_argument("--format", choices=("table", "json", "csv"), default="table")
    report.add_argument("--plot", metavar="FILE",
                        help="write the comparison figure (.png, .svg or .pdf; the plot extra: matplotlib)")
    report.add_argument("--config", metavar="FILE", help="ragtoll config whose profile limits the figure draws")
    report.add_argument("--top", type=int, default=8, metavar="N", help="costliest tasks in the figure (8)")
    recommend = sub.add_parser("recommend", help="budget limits per profile that cut no correct recorded task")
    recommend.add_argument("records", nargs="?", help="task records JSONL file (or use --redis-url and --stream)")
    recommend.add_argument("--percentile", type=float, default=100.0,
                           help="of what tasks not judged wrong used (100: the most; lower lists the correct tasks it cuts)")
    recommend.add_argument("--headroom", type=float, default=1.0, help="multiplier on that value, >= 1 (1)")
    recommend.add_argument("--by", choices=("profile", "class"), default="profile",
                           help="limits per profile, or a profile per query class (mapped under classes:)")
    recommend.add_argument("--latency", action="store_true",
                           help="also propose max_latency_ms (machine-dependent; at least p99 x 3 of the durations)")
    recommend.add_argument("--no-progress", dest="progress", action="store_false",
                           help="leave out the progress policy (stall and fruitless limits, finish, empty)")
    for p in (report, recommend):
        p.add_argument("--redis-url", help="read a Redis Stream of task records instead of a file")
        p.add_argument("--stream", default="ragtoll:records", help="stream key (default: ragtoll:records)")


def _plot_unavailable(command: str, path: str) -> bool:
    """Print why `--plot` cannot work (no matplotlib, or a format it does not write); True then."""
    from .errors import RagtollError

    try:
        from .tools import report_plot
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise
        print(f"ragtoll {command}: --plot needs matplotlib, from the plot extra (from a checkout: pip install -e '.[plot]')",
              file=sys.stderr)
        return True
    try:
        report_plot.plot_format(path)
    except RagtollError as exc:
        print(f"ragtoll {command}: {exc}", file=sys.stderr)
        return True
    return False


def _run_evaluation_command(args: argparse.Namespace) -> int:
    from .errors import RagtollError

    plot = getattr(args, "plot", None)
    if plot and _plot_unavailable(args.command, plot):  # before minutes of demo or a long read
        return 2
    try:
        if args.command == "demo":
            try:
                from .tools.demo.runner import main as demo_main
            except ImportError as exc:  # the demo's agent is written against the openai SDK
                print(f"ragtoll: the demo needs the demo extra ({exc.name} is missing); in the ragtoll "
                      "checkout: pip install -e '.[demo]'", file=sys.stderr)
                return 2

            return demo_main(quick=args.quick, keep_running=args.keep_running, records=args.records,
                             fmt=args.format, plot=plot)
        from .tools import report, report_compare

        # report takes several files (one run each), recommend one
        files = args.records if args.command == "report" else [args.records] if args.records else []
        if not files and not args.redis_url:
            print(f"ragtoll {args.command}: give a task records file or --redis-url URL", file=sys.stderr)
            return 2
        profiles = None
        if args.command == "report" and args.config:  # a bad config fails before any output
            from . import config

            settings = config.load({}, args.config)
            profiles = {name: p.limits() for name, p in settings.budgets.profiles.items()}
        runs = []
        if args.redis_url:
            runs.append((args.stream, report.read_stream(args.redis_url, args.stream)))
        runs += [(path, report.read_jsonl(path)) for path in files]
        if args.command == "recommend":
            records = [r for _, recs in runs for r in recs]
            from .tools import recommend

            advice = recommend.recommend(records, args.percentile, args.headroom, args.latency, args.by,
                                         args.progress)
            sys.stdout.write(recommend.format_advice(advice, args.percentile, args.headroom))
            return 0
        labels = report_compare.run_labels([source for source, _ in runs], args.label)
        compared = [report_compare.Run(label, recs) for label, (_, recs) in zip(labels, runs, strict=True)]
        if len(compared) == 1:  # one run: the table as it always was, no run column
            rows = report.summarize(compared[0].records, args.by)
            sys.stdout.write(report.format_rows(rows, args.format, args.by))
        else:
            sys.stdout.write(report_compare.format_runs(compared, args.format, args.by))
        if plot:
            from .tools import report_plot

            report_plot.render(compared, args.by, plot, profiles=profiles, top=args.top)
            print(f"wrote {plot}", file=sys.stderr)
        return 0
    except (RagtollError, OSError) as exc:
        print(f"ragtoll {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
