"""`semel cluster start`: etcd and N brokers on this machine, until Ctrl-C/SIGTERM."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

from .main import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("cluster", help="run a local cluster (etcd + brokers)")
    csub = p.add_subparsers(dest="action", metavar="ACTION")
    csub.required = True
    s = csub.add_parser("start", help="start etcd and --nodes brokers in the foreground; Ctrl-C stops them all")
    s.add_argument("--nodes", type=int, default=3, help="number of brokers (default 3)")
    s.add_argument("--data-dir", required=True, type=Path, help="etcd/ and broker-N/ go under here")
    s.add_argument("--base-port", type=int, default=9092, help="broker N listens on base-port + N (default 9092)")
    s.add_argument("--etcd-port", type=int, default=2379, help="etcd client port (peer port is this + 1)")
    s.add_argument("--lease-ttl-s", type=int, default=6, help="broker session length in etcd (default 6)")
    s.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for every `semel broker start` (repeatable, e.g. --broker-arg=--flush-mode=never)")
    s.set_defaults(func=run)


def run(args) -> int:
    from ..cluster.etcd import EtcdProcess
    from .process import SemelBroker
    if args.nodes < 1:
        raise CliError("--nodes must be at least 1")
    if not 1 <= args.base_port <= 65535 - args.nodes or not 1 <= args.etcd_port < 65535:
        raise CliError("--base-port/--etcd-port out of range")
    if args.lease_ttl_s < 2:
        raise CliError("--lease-ttl-s must be at least 2")
    try:
        args.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot use data dir {args.data_dir}: {exc.strerror}") from None
    etcd = EtcdProcess(args.data_dir / "etcd", args.etcd_port, args.etcd_port + 1,
                       log_path=args.data_dir / "etcd.log")
    brokers = [SemelBroker(args.data_dir / f"broker-{n}", args.base_port + n, log_path=args.data_dir / f"broker-{n}.log",
                           extra_args=["--node-id", str(n), "--metadata", etcd.bootstrap,
                                       "--lease-ttl-s", str(args.lease_ttl_s), *args.broker_arg])
               for n in range(args.nodes)]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        _start(etcd, brokers)
        print(f"etcd on {etcd.bootstrap} (log {etcd.log_path})", flush=True)
        for n, b in enumerate(brokers):
            print(f"broker {n} on {b.bootstrap} (data {b.data_dir})", flush=True)
        print("bootstrap: " + ",".join(b.bootstrap for b in brokers), flush=True)
        while not stop.wait(1):
            dead = [n for n, b in enumerate(brokers) if not b.alive()]
            if dead and not etcd.alive():
                raise CliError("etcd and brokers exited; see the logs under " + str(args.data_dir))
    finally:
        for b in brokers:    # brokers first: each leaves the cluster (revokes its lease) while etcd is up
            b.stop()
            b.close()
        etcd.stop()
        etcd.close()
    print("cluster stopped", flush=True)
    return 0


def _start(etcd, brokers) -> None:
    try:
        etcd.start(30)
    except (OSError, RuntimeError, TimeoutError) as exc:
        raise CliError(f"cannot start etcd on port {etcd.port}: {exc} (see {etcd.log_path})") from None
    for n, b in enumerate(brokers):
        try:
            b.start(60)
        except (OSError, RuntimeError, TimeoutError) as exc:
            raise CliError(f"cannot start broker {n} on port {b.port}: {exc} (see {b.log_path})") from None
