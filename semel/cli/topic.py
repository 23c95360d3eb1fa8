"""`semel topic create|list|describe|delete|alter|delete-records|reassign` over the wire."""
from __future__ import annotations

import sys

from ..client import Client, ClientError, admin
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from . import topic_reassign
from .main import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("topic", help="manage topics")
    tsub = p.add_subparsers(dest="action", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser("create", help="create a topic")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, default=1)
    c.add_argument("--replication-factor", type=int, default=-1,
                   help="replicas per partition (default -1: the brokers' default, 1 on a single node)")
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="topic config, e.g. retention.ms=60000 (repeatable)")
    lst = tsub.add_parser("list", help="list topics")
    d = tsub.add_parser("describe", help="show partitions and offsets of a topic")
    d.add_argument("name")
    rm = tsub.add_parser("delete", help="delete a topic")
    rm.add_argument("name")
    alt = tsub.add_parser("alter", help="add partitions to a topic or change its configs")
    alt.add_argument("name")
    alt.add_argument("--partitions", type=int, default=None, help="new (larger) partition count")
    alt.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                     help="set a topic config (repeatable)")
    alt.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                     help="drop a topic config override, back to the default (repeatable)")
    dr = tsub.add_parser("delete-records", help="delete records below an offset (moves the log start)")
    dr.add_argument("name")
    dr.add_argument("--partition", type=int, action="append", default=None,
                    help="partition to trim (repeatable; default: every partition)")
    dr.add_argument("--before", type=int, default=-1,
                    help="delete records below this offset (default -1: up to the high watermark)")
    for sp in (c, lst, d, rm, alt, dr):
        sp.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
        sp.set_defaults(func=run)
    topic_reassign.add_parser(tsub)


def run(args) -> int:
    try:
        with Client(args.bootstrap) as client:
            return _ACTIONS[args.action](client, args)
    except ClientError as exc:
        raise CliError(str(exc)) from None


def _key_values(items: list[str]) -> dict[str, str]:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--config wants KEY=VALUE, got {item!r}")
        configs[key] = value
    return configs


def _create(client, args) -> int:
    configs = _key_values(args.config)
    if "." in args.name or "_" in args.name:
        # Kafka's tools warn the same way: metric names map '.' to '_', so the broker
        # refuses a later name that differs from this one only there.
        print(f"warning: '.' and '_' collide in metric names: no other topic that differs from "
              f"{args.name!r} only in '.' versus '_' can exist beside it", file=sys.stderr)
    if args.replication_factor == 0 or args.replication_factor < -1:
        raise CliError(f"--replication-factor must be -1 or at least 1, got {args.replication_factor}")
    err = client.create_topic(args.name, args.partitions, configs, args.replication_factor)
    _check(err, f"create {args.name}")
    rf = args.replication_factor if args.replication_factor != -1 else _replication_factor(client, args.name)
    print(f"created topic {args.name} with {args.partitions} partition(s), replication factor "
          f"{rf if rf is not None else 'the broker default'}")
    return 0


def _replication_factor(client, name: str) -> int | None:
    """The factor the broker chose (its default) as Metadata shows it; None if not yet shown."""
    topics = client.metadata([name]).topics
    parts = topics[0].partitions if topics and topics[0].error_code == 0 else []
    return len(parts[0].replica_nodes) if parts else None


def _list(client, args) -> int:
    md = client.metadata(None)
    for t in sorted(md.topics, key=lambda t: t.name):
        print(f"{t.name}\t{len(t.partitions)} partition(s){' (internal)' if t.is_internal else ''}")
    return 0


