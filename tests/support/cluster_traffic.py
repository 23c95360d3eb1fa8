"""The two clients the cluster fault tests run while they do harm (tests/support/rolling.py,
tests/support/cluster_power.py), and reading back what survived.

Both are unmodified confluent-kafka clients in their own threads:
- an acks=all idempotent producer writing numbered records round-robin to `data`,
  noting when each was handed over and when its delivery report came;
- a transactional copier (tests/support/copier.py) from `src` to `dst`, paced by the
  caller so it is still copying when the harm comes.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from tests.support.cluster import create_replicated, fill
from tests.support.consume import read_values
from tests.support.copier import Copier
from tests.support.wait import in_background, until


@dataclass
class Traffic:
    """What the clients saw; the fault tests' outcomes extend it."""
    acked: list[bytes] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    sent_at: dict[bytes, float] = field(default_factory=dict)
    delivered_at: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    input_values: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    data_values: list[str] = field(default_factory=list)
    copier_failures: list[str] = field(default_factory=list)
    copy_commits: int = 0


@dataclass(frozen=True)
class Topics:
    data: str
    src: str
    dst: str
    parts: int


class Clients:
    """Creates the topics, fills `src` with `copy_records` values and runs both clients
    until finish(), which joins them, asserts they ended without an error and reads
    back `dst` (read_committed) and `data` (everything acknowledged) into `out`."""

    def __init__(self, cluster, topics: Topics, out: Traffic, copy_records: int, group: str,
                 paced: Callable[[int], None], delivery_timeout_s: int):
        self.cluster, self.topics, self.out = cluster, topics, out
        self.copy_records, self.delivery_timeout_s = copy_records, delivery_timeout_s
        create_replicated(cluster, (topics.data, topics.src, topics.dst), topics.parts)
        out.input_values = fill(cluster, topics.src, copy_records, topics.parts)
        ends = {p: sum(1 for i in range(copy_records) if i % topics.parts == p) for p in range(topics.parts)}
        self.copier = Copier(cluster, topics.src, topics.dst, group)
        self._stop = threading.Event()
        self._copy = in_background(lambda: self.copier.run(ends, paced), threading.Event())
        self._produce = in_background(self._run_producer, threading.Event())

    def _delivered(self, err, msg) -> None:
        now = time.monotonic()
        if err:
            self.out.failed.append(f"{msg.value()!r}: {err}")
            return
        self.out.acked.append(msg.value())
        self.out.delivered_at.append(now)
        self.out.latencies.append(now - self.out.sent_at.get(msg.value(), now))

    def _run_producer(self) -> None:
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "message.timeout.ms": self.delivery_timeout_s * 1000})
        i = 0
        while not self._stop.is_set():
            v = b"%08d" % i
            self.out.sent_at[v] = time.monotonic()
            p.produce(self.topics.data, value=v, partition=i % self.topics.parts, on_delivery=self._delivered)
            i += 1
            p.poll(0.002)
        assert p.flush(self.delivery_timeout_s) == 0

    def wait_running(self, timeout_s: float = 60) -> None:
        """Until records are acknowledged and the copier has committed twice."""
        until(lambda: len(self.out.acked) > 200 and self.copier.commits >= 2, "producing and copying", timeout_s)

    def wait_acks(self, more: int, what: str, timeout_s: float = 60) -> None:
        n = len(self.out.acked)
        until(lambda: len(self.out.acked) > n + more, what, timeout_s)

    def stop(self, join_s: float) -> None:
        """Stop producing and let both threads end (the caller's finally)."""
        self._stop.set()
        self._produce[0].join(join_s)
        self._copy[0].join(join_s)

    def finish(self) -> None:
        (prod_thread, prod_errors), (copy_thread, copy_errors) = self._produce, self._copy
        assert not prod_errors and not prod_thread.is_alive(), prod_errors
        assert not copy_errors and not copy_thread.is_alive(), (copy_errors, self.copier.failures[-5:])
        out, t, bootstrap = self.out, self.topics, self.cluster.bootstrap
        out.copy_commits = self.copier.commits
        out.copier_failures = list(self.copier.failures)
        out.copied = read_values(bootstrap, t.dst, t.parts, "read_committed", want=self.copy_records)
        out.data_values = read_values(bootstrap, t.data, t.parts, "read_uncommitted", want=len(out.acked))
