"""`semel topic reassign`: move partition replicas between brokers of a cluster, the
kafka-reassign-partitions way (--generate a plan, --execute it, --verify, --list,
--cancel), over AlterPartitionReassignments / ListPartitionReassignments.

A plan is Kafka's reassignment JSON:
  {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2], "log_dirs": ["any", "any"]}]}
"""
from __future__ import annotations

import json
import sys

from ..client import Client, ClientError
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from .main import CliError

THROTTLE_RATE = "leader.replication.throttled.rate"
SET, DELETE = 0, 1          # IncrementalAlterConfigs operations
RESOURCE_BROKER = 4
IN_PROGRESS = 3             # exit status of --verify while a reassignment is still moving


def add_parser(tsub) -> None:
    r = tsub.add_parser("reassign",
                        help="move partition replicas between brokers (generate, execute, verify a plan)")
    mode = r.add_mutually_exclusive_group(required=True)
    mode.add_argument("--generate", action="store_true",
                      help="print a plan that spreads the --topics evenly over the brokers "
                           "(current assignment to stderr)")
    mode.add_argument("--execute", action="store_true", help="start the reassignment of --plan")
    mode.add_argument("--verify", action="store_true",
                      help=f"whether --plan is done (exit {IN_PROGRESS} while it moves); "
                           "once done, removes the throttle")
    mode.add_argument("--list", action="store_true", help="the reassignments in progress")
    mode.add_argument("--cancel", action="store_true",
                      help="cancel the reassignments of --plan: back to the original replicas")
    r.add_argument("--plan", metavar="FILE", help="reassignment JSON (Kafka's format)")
    r.add_argument("--topics", default="", help="--generate: comma-separated topics to spread")
    r.add_argument("--brokers", default="",
                   help="--generate: comma-separated broker ids to spread over (default: every live broker)")
    r.add_argument("--throttle", type=int, default=None, metavar="BYTES_PER_S",
                   help="--execute: cap the copying of new replicas, bytes/s per leader broker "
                        f"(cluster-wide {THROTTLE_RATE}; --verify removes it when all is done)")
    r.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
    r.set_defaults(func=run)


def run(args) -> int:
    try:
        return _run(args)
    except ClientError as exc:
        raise CliError(str(exc)) from None


def _run(args) -> int:
    with Client(args.bootstrap) as client:
        if args.generate:
            return _generate(client, args)
        if args.list:
            return _list(client)
        plan = _read_plan(args.plan)
        if args.execute:
            return _execute(client, plan, args.throttle)
        if args.verify:
            return _verify(client, plan)
        return _alter(client, {tp: None for tp in plan}, "cancelled")


# --- plans ------------------------------------------------------------------------------

def plan_json(assignment: dict[tuple[str, int], list[int]]) -> str:
    return json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r), "log_dirs": ["any"] * len(r)}
        for (t, p), r in sorted(assignment.items())]})


