"""Consume-transform-produce, exactly once, with an unmodified confluent-kafka client.

Reads integers from --input, writes each one multiplied by 2 to --output, and
commits the consumed offsets in the same transaction as the results. Kill it
at any moment and start it again: the new instance fences the old one (same
transactional id), the open transaction is aborted, and processing resumes
from the last committed offsets — every input yields exactly one output.

    python examples/double.py --bootstrap 127.0.0.1:9092 --input numbers --output doubled
"""
from __future__ import annotations

import argparse
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--input", default="numbers")
    p.add_argument("--output", default="doubled")
    p.add_argument("--group", default="doubler")
    p.add_argument("--transactional-id", default="doubler-0")
    p.add_argument("--batch", type=int, default=50, help="records per transaction at most")
    p.add_argument("--idle-exit", type=float, default=None,
                   help="exit 0 after this many seconds without input (default: run forever)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group,
        "isolation.level": "read_committed", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "session.timeout.ms": 3000, "heartbeat.interval.ms": 500,
    })
    # metadata.recovery.strategy=none: librdkafka's re-bootstrap after a broker restart
    # strands send_offsets_to_transaction (docs/librdkafka-restart-hang.md).
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.transactional_id,
                         "transaction.timeout.ms": 30000, "linger.ms": 5,
                         "metadata.recovery.strategy": "none"})
    producer.init_transactions(30)
    consumer.subscribe([args.input])
    idle_since = time.monotonic()
    while True:
        msgs = [m for m in consumer.consume(num_messages=args.batch, timeout=0.5) if not m.error()]
        if not msgs:
            if not consumer.assignment():
                idle_since = time.monotonic()   # still joining the group: not idle yet
            elif args.idle_exit is not None and time.monotonic() - idle_since > args.idle_exit:
                break
            continue
        idle_since = time.monotonic()
        producer.begin_transaction()
        try:
            for m in msgs:
                doubled = int(m.value()) * 2
                producer.produce(args.output, key=m.key(), value=str(doubled).encode(),
                                 headers=[("src", f"{m.partition()}:{m.offset()}".encode())])
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
        except KafkaException as exc:
            err = exc.args[0]
            if err.txn_requires_abort():
                producer.abort_transaction(30)
                # Rewind to what the group committed: the aborted batch is read again.
                committed = consumer.committed(consumer.assignment(), 30)
                for tp in committed:
                    if tp.offset >= 0:
                        consumer.seek(tp)
                continue
            raise
    consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
