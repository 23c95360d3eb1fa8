"""The demo's verifier, independent of the processor: an unmodified confluent-kafka
consumer under read_committed, plain SQL and the files the filesystem sink
committed. Each output is compared with the doubled inputs 1..N."""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..client.quiet import quiet_logger
from .job import INPUT, OUTPUT, TABLE


@dataclass(frozen=True)
class Tally:
    """One output as a reader sees it, against the expected values."""
    name: str
    count: int
    duplicates: int
    missing: int
    unexpected: int

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.missing == 0 and self.unexpected == 0


def tally(name: str, values: list[int], expected: set[int]) -> Tally:
    seen = Counter(values)
    return Tally(name, len(values), sum(c - 1 for c in seen.values() if c > 1),
                 len(expected - seen.keys()), len(seen.keys() - expected))


class TopicReader:
    """Reads a topic's committed values incrementally (one consumer for the whole demo)."""

    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka import Consumer, TopicPartition
        self.topic, self.values = topic, []
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"semel-demo-verify-{topic}",
                           "isolation.level": "read_committed", "enable.auto.commit": False,
                           "enable.partition.eof": True, "logger": quiet_logger("semel.demo.librdkafka")})
        parts = self.c.list_topics(topic, timeout=30).topics[topic].partitions
        self.c.assign([TopicPartition(topic, p, 0) for p in parts])

    def poll(self, budget_s: float = 0.5) -> list[int]:
        """Whatever became visible since the last call (returns within about budget_s)."""
        msgs = self.c.consume(10_000, budget_s)
        self.values += [int(m.value()) for m in msgs if m.error() is None]
        return self.values

    def close(self) -> None:
        self.c.close()


def sql_values(postgres: str) -> list[int]:
    import psycopg
    with psycopg.connect(postgres) as conn:
        if conn.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone()[0] is None:
            return []
        return [v for (v,) in conn.execute(f"SELECT v FROM {TABLE} WHERE NOT pending")]


def file_values(root: Path) -> list[int]:
    committed = root / "committed"
    if not committed.is_dir():
        return []
    out = []
    for f in sorted(committed.iterdir()):
        if f.name.endswith(".batch"):  # the sink's committed files; never its temp files
            out += [json.loads(line)["v"] for line in f.read_text().splitlines() if line.strip()]
    return out


def create_table(postgres: str) -> None:
    """The table the PostgreSQL sink writes in table mode (txn id and pending flag)."""
    import psycopg
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (k text, v bigint, txn_id text NOT NULL, "
                     "pending boolean NOT NULL)")


__all__ = ["INPUT", "OUTPUT", "Tally", "TopicReader", "create_table", "file_values", "sql_values", "tally"]