def _describe(client, args) -> int:
    """Leader, leader epoch, replicas and ISR from Metadata; offsets from each leader."""
    md = client.metadata([args.name])
    t = md.topics[0]
    _check(KafkaError(t.error_code), f"describe {args.name}")
    brokers = {b.node_id: f"{b.host}:{b.port}" for b in md.brokers}
    print(f"topic {args.name}: {len(t.partitions)} partition(s)")
    print("partition\tlog-start\thigh-watermark\tlast-stable\tleader\tepoch\treplicas\tisr")
    # A single broker answers for itself on the connection we have; in a cluster each
    # partition's offsets come from its leader.
    leaders: dict[int, Client] = {}
    try:
        for p in sorted(t.partitions, key=lambda p: p.partition_index):
            offsets = ["-", "-", "-"]
            c = client if len(brokers) == 1 else None
            if c is None and p.leader_id in brokers:
                if p.leader_id not in leaders:
                    leaders[p.leader_id] = Client(brokers[p.leader_id])
                c = leaders[p.leader_id]
            if c is not None:
                i = p.partition_index
                offsets = [c.list_offset(args.name, i, -2), c.list_offset(args.name, i, -1),
                           c.list_offset(args.name, i, -1, isolation=1)]
            print("\t".join(str(x) for x in (p.partition_index, *offsets, p.leader_id, p.leader_epoch,
                                                _ids(p.replica_nodes), _ids(p.isr_nodes))))
    finally:
        for c in leaders.values():
            c.close()
    return 0


def _ids(nodes) -> str:
    return ",".join(str(n) for n in nodes)


def _delete(client, args) -> int:
    _check(client.delete_topic(args.name), f"delete {args.name}")
    print(f"deleted topic {args.name}")
    return 0


SET, DELETE = 0, 1  # IncrementalAlterConfigs operations
RESOURCE_TOPIC = 2


def _alter(client, args) -> int:
    configs = _key_values(args.config)
    if args.partitions is None and not configs and not args.delete_config:
        raise CliError("alter: give --partitions, --config or --delete-config")
    if configs or args.delete_config:
        # Configs first: a bad config leaves the partition count alone too.
        R = request_class(ApiKey.INCREMENTAL_ALTER_CONFIGS).AlterConfigsResource
        ops = [R.AlterableConfig(name=k, config_operation=SET, value=v) for k, v in configs.items()]
        ops += [R.AlterableConfig(name=k, config_operation=DELETE, value=None) for k in args.delete_config]
        resp = client.request(ApiKey.INCREMENTAL_ALTER_CONFIGS,
                              resources=[R(resource_type=RESOURCE_TOPIC, resource_name=args.name, configs=ops)],
                              validate_only=False)
        r = resp.responses[0]
        _check(KafkaError(r.error_code), f"alter configs of {args.name}", r.error_message)
        print(f"altered configs of topic {args.name}")
    if args.partitions is not None:
        T = request_class(ApiKey.CREATE_PARTITIONS).CreatePartitionsTopic
        resp = client.request(ApiKey.CREATE_PARTITIONS,
                              topics=[T(name=args.name, count=args.partitions, assignments=None)],
                              timeout_ms=30000, validate_only=False)
        r = resp.results[0]
        _check(KafkaError(r.error_code), f"alter partitions of {args.name}", r.error_message)
        print(f"topic {args.name} now has {args.partitions} partition(s)")
    return 0


def _delete_records(client, args) -> int:
    parts = args.partition if args.partition is not None else list(range(client.partitions(args.name)))
    failed = []
    for partition, (err, low) in admin.delete_records(client, args.name, {p: args.before for p in parts}).items():
        if err:
            failed.append(f"partition {partition}: {err.name}")
        else:
            print(f"{args.name}-{partition}: log start now {low}")
    if failed:
        raise CliError(f"delete-records {args.name}: " + "; ".join(failed))
    return 0


def _check(err: KafkaError, what: str, message: str | None = None) -> None:
    if err != KafkaError.NONE:
        raise CliError(f"{what}: {err.name}" + (f" ({message})" if message and message != err.name else ""))


_ACTIONS = {"create": _create, "list": _list, "describe": _describe, "delete": _delete,
            "alter": _alter, "delete-records": _delete_records}
