"""Uniquely named topics for one test, deleted when it ends: tests that share a
broker never see each other's records."""
from __future__ import annotations

import re
import time
import uuid
from typing import Callable

from ..client.client import Client, ClientError
from ..protocol.errors import KafkaError


class TopicFactory:
    """make(...) creates a topic and returns its name; close() deletes them all.

    `connect()` opens a (logged-in) semel Client to the broker; `prefix` starts every
    name (the test's name, so a topic left on a shared broker says whose it was)."""

    def __init__(self, connect: Callable[[], Client], prefix: str = "t", replication_factor: int = 1,
                 ready_timeout_s: float = 30.0):
        self.connect = connect
        self.prefix = re.sub(r"[^A-Za-z0-9._-]+", "-", prefix).strip("-")[:80] or "t"
        self.replication_factor = replication_factor
        self.ready_timeout_s = ready_timeout_s
        self.created: list[str] = []

    def make(self, name: str | None = None, partitions: int = 1, config: dict[str, str] | None = None,
             replication_factor: int | None = None) -> str:
        """Create a topic (name: prefix + a unique suffix unless given) with these
        partitions and topic configs (Kafka's names, e.g. {"cleanup.policy": "compact"});
        returns once every partition has a leader."""
        name = name or f"{self.prefix}-{uuid.uuid4().hex[:8]}"
        rf = replication_factor or self.replication_factor
        with self.connect() as c:
            err = c.create_topic(name, partitions, {k: str(v) for k, v in (config or {}).items()}, rf)
            if err != KafkaError.NONE:
                raise ClientError(f"cannot create topic {name} ({partitions} partitions, replication {rf}): "
                                  f"{err.name}", err)
            self.created.append(name)
            self._wait_leaders(c, name)
        return name

    __call__ = make

    def _wait_leaders(self, c: Client, name: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            t = c.metadata([name]).topics[0]
            if not t.error_code and t.partitions and all(p.leader_id >= 0 for p in t.partitions):
                return
            if time.monotonic() > deadline:
                raise ClientError(f"topic {name} has no leader for every partition after {self.ready_timeout_s}s")
            time.sleep(0.02)

    def close(self) -> None:
        """Delete the topics made here (a broker that is down keeps them: it is a test's own)."""
        if not self.created:
            return
        try:
            with self.connect() as c:
                for name in self.created:
                    c.delete_topic(name)
        except (ClientError, OSError):
            pass
        self.created.clear()
