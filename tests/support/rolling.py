"""A rolling restart of every broker of a LocalCluster under load, shared by the test
(tests/cluster/test_rolling_restart.py) and the benchmark (bench/rolling_restart.py).

Throughout, the two clients of tests/support/cluster_traffic.py run: an acks=all
idempotent producer writing numbered records round-robin to DATA, and a transactional
copier from SRC to DST, paced and held back between restarts so it is copying during
each of them.

Each broker in turn gets SIGTERM (controlled shutdown), is started again and the next
one waits until every partition, internal ones included, has its full ISR back.
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

from tests.support.cluster import all_led, wait_brokers
from tests.support.cluster_traffic import Clients, Topics, Traffic
from tests.support.wait import until

DATA, SRC, DST, PARTS = "rr-data", "rr-in", "rr-out", 3
INTERNAL = ("__transaction_state", "__consumer_offsets")
SHUTDOWN_LINE = re.compile(rb"controlled shutdown: (\d+) leaderships handed over, (\d+) kept")
COPY_PACE_S = 0.2    # per transaction while the restarts go on
COPY_STEP = 10       # transactions per restart at most: 2000 records take at least 50


@dataclass
class Outcome(Traffic):
    restarts: list[dict] = field(default_factory=list)     # per broker: timings and its handover
    copy_commits_before_last_restart: int = 0
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
    out = Outcome()
    restarting = threading.Event()
    restarting.set()
    allowed = [COPY_STEP]          # commits the copier may reach before the next restart begins
    gate = threading.Condition()

    def paced(commits: int) -> None:
        """Slow, and held back between restarts, so work is left for every restart."""
        if restarting.is_set():
            time.sleep(COPY_PACE_S)
        with gate:
            while restarting.is_set() and commits >= allowed[0]:
                gate.wait(0.5)

    def release() -> None:
        with gate:
            allowed[0] += COPY_STEP
            gate.notify_all()
    clients = Clients(cluster, Topics(DATA, SRC, DST, PARTS), out, copy_records, "rr-copy", paced,
                      delivery_timeout_s=120)
    copier = clients.copier
    try:
        clients.wait_running()
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
        clients.wait_acks(200, "producing after the restarts")
    finally:
        restarting.clear()
        release()
        clients.stop(300)
    clients.finish()
    return out
