"""A transactional copier on the consumer group protocol (KIP-848), run as its own
process so a test can SIGKILL the broker under it and start it again.

Reads `--source` as a member of `--group` (group.protocol=consumer, read_committed),
writes each record's value to `--sink` and commits the consumed offsets in the same
transaction with the member's group metadata (so a stale member epoch fences it).
Any error ends the process with status 1, and so does a stall: after a broker SIGKILL
cuts a transaction, librdkafka's transactional producer can hang without an error
(seen here with the classic protocol too), so a copier that commits nothing for
`--stall-s` exits 2. A new instance fences the old transactional producer and
resumes from the committed offsets.
COPIER_GROUP_PROTOCOL=classic runs the same copier on the classic protocol.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

import os

from confluent_kafka import Consumer, KafkaException, Producer

PROTOCOL = os.environ.get("COPIER_GROUP_PROTOCOL", "consumer")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--txn-id", required=True)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--pause-ms", type=int, default=0, help="between transactions, so a test can kill mid-way")
    ap.add_argument("--stall-s", type=float, default=15.0)
    args = ap.parse_args()
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                         "group.protocol": PROTOCOL, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.txn_id,
                         "transaction.timeout.ms": 20000})
    last_commit = [time.monotonic()]

    def watchdog():
        while time.monotonic() - last_commit[0] < args.stall_s:
            time.sleep(0.5)
        print("copier stops: no commit for", args.stall_s, "s", file=sys.stderr, flush=True)
        os._exit(2)
    threading.Thread(target=watchdog, daemon=True).start()
    try:
        producer.init_transactions(60)
        consumer.subscribe([args.source])
        while True:
            msgs = [m for m in consumer.consume(args.batch, 1.0) if not m.error()]
            if not msgs:
                continue
            producer.begin_transaction()
            for m in msgs:
                producer.produce(args.sink, value=m.value(), key=m.key())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 10)
            producer.commit_transaction(10)
            last_commit[0] = time.monotonic()
            time.sleep(args.pause_ms / 1000)
    except KafkaException as exc:
        print(f"copier stops: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        consumer.close()


if __name__ == "__main__":
    sys.exit(main())