def parse_plan(text: str) -> dict[tuple[str, int], list[int]]:
    try:
        d = json.loads(text)
        out = {(e["topic"], int(e["partition"])): [int(b) for b in e["replicas"]] for e in d["partitions"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise CliError(f"not a reassignment plan ({exc!r}); want {{\"version\": 1, \"partitions\": "
                       f"[{{\"topic\", \"partition\", \"replicas\"}}, ...]}}") from None
    if not out:
        raise CliError("the plan names no partitions")
    return out


def spread(topics: dict[str, tuple[int, int]], brokers: list[int]) -> dict[tuple[str, int], list[int]]:
    """An even spread of the topics (name -> (partitions, replication factor)) over
    `brokers`: the partitions of every topic of one replication factor, in order, as one
    sequence placed by the controller's assign_replicas (leaders round-robin, followers
    at a growing distance), so leaders and replicas balance across topics too."""
    from ..cluster.controller import assign_replicas
    by_rf: dict[int, list[tuple[str, int]]] = {}
    for name in sorted(topics):
        count, rf = topics[name]
        if rf > len(brokers):
            raise CliError(f"{name} has {rf} replicas per partition; only {len(brokers)} brokers given")
        by_rf.setdefault(rf, []).extend((name, p) for p in range(count))
    out: dict[tuple[str, int], list[int]] = {}
    for rf, tps in by_rf.items():
        for tp, replicas in zip(tps, assign_replicas(brokers, len(tps), rf, start=0, shift=0)):
            out[tp] = list(replicas)
    return out


def _read_plan(path: str | None) -> dict[tuple[str, int], list[int]]:
    if not path:
        raise CliError("give --plan FILE (a plan --generate printed)")
    try:
        with open(path) as f:
            return parse_plan(f.read())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None


def _generate(client, args) -> int:
    names = [t for t in args.topics.split(",") if t]
    if not names:
        raise CliError("--generate needs --topics T1,T2,...")
    md = client.metadata(names)
    brokers = sorted(int(b) for b in args.brokers.split(",") if b) or sorted(b.node_id for b in md.brokers)
    current, shape = {}, {}
    for t in md.topics:
        if t.error_code:
            raise CliError(f"topic {t.name}: {KafkaError(t.error_code).name}")
        for p in t.partitions:
            current[(t.name, p.partition_index)] = list(p.replica_nodes)
        shape[t.name] = (len(t.partitions), max(len(p.replica_nodes) for p in t.partitions))
    print("Current partition replica assignment (save it to go back):", file=sys.stderr)
    print(plan_json(current), file=sys.stderr)
    print(plan_json(spread(shape, brokers)))
    return 0


# --- requests ---------------------------------------------------------------------------

def _alter(client, plan: dict[tuple[str, int], list[int] | None], done: str) -> int:
    T = request_class(45).ReassignableTopic
    by_topic: dict[str, list] = {}
    for (t, p), replicas in sorted(plan.items()):
        by_topic.setdefault(t, []).append(T.ReassignablePartition(partition_index=p, replicas=replicas))
    resp = client.request(45, timeout_ms=30000, topics=[T(name=t, partitions=ps) for t, ps in by_topic.items()])
    if resp.error_code:
        raise CliError(f"reassignment refused: {KafkaError(resp.error_code).name} ({resp.error_message})")
    failed = [f"{t.name}-{p.partition_index}: {KafkaError(p.error_code).name} ({p.error_message})"
              for t in resp.responses for p in t.partitions if p.error_code]
    for t in resp.responses:
        for p in t.partitions:
            if not p.error_code:
                print(f"{t.name}-{p.partition_index}: reassignment {done}")
    if failed:
        raise CliError("; ".join(failed))
    return 0


def _set_throttle(client, rate: int | None) -> None:
    R = request_class(44).AlterConfigsResource
    op = R.AlterableConfig(name=THROTTLE_RATE, config_operation=SET if rate is not None else DELETE,
                           value=None if rate is None else str(rate))
    resp = client.request(44, resources=[R(resource_type=RESOURCE_BROKER, resource_name="", configs=[op])],
                          validate_only=False)
    r = resp.responses[0]
    if r.error_code:
        raise CliError(f"cannot set the throttle: {KafkaError(r.error_code).name} ({r.error_message})")


def _execute(client, plan, throttle: int | None) -> int:
    if throttle is not None:
        if throttle < 1:
            raise CliError("--throttle is bytes per second, at least 1")
        _set_throttle(client, throttle)
        print(f"throttle: {throttle} bytes/s per leader broker for the new replicas")
    return _alter(client, plan, "started")


def ongoing(client) -> dict[tuple[str, int], tuple[list[int], list[int], list[int]]]:
    """(topic, partition) -> (replicas, adding, removing) of every reassignment in progress."""
    resp = client.request(46, timeout_ms=30000, topics=None)
    if resp.error_code:
        raise CliError(f"cannot list reassignments: {KafkaError(resp.error_code).name}")
    return {(t.name, p.partition_index): (list(p.replicas), list(p.adding_replicas), list(p.removing_replicas))
            for t in resp.topics for p in t.partitions}


def _list(client) -> int:
    moving = ongoing(client)
    for (t, p), (replicas, adding, removing) in sorted(moving.items()):
        print(f"{t}-{p}: replicas {replicas} adding {adding} removing {removing}")
    if not moving:
        print("no reassignment in progress")
    return 0


def _verify(client, plan) -> int:
    moving = ongoing(client)
    md = client.metadata(sorted({t for t, _ in plan}))
    now = {(t.name, p.partition_index): list(p.replica_nodes) for t in md.topics for p in t.partitions}
    left = 0
    for tp, want in sorted(plan.items()):
        if tp in moving:
            left += 1
            print(f"{tp[0]}-{tp[1]}: in progress (adding {moving[tp][1]}, removing {moving[tp][2]})")
        elif now.get(tp) == want:
            print(f"{tp[0]}-{tp[1]}: done")
        else:
            left += 1
            print(f"{tp[0]}-{tp[1]}: not as planned (replicas {now.get(tp)}, planned {want})")
    if left:
        return IN_PROGRESS
    if not moving:
        _set_throttle(client, None)
        print("throttle removed")
    return 0
