"""`semel topic create|list|describe|delete` over the wire."""
from __future__ import annotations

from ..client import Client, ClientError
from ..protocol.errors import KafkaError
from .main import CliError


def add_parser(sub) -> None:
    p = sub.add_parser("topic", help="manage topics")
    tsub = p.add_subparsers(dest="action", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser("create", help="create a topic")
    c.add_argument("name")
    c.add_argument("--partitions", type=int, default=1)
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="topic config, e.g. retention.ms=60000 (repeatable)")
    lst = tsub.add_parser("list", help="list topics")
    d = tsub.add_parser("describe", help="show partitions and offsets of a topic")
    d.add_argument("name")
    rm = tsub.add_parser("delete", help="delete a topic")
    rm.add_argument("name")
    for sp in (c, lst, d, rm):
        sp.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
        sp.set_defaults(func=run)


def run(args) -> int:
    try:
        with Client(args.bootstrap) as client:
            return _ACTIONS[args.action](client, args)
    except ClientError as exc:
        raise CliError(str(exc)) from None


def _create(client, args) -> int:
    configs = {}
    for item in args.config:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--config wants KEY=VALUE, got {item!r}")
        configs[key] = value
    err = client.create_topic(args.name, args.partitions, configs)
    _check(err, f"create {args.name}")
    print(f"created topic {args.name} with {args.partitions} partition(s)")
    return 0


def _list(client, args) -> int:
    md = client.metadata(None)
    for t in sorted(md.topics, key=lambda t: t.name):
        print(f"{t.name}\t{len(t.partitions)} partition(s){' (internal)' if t.is_internal else ''}")
    return 0


def _describe(client, args) -> int:
    n = client.partitions(args.name)
    print(f"topic {args.name}: {n} partition(s)")
    print("partition\tlog-start\thigh-watermark\tlast-stable")
    for p in range(n):
        start = client.list_offset(args.name, p, -2)
        hw = client.list_offset(args.name, p, -1)
        lso = client.list_offset(args.name, p, -1, isolation=1)
        print(f"{p}\t{start}\t{hw}\t{lso}")
    return 0


def _delete(client, args) -> int:
    _check(client.delete_topic(args.name), f"delete {args.name}")
    print(f"deleted topic {args.name}")
    return 0


def _check(err: KafkaError, what: str) -> None:
    if err != KafkaError.NONE:
        raise CliError(f"{what}: {err.name}")


_ACTIONS = {"create": _create, "list": _list, "describe": _describe, "delete": _delete}
