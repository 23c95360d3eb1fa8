"""Read everything a topic holds, as a verifier would: by assignment from offset 0."""
from __future__ import annotations

import time


def read_values(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed",
                idle_s: float = 1.5, want: int | None = None, config: dict | None = None) -> list[str]:
    """Decoded values of every record visible under `isolation`, stopping after
    `idle_s` without a new one; once `want` records have arrived, as soon as every
    partition is read to its end (a duplicate already written is still read), or 0.5 s
    after the last record. `config`: more consumer settings (a secured listener's)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verifier", "isolation.level": isolation,
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  # the end is known when a fetch comes back empty: do not let it wait long
                  "fetch.wait.max.ms": 50, **(config or {})})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[str] = []
    at_end: set[int] = set()
    last = time.monotonic()
    while time.monotonic() - last < idle_s:
        m = c.poll(0.1)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(m.partition())
                if want is not None and len(values) >= want and len(at_end) == partitions:
                    break
            continue
        at_end.discard(m.partition())
        values.append(m.value().decode())
        last = time.monotonic()
        if want is not None and len(values) >= want:
            idle_s = min(idle_s, 0.5)
    c.close()
    return values
