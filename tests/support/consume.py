"""Read everything a topic holds, as a verifier would: by assignment from offset 0."""
from __future__ import annotations

import time


def read_values(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed",
                idle_s: float = 1.5, want: int | None = None, config: dict | None = None) -> list[str]:
    """Decoded values of every record visible under `isolation`, stopping after
    `idle_s` without a new one (0.5 s once `want` records have arrived). `config`:
    more consumer settings (a secured listener's)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verifier", "isolation.level": isolation,
                  "enable.auto.commit": False, **(config or {})})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values: list[str] = []
    last = time.monotonic()
    while time.monotonic() - last < idle_s:
        m = c.poll(0.1)
        if m is None or m.error():
            continue
        values.append(m.value().decode())
        last = time.monotonic()
        if want is not None and len(values) >= want:
            idle_s = min(idle_s, 0.5)
    c.close()
    return values
