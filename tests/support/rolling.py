"""A rolling restart of every broker of a LocalCluster under load, shared by the test
(tests/cluster/test_rolling_restart.py) and the benchmark (bench/rolling_restart.py).

Throughout, two unmodified confluent-kafka clients run in their own threads:
- an acks=all idempotent producer writing numbered records round-robin to DATA,
  noting when each was handed over and when its delivery report came;
- a transactional copier (read_committed consume, produce, send_offsets_to_transaction,
  commit; tests/support/copier.py, with the watchdog for librdkafka's hang) from SRC to
  DST, paced and held back between restarts so it is copying during each of them.

Each broker in turn gets SIGTERM (controlled shutdown), is started again and the next
one waits until every partition, internal ones included, has its full ISR back.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from tests.support.cluster import all_led, create_replicated, fill, wait_brokers
from tests.support.consume import read_values
from tests.support.copier import Copier
from tests.support.wait import in_background, until

DATA, SRC, DST, PARTS = "rr-data", "rr-in", "rr-out", 3
INTERNAL = ("__transaction_state", "__consumer_offsets")
SHUTDOWN_LINE = re.compile(rb"controlled shutdown: (\d+) leaderships handed over, (\d+) kept")
COPY_PACE_S = 0.2    # per transaction while the restarts go on
COPY_STEP = 10       # transactions per restart at most: 2000 records take at least 50


@dataclass
class Outcome:
    acked: list[bytes] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    sent_at: dict[bytes, float] = field(default_factory=dict)
    delivered_at: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    restarts: list[dict] = field(default_factory=list)     # per broker: timings and its handover
    input_values: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    data_values: list[str] = field(default_factory=list)
    copier_failures: list[str] = field(default_factory=list)
    copy_commits_before_last_restart: int = 0
    copy_commits: int = 0
    window: tuple[float, float] = (0.0, 0.0)

    def longest_stall_s(self, window: tuple[float, float] | None = None) -> float:
        """The longest time without a delivery report during the restarts (the producer
        sends all the time, so a gap is time when nothing got through)."""
        lo, hi = window or self.window
        times = sorted(t for t in self.delivered_at if lo <= t <= hi)
        edges = [lo, *times, hi]
        return max(b - a for a, b in zip(edges, edges[1:]))

    def summary(self) -> dict:
        lat = sorted(self.latencies)
        for r in self.restarts:   # where the stall was: while stopping, or while coming back
            began, stopped, synced = r.pop("_t")
            r["longest_stall_stopping_s"] = round(self.longest_stall_s((began, stopped)), 3)
            r["longest_stall_restarting_s"] = round(self.longest_stall_s((stopped, synced)), 3)
        return {"records_acknowledged": len(self.acked), "failed_deliveries": len(self.failed),
                "longest_produce_stall_s": round(self.longest_stall_s(), 3),
                "max_record_latency_s": round(lat[-1], 3) if lat else None,
                "p99_record_latency_s": round(lat[int(len(lat) * 0.99) - 1], 3) if lat else None,
                "copy_exact": sorted(self.copied) == sorted(self.input_values),
                "copy_records": len(self.input_values), "copy_transactions": self.copy_commits,
                "copier_errors_recovered": len(self.copier_failures),
                "restarts": self.restarts}


def settled(cluster) -> bool:
    """Every partition of the test's and the internal topics led, with all three in sync."""
    return all_led(cluster, (DATA, SRC, DST, *INTERNAL), full_isr=True)


def _handover(log_path, seen: int) -> tuple[int, int] | None:
    """(handed over, kept) of the broker's latest controlled shutdown after the first
    `seen` bytes of its log, None when its log has none."""
    found = SHUTDOWN_LINE.findall(log_path.read_bytes()[seen:])
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def rolling_restart(cluster, copy_records: int = 2000) -> Outcome:
    """Run the scenario on a started 3-broker cluster; what happened, for the caller to check."""
    from confluent_kafka import Producer
    out = Outcome()
    create_replicated(cluster, (DATA, SRC, DST), PARTS)
    out.input_values = fill(cluster, SRC, copy_records, PARTS)
    ends = {p: sum(1 for i in range(copy_records) if i % PARTS == p) for p in range(PARTS)}
    restarting = threading.Event()
    restarting.set()
    copier = Copier(cluster, SRC, DST, "rr-copy")
    copying = threading.Event()

    allowed = [COPY_STEP]          # commits the copier may reach before the next restart begins
    gate = threading.Condition()

    def paced(commits: int) -> None:
        """Slow, and held back between restarts, so work is left for every restart."""
        copying.set()
        if restarting.is_set():
            time.sleep(COPY_PACE_S)
        with gate:
            while restarting.is_set() and commits >= allowed[0]:
                gate.wait(0.5)

    def release() -> None:
        with gate:
            allowed[0] += COPY_STEP
            gate.notify_all()
    copy_thread, copy_errors = in_background(lambda: copier.run(ends, paced), copying)

    stop = threading.Event()

    def delivered(err, msg):
        now = time.monotonic()
        if err:
            out.failed.append(f"{msg.value()!r}: {err}")
            return
        out.acked.append(msg.value())
        out.delivered_at.append(now)
        out.latencies.append(now - out.sent_at.get(msg.value(), now))

    def produce() -> None:
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "message.timeout.ms": 120000})
        i = 0
        while not stop.is_set():
            v = b"%08d" % i
            out.sent_at[v] = time.monotonic()
            p.produce(DATA, value=v, partition=i % PARTS, on_delivery=delivered)
            i += 1
            p.poll(0.002)
        assert p.flush(120) == 0
    producing = threading.Event()
    prod_thread, prod_errors = in_background(produce, producing)
    try:
        until(lambda: len(out.acked) > 200 and copier.commits >= 2, "producing and copying")
        t0 = time.monotonic()
        for n, broker in enumerate(cluster.brokers):
            release()
            seen = broker.log_path.stat().st_size
            began = time.monotonic()
            broker.stop()
            stopped = time.monotonic()
            if n == len(cluster.brokers) - 1:
                out.copy_commits_before_last_restart = copier.commits
            broker.start()
            wait_brokers(cluster, {0, 1, 2})
            until(lambda: settled(cluster), "every partition back to a full ISR", 120)
            handed, kept = _handover(broker.log_path, seen) or (-1, -1)
            synced = time.monotonic()
            out.restarts.append({"broker": n, "shutdown_s": round(stopped - began, 3),
                                 "back_in_sync_s": round(synced - stopped, 3),
                                 "leaderships_handed_over": handed, "leaderships_kept": kept,
                                 "_t": (began, stopped, synced)})
        out.window = (t0, time.monotonic())
        n = len(out.acked)
        until(lambda: len(out.acked) > n + 200, "producing after the restarts")
    finally:
        restarting.clear()
        release()
        stop.set()
        prod_thread.join(150)
        copy_thread.join(300)
    assert not prod_errors and not prod_thread.is_alive(), prod_errors
    assert not copy_errors and not copy_thread.is_alive(), (copy_errors, copier.failures[-5:])
    out.copy_commits = copier.commits
    out.copier_failures = list(copier.failures)
    out.copied = read_values(cluster.bootstrap, DST, PARTS, "read_committed", want=copy_records)
    out.data_values = read_values(cluster.bootstrap, DATA, PARTS, "read_uncommitted", want=len(out.acked))
    return out
