"""Read a topic up to its end as of now: for checks that run once the state has settled.

tests/support/consume.read_values stops after an idle time, which suits a reader racing
writers; a model test that checks after every step (nothing in flight any more) can
instead stop at each partition's end: the last stable offset under read_committed, the
high watermark under read_uncommitted (librdkafka's partition EOF), without the idle wait."""
from __future__ import annotations

import time


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed",
                timeout_s: float = 30) -> list[str]:
    """Decoded values of every record visible under `isolation` up to each partition's end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verifier", "isolation.level": isolation,
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "fetch.wait.max.ms": 10})   # the end shows in an empty fetch: do not park it
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ended: set[int] = set()
        values: list[str] = []
        deadline = time.monotonic() + timeout_s
        while len(ended) < partitions:
            assert time.monotonic() < deadline, f"{topic}: no end reached in {timeout_s}s (partitions {ended} did)"
            m = c.poll(0.1)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    ended.add(m.partition())
                continue
            values.append(m.value().decode())
        return values
    finally:
        c.close()
