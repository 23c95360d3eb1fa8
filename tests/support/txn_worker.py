"""A transactional worker for chaos tests (run as its own process).

Transaction n of worker k writes R records "k:n:i" across the ledger
partitions and commits offset n+1 for partition k of topic "src" in group
"g{k}", then commits or aborts at random. It journals (fsync'd) what it began
and what the broker confirmed, so the verifier knows which outcomes are
certain and which are in doubt (killed mid-commit).
"""
from __future__ import annotations

import argparse
import os
import random
import sys

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def journal_line(f, line: str) -> None:
    f.write(line + "\n")
    f.flush()
    os.fsync(f.fileno())


def last_started(path: str) -> int:
    n = -1
    if os.path.exists(path):
        for line in open(path):
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                n = max(n, int(parts[1]))
    return n


def retry(op, attempts=20):
    for i in range(attempts):
        try:
            return op()
        except KafkaException as exc:
            err = exc.args[0]
            if err.retriable() and i < attempts - 1:
                continue
            raise


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--journal", required=True)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--records", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--txns", type=int, default=10**9)
    a = ap.parse_args()
    k = a.worker
    start = last_started(a.journal) + 1
    rng = random.Random(a.seed * 1000 + k * 7919 + start)
    producer = Producer({"bootstrap.servers": a.bootstrap, "transactional.id": f"chaos-{k}",
                         "transaction.timeout.ms": 10000, "linger.ms": 2, "message.timeout.ms": 10000,
                         "reconnect.backoff.max.ms": 500, "retry.backoff.max.ms": 500,
                         **({"debug": "eos,broker,protocol"} if os.environ.get("STALL_DEBUG") else {})})
    # Keep the consumer alive for the whole run: a dropped, unclosed librdkafka handle
    # spins its threads while "terminating" and starves the producer of CPU.
    group_handle = Consumer({"bootstrap.servers": a.bootstrap, "group.id": f"g{k}"})
    meta = group_handle.consumer_group_metadata()
    retry(lambda: producer.init_transactions(30))
    with open(a.journal, "a") as journal:
        for n in range(start, start + a.txns):
            journal_line(journal, f"begin {n}")
            commit = rng.random() < 0.7
            try:
                producer.begin_transaction()
                for i in range(a.records):
                    producer.produce("ledger", value=f"{k}:{n}:{i}".encode(), partition=i % a.partitions)
                retry(lambda: producer.send_offsets_to_transaction([TopicPartition("src", k, n + 1)], meta, 30))
                if commit:
                    retry(lambda: producer.commit_transaction(30))
                else:
                    retry(lambda: producer.abort_transaction(30))
                journal_line(journal, f"{'commit' if commit else 'abort'} {n}")
            except KafkaException as exc:
                err = exc.args[0]
                if err.txn_requires_abort():
                    retry(lambda: producer.abort_transaction(30))
                    journal_line(journal, f"abort {n}")
                    continue
                print(f"worker {k}: giving up on txn {n}: {err}", file=sys.stderr)
                return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
