"""`semel check`: run the exactly-once workload against a broker and check the history.

Exit status: 0 when no anomaly was found, 1 when some were, 2 on a usage error.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from .main import CliError

MODES = {
    # mode: (default duration s, setup/finish/fence/drain budgets s, longest duration allowed)
    # ci, worst case (a broker that stops answering): 20 + 60 + 20 + 10 + 25 + 43 s < 3 minutes.
    "ci": (60.0, (20.0, 20.0, 25.0, 40.0), 60.0),
    "long": (1800.0, (60.0, 60.0, 60.0, 120.0), None),
}
DEFAULT_FAULTS_MANAGED = {"ci": "broker-kill,client-kill,client-pause",
                          "long": "broker-kill,client-kill,client-pause,disk-full,slow-fsync"}
DEFAULT_FAULTS_REMOTE = "client-kill,client-pause"
DEFAULT_FAULTS_CLUSTER = "leader-kill,follower-kill,broker-pause,client-kill,client-pause"


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="find exactly-once anomalies in any Kafka-compatible broker",
                       description="Transactional producers and consumers run a seeded workload with "
                                   "faults; the history is checked for aborted reads, lost writes, "
                                   "duplicates, skips, torn transactions, G0/G1c cycles and more.")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--bootstrap", metavar="HOST:PORT", help="a broker somebody else runs (client faults only)")
    target.add_argument("--broker-cmd", metavar="TEMPLATE",
                        help="start the broker ourselves so it can be killed and restarted; "
                             "{port}, {data} and {host} are filled in")
    target.add_argument("--spawn-semel", action="store_true",
                        help="start semel's own broker (same as --broker-cmd 'semel broker start "
                             "--data-dir {data} --port {port}')")
    target.add_argument("--analyze", metavar="HISTORY", type=Path,
                        help="only check an existing history.jsonl")
    target.add_argument("--cluster", action="store_true",
                        help="start a local semel cluster (etcd and --nodes brokers) and check it with "
                             "RF3 topics, min.insync.replicas 2, partition leaders killed and brokers paused")
    p.add_argument("--nodes", type=int, default=3, help="brokers of the --cluster (default 3)")
    p.add_argument("--lease-ttl-s", type=int, default=3,
                   help="--cluster brokers' session length; half the pauses outlast it (default 3)")
    p.add_argument("--nemesis-coordinator", action="store_true",
                   help="--cluster: let the nemesis kill and pause the coordinators' brokers too, "
                        "so faults move the coordinators (replicated; such runs pass, docs/check.md)")
    p.add_argument("--mode", choices=sorted(MODES), default="ci",
                   help="ci: 60 s of workload, the whole run within 3 minutes (default); "
                        "long: 30 minutes unless --duration says otherwise")
    p.add_argument("--duration", type=float, metavar="S", help="seconds of workload before heal and drain")
    p.add_argument("--seed", type=int, default=None, help="seed for the schedule (default: time based, printed)")
    p.add_argument("--faults", metavar="LIST",
                   help="comma list of client-kill, client-pause, broker-kill, power-loss, disk-full, slow-fsync, "
                        "or with --cluster leader-kill, follower-kill, broker-pause, power-loss, disk, clock; "
                        "or none / all (power-loss needs FUSE: fusermount3)")
    p.add_argument("--keys", type=int, default=4, help="partitions of the check topic (default 4)")
    p.add_argument("--producers", type=int, default=3, help="transactional producer slots (default 3)")
    p.add_argument("--zombies", type=int, default=2,
                   help="processes sharing one more transactional id, started together again and again "
                        "so their InitProducerIds coincide (default 2; 0: none)")
    p.add_argument("--out", type=Path, help="output directory (default $XDG_STATE_HOME/semel/check/<time>, "
                                            "~/.local/state/semel/check/<time> without it; "
                                            "the history's directory with --analyze)")
    p.add_argument("--data-dir", type=Path, help="broker data directory when check starts it "
                                                 "(default OUT/broker-data)")
    p.add_argument("--fault-interval", type=float, nargs=2, metavar=("MIN", "MAX"), default=(2.0, 6.0),
                   help="seconds between faults, drawn uniformly (default 2 6)")
    p.add_argument("--no-plot", action="store_true", help="skip offsets.png")
    p.set_defaults(func=run)


# Names that stand for several faults: a partition of the network is one of them later.
_EXPAND: dict[str, str] = {}


def _faults(args, managed: bool) -> tuple:
    from ..check.faults import BROKER_FAULTS, CLUSTER_FAULTS, FAULTS
    spec = args.faults
    if spec is None:
        spec = (DEFAULT_FAULTS_CLUSTER if args.cluster else
                DEFAULT_FAULTS_MANAGED[args.mode] if managed else DEFAULT_FAULTS_REMOTE)
    spec = spec.strip()
    if spec == "none":
        return ()
    if spec == "all":
        allowed = set(CLUSTER_FAULTS) if args.cluster else set(BROKER_FAULTS) if managed else set()
        return tuple(f for f in FAULTS if f in allowed or f not in BROKER_FAULTS | set(CLUSTER_FAULTS))
    spec = ",".join(_EXPAND.get(f.strip(), f.strip()) for f in spec.split(","))
    faults = tuple(dict.fromkeys(f.strip() for f in spec.split(",") if f.strip()))
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise CliError(f"unknown fault {unknown[0]!r}; known: {', '.join(FAULTS)}, none, all")
    if args.cluster and (BROKER_FAULTS - set(CLUSTER_FAULTS)) & set(faults):
        raise CliError(f"with --cluster the broker faults are {', '.join(CLUSTER_FAULTS)}")
    if not managed and not args.cluster and BROKER_FAULTS & set(faults):
        raise CliError(f"broker faults ({', '.join(sorted(BROKER_FAULTS))}) need --broker-cmd or --spawn-semel: "
                       "check must run the broker to kill it")
    if not args.cluster and (set(CLUSTER_FAULTS) - BROKER_FAULTS) & set(faults):
        raise CliError(f"cluster faults ({', '.join(f for f in CLUSTER_FAULTS if f not in BROKER_FAULTS)}) "
                       "need --cluster")
    return faults


def _duration(args) -> tuple[float, tuple]:
    default, budgets, longest = MODES[args.mode]
    duration = default if args.duration is None else args.duration
    if duration <= 0:
        raise CliError("--duration must be positive")
    if longest is not None and duration > longest:
        raise CliError(f"--mode {args.mode} allows at most --duration {longest:.0f}; use --mode long")
    return duration, budgets


def default_out_dir() -> Path:
    """Where a run writes without --out: the user's state directory (XDG), never the
    current one, so a run started inside a source tree leaves nothing in it."""
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "semel" / "check" / time.strftime("%Y%m%d-%H%M%S")


def _out_dir(args) -> Path:
    out = args.out or default_out_dir()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot use output directory {out}: {exc.strerror}") from None
    return out


def _report(result: dict, out: Path, run_info: dict, plot: bool) -> int:
    from ..check.report import text_report, write_outputs
    try:
        paths = write_outputs(result, out, run_info, plot=plot)
    except OSError as exc:
        raise CliError(f"cannot write outputs to {out}: {exc.strerror}") from None
    sys.stdout.write(text_report(result, run_info))
    print("outputs: " + ", ".join(f"{k} {v}" for k, v in paths.items()))
    return 0 if result["valid"] else 1


def run(args) -> int:
    from .optional import require
    if args.analyze is None:   # a run's workers are confluent-kafka clients; --analyze reads a file
        require("confluent_kafka", "semel check")
    if not args.no_plot:   # say so now, not after a 30-minute run
        require("matplotlib", "the offsets plot (offsets.png)", instead="pass --no-plot to run without it")
    from ..check.checker import analyze
    from ..check.history import HistoryError

    if args.analyze is not None:
        try:
            result = analyze(args.analyze)
        except HistoryError as exc:
            raise CliError(str(exc)) from None
        args.out = args.out or args.analyze.parent
        run_info = dict(_setup_of(args.analyze), history=str(args.analyze))
        return _report(result, _out_dir(args), run_info, not args.no_plot)

    if not (args.bootstrap or args.broker_cmd or args.spawn_semel or args.cluster):
        raise CliError("say where the broker is: --bootstrap HOST:PORT, --broker-cmd TEMPLATE, --spawn-semel "
                       "or --cluster")
    if args.cluster and args.nodes < 3:
        raise CliError("--cluster needs --nodes 3 or more (its topics have replication factor 3)")
    if args.cluster and args.lease_ttl_s < 1:
        raise CliError("--lease-ttl-s must be at least 1")
    if not args.cluster and args.nemesis_coordinator:
        raise CliError("--nemesis-coordinator goes with --cluster")
    if args.keys < 1 or args.producers < 1:
        raise CliError("--keys and --producers must be at least 1")
    lo, hi = args.fault_interval
    if not 0 < lo <= hi:
        raise CliError("--fault-interval needs 0 < MIN <= MAX")
    managed = bool(args.broker_cmd or args.spawn_semel)
    faults = _faults(args, managed)
    duration, (setup, finish, fence, drain) = _duration(args)
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    out = _out_dir(args)

    from ..check.target import SEMEL_TEMPLATE, BrokerStartError, ManagedBroker
    from ..check.workload import WorkloadConfig, WorkloadError, run_workload

    broker = cluster = None
    bootstrap = args.bootstrap
    if args.cluster:
        cluster = _start_cluster(args, out, faults)
        bootstrap = cluster.bootstrap
    elif managed:
        template = args.broker_cmd or SEMEL_TEMPLATE
        try:
            broker = ManagedBroker(template, args.data_dir or out / "broker-data", out / "broker.log")
            if "power-loss" in faults:
                broker.disk = _power_cut_disk(out / "broker-data-backing", broker.data_dir)
            broker.start()
        except BrokerStartError as exc:
            if broker is not None and broker.disk is not None:
                broker.disk.stop()
            raise CliError(str(exc)) from None
        bootstrap = broker.bootstrap
    elif ":" not in bootstrap:
        raise CliError(f"--bootstrap must be HOST:PORT, got {bootstrap!r}")

    run_info = {"bootstrap": bootstrap, "seed": seed, "mode": args.mode, "duration_s": duration,
                "faults": list(faults), "history": str(out / "history.jsonl"),
                "broker_cmd": (args.broker_cmd or SEMEL_TEMPLATE) if managed else None}
    print(f"semel check: seed {seed}, {args.mode} mode, {duration:.0f}s, faults {','.join(faults) or 'none'}, "
          f"broker {bootstrap}; writing {out}", flush=True)
    cfg = WorkloadConfig(bootstrap=bootstrap, out_dir=out, seed=seed, duration_s=duration, faults=faults,
                         keys=args.keys, producers=args.producers, zombies=args.zombies, broker=broker,
                         cluster=cluster, replication_factor=3 if cluster else 1,
                         topic_config={"min.insync.replicas": "2"} if cluster else None,
                         fault_interval_s=(lo, hi), setup_timeout_s=setup, finish_timeout_s=finish,
                         fence_timeout_s=fence, drain_timeout_s=drain)
    # SIGTERM unwinds like Ctrl-C, so the broker and workers we started are stopped.
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        history = run_workload(cfg)
    except WorkloadError as exc:
        raise CliError(str(exc)) from None
    except BaseException:
        if broker is not None:
            broker.kill()  # interrupted: no time for a clean stop
        if cluster is not None:
            cluster.close()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if broker is not None:
            broker.stop(timeout_s=10)
            if broker.disk is not None:
                broker.disk.stop()
        if cluster is not None:
            run_info["cluster"] = cluster.summary()
            cluster.stop()
            cluster.close()
    result = analyze(history)
    run_info["topic"] = _setup_of(history).get("topic")
    return _report(result, out, run_info, not args.no_plot)


def _power_cut_disk(backing: Path, mount: Path):
    from ..launch.lazyfs import FuseUnavailable, PowerCutDisk
    try:
        return PowerCutDisk(backing, mount).start()
    except FuseUnavailable as exc:
        raise CliError(f"power-loss needs FUSE: {exc}") from None


def _start_cluster(args, out: Path, faults: tuple):
    from ..check.cluster import CheckCluster, ClusterStartError
    try:
        cluster = CheckCluster(args.data_dir or out / "cluster", args.nodes, args.lease_ttl_s,
                               args.nemesis_coordinator, faults=faults)
        cluster.start()
    except ClusterStartError as exc:
        raise CliError(str(exc)) from None
    return cluster


def _terminate(signum, frame):
    raise KeyboardInterrupt


def _setup_of(history: Path) -> dict:
    """The run settings the controller wrote as the history's first line, if any."""
    import json
    try:
        with open(history, encoding="utf-8") as fh:
            first = json.loads(fh.readline())
    except (OSError, ValueError):
        return {}
    if not isinstance(first, dict) or first.get("f") != "setup" or not isinstance(first.get("value"), dict):
        return {}
    return {k: first["value"][k] for k in ("bootstrap", "topic", "seed", "duration_s", "faults") if k in first["value"]}
