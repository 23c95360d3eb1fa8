"""`semel console`: the operator console, a web page on this machine over a cluster.

It binds 127.0.0.1 unless --host says otherwise (the console shows every topic and
transaction the given credentials may see, and with --allow-writes it can abort
them), talks to the cluster over the Kafka protocol only, and refuses writes unless
started with --allow-writes.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .main import CliError
from .wire import add_bootstrap


def add_parser(sub) -> None:
    p = sub.add_parser("console", help="a web console: brokers, topics, transactions, groups, lag",
                       description="Serve the operator console (read-only unless --allow-writes).")
    p.add_argument("--port", type=int, default=8090, help="HTTP port (default 8090)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; give 0.0.0.0 to serve others)")
    p.add_argument("--allow-writes", action="store_true",
                   help="offer the write actions: abort a transaction, reset a group's offsets, delete records "
                        "(each asks for confirmation)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between reads of the cluster (default 1)")
    p.add_argument("--spark-metrics", metavar="HOST:PORT", default=None,
                   help="the Prometheus endpoint of a Spark job's lag listener (semel.spark.metrics.LagListener)")
    p.add_argument("--check-report", metavar="DIR", type=Path, default=None,
                   help="a `semel check` output directory (its result.json and history.jsonl) for the check page")
    add_bootstrap((p,), run)


def run(args) -> int:
    from .optional import require
    for module in ("starlette", "uvicorn", "sse_starlette", "jinja2"):
        require(module, "semel console")
    import uvicorn

    from ..console.app import Extras, build
    from ..console.extras import check_report, spark_metrics
    from ..console.poller import Poller
    from .wire import connector

    if args.interval <= 0:
        raise CliError("--interval must be positive")
    if args.check_report is not None and not args.check_report.is_dir():
        raise CliError(f"--check-report: no directory at {args.check_report}")
    connect = connector(args, timeout_s=5.0)
    poller = Poller(connect, args.bootstrap, interval_s=args.interval)
    extras = Extras(spark=(lambda: spark_metrics(args.spark_metrics)) if args.spark_metrics else None,
                    check=(lambda: check_report(args.check_report)) if args.check_report else None)
    app = build(poller, connect, args.allow_writes, extras, allowed_hosts=_host_names(args.host))
    poller.start()
    print(f"semel console: http://{args.host}:{args.port}/ over {args.bootstrap}"
          f" ({'writes allowed' if args.allow_writes else 'read-only'})", file=sys.stderr, flush=True)
    if _host_names(args.host) is None:
        print(f"semel console: serving every machine that reaches {args.host}:{args.port}; the console has no "
              f"login of its own", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        poller.stop()
    return 0


def _host_names(host: str) -> list[str] | None:
    """The Host headers a console bound to `host` answers: its loopback names when bound
    to loopback (DNS rebinding gets nothing), any when the operator chose to serve others."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return ["127.0.0.1", "localhost", "[::1]", "::1"]
    return None

