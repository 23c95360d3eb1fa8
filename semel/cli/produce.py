"""`semel produce TOPIC`: send stdin lines (or --value) as records, idempotently."""
from __future__ import annotations

import sys

from ..client.quiet import quiet_logger
from .main import CliError, require_broker


def add_parser(sub) -> None:
    p = sub.add_parser("produce", help="produce records from stdin lines or --value")
    p.add_argument("topic")
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
    p.add_argument("--value", action="append", default=None, help="a record value (repeatable); default: stdin lines")
    p.add_argument("--key", default=None, help="key for every record")
    p.add_argument("--key-separator", default=None, help="split each line into KEY SEP VALUE")
    p.add_argument("--header", action="append", default=[], metavar="KEY=VALUE", help="header on every record")
    p.add_argument("--partition", type=int, default=None)
    p.add_argument("--acks", choices=["0", "1", "all"], default="all")
    p.add_argument("--compression", choices=["none", "gzip", "snappy", "lz4", "zstd"], default="none")
    p.add_argument("--transactional-id", default=None, help="send all records in one transaction")
    p.set_defaults(func=run)


def _records(args):
    lines = args.value if args.value is not None else (line.rstrip("\n") for line in sys.stdin)
    for line in lines:
        key = args.key
        value = line
        if args.key_separator:
            k, sep, v = line.partition(args.key_separator)
            if sep:
                key, value = k, v
        yield key, value


def run(args) -> int:
    from .optional import require
    require("confluent_kafka", "semel produce")
    from confluent_kafka import KafkaException, Producer
    headers = []
    for item in args.header:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise CliError(f"--header wants KEY=VALUE, got {item!r}")
        headers.append((k, v.encode()))
    require_broker(args.bootstrap)
    conf = {"bootstrap.servers": args.bootstrap, "logger": quiet_logger(), "acks": args.acks, "compression.type": args.compression,
            "enable.idempotence": args.acks == "all", "message.timeout.ms": 30000}
    if args.transactional_id:
        conf["transactional.id"] = args.transactional_id
    errors: list[str] = []
    sent = 0

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))

    try:
        producer = Producer(conf)
        if args.transactional_id:
            producer.init_transactions(30)
            producer.begin_transaction()
        for key, value in _records(args):
            kwargs = {"value": value.encode(), "headers": headers, "on_delivery": on_delivery}
            if key is not None:
                kwargs["key"] = key.encode()
            if args.partition is not None:
                kwargs["partition"] = args.partition
            producer.produce(args.topic, **kwargs)
            sent += 1
            producer.poll(0)
        if args.transactional_id:
            producer.commit_transaction(30)
        remaining = producer.flush(30)
    except KafkaException as exc:
        raise CliError(exc.args[0].str() if exc.args else str(exc)) from None
    except BufferError as exc:
        raise CliError(f"local queue full: {exc}") from None
    if remaining:
        raise CliError(f"{remaining} record(s) not delivered within 30 s (is the broker at {args.bootstrap}?)")
    if errors:
        raise CliError(f"{len(errors)} record(s) failed: {errors[0]}")
    print(f"produced {sent} record(s) to {args.topic}", file=sys.stderr)
    return 0
