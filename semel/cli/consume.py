"""`semel consume TOPIC`: print records, by assignment or through a group."""
from __future__ import annotations

import sys
import time

from ..client.quiet import quiet_logger
from .main import CliError, require_broker


def add_parser(sub) -> None:
    p = sub.add_parser("consume", help="print records of a topic")
    p.add_argument("topic")
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="HOST:PORT of a broker")
    p.add_argument("--group", default=None, help="consume as a member of this group (commits offsets)")
    p.add_argument("--isolation", choices=["read_committed", "read_uncommitted"], default="read_committed")
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    p.add_argument("--max-messages", type=int, default=None, help="stop after this many records")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop after this many seconds without a new record")
    p.add_argument("--print-keys", action="store_true")
    p.add_argument("--print-headers", action="store_true")
    p.add_argument("--print-offsets", action="store_true")
    p.set_defaults(func=run)


def _format(msg, args) -> str:
    parts = []
    if args.print_offsets:
        parts.append(f"{msg.partition()}:{msg.offset()}")
    if args.print_keys:
        key = msg.key()
        parts.append(key.decode(errors="replace") if key is not None else "null")
    if args.print_headers:
        hdrs = msg.headers() or []
        parts.append(",".join(f"{k}={(v or b'').decode(errors='replace')}" for k, v in hdrs))
    value = msg.value()
    parts.append(value.decode(errors="replace") if value is not None else "null")
    return "\t".join(parts)


def run(args) -> int:
    from .optional import require
    require("confluent_kafka", "semel consume")
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition
    require_broker(args.bootstrap)
    conf = {"bootstrap.servers": args.bootstrap, "logger": quiet_logger(), "isolation.level": args.isolation,
            "group.id": args.group or "semel-cli-unused", "enable.auto.commit": bool(args.group),
            "auto.offset.reset": "earliest" if args.from_beginning else "latest"}
    count = 0
    try:
        consumer = Consumer(conf)
        if args.group:
            consumer.subscribe([args.topic])
        else:
            md = consumer.list_topics(args.topic, timeout=10)
            tmeta = md.topics.get(args.topic)
            if tmeta is None or tmeta.error is not None:
                raise CliError(f"topic {args.topic}: {tmeta.error.str() if tmeta else 'not found'}")
            start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
            consumer.assign([TopicPartition(args.topic, p, start) for p in tmeta.partitions])
        last = time.monotonic()
        while args.max_messages is None or count < args.max_messages:
            msg = consumer.poll(0.2)
            if msg is None:
                if args.timeout is not None and time.monotonic() - last > args.timeout:
                    break
                continue
            if msg.error():
                if msg.error().fatal():
                    raise CliError(msg.error().str())
                continue
            print(_format(msg, args), flush=True)
            count += 1
            last = time.monotonic()
        consumer.close()
    except KafkaException as exc:
        raise CliError(exc.args[0].str() if exc.args else str(exc)) from None
    except BrokenPipeError:
        return 0
    print(f"consumed {count} record(s)", file=sys.stderr)
    return 0
