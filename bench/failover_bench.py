"""Failover time: from SIGKILL of a partition's leader to the producer's first
acknowledged write after it, per broker session length (lease TTL).

One local cluster per TTL (etcd + three broker processes, semel.launch.local_cluster), one
partition with replication factor 3 and min.insync.replicas 2. An unmodified
confluent-kafka producer (acks=all, idempotent, library defaults otherwise) writes
without pause; each round waits for a full ISR, SIGKILLs the leader, and measures until
the first record sent after the kill is acknowledged. What the time is made of: the
lease running out (the controller only then sees the broker gone), the election (one
etcd transaction), and the client noticing (a refused connection or
NOT_LEADER_OR_FOLLOWER, then a Metadata refresh). The killed broker is restarted and
rejoins the ISR before the next round.

    python -m bench.failover_bench [--quick]
"""
from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path

from bench.common import RESULTS, main, write_result

TOPIC = "failover"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class _Writer:
    """A producer thread writing without pause; (sent, acknowledged) times of its records."""

    def __init__(self, bootstrap: str):
        from confluent_kafka import Producer
        self.acked: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                            "linger.ms": 0, "message.timeout.ms": 120_000})
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _report(self, sent: float, err) -> None:
        if err is None:
            self.acked.append((sent, time.monotonic()))
        else:
            self.failed += 1

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            if len(self._p) < 50:   # a few records in flight, as a steady writer has
                sent = time.monotonic()
                self._p.produce(TOPIC, value=b"%d" % n, partition=0,
                                on_delivery=lambda err, msg, sent=sent: self._report(sent, err))
                n += 1
            self._p.poll(0.002)
        self._p.flush(60)

    def first_ack_after(self, t: float, timeout_s: float = 120) -> float:
        """When the first record sent after t was acknowledged. (Acks of records sent
        before may still arrive after t: their responses were already on the way.)"""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            later = [acked for sent, acked in self.acked[-200:] if sent > t]
            if later:
                return min(later)
            time.sleep(0.005)
        raise TimeoutError("no acknowledged write after the leader was killed")

    def __enter__(self) -> "_Writer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(90)


def _rounds(ttl_s: int, rounds: int) -> list[dict]:
    from confluent_kafka.admin import AdminClient, NewTopic
    from semel.launch.local_cluster import LocalCluster
    from tests.support.cluster import partitions, wait_brokers
    from tests.support.wait import until
    out = []
    with tempfile.TemporaryDirectory(prefix="semel-failover-") as tmp:
        cluster = LocalCluster(Path(tmp), 3, lease_ttl_s=ttl_s)
        try:
            cluster.start()
            wait_brokers(cluster, {0, 1, 2})
            admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
            (fut,) = admin.create_topics([NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})]).values()
            fut.result(30)
            full = lambda: (st := partitions(cluster, TOPIC)[0]) and len(st[3]) == 3 and st  # noqa: E731
            with _Writer(cluster.bootstrap) as writer:
                for r in range(rounds):
                    leader = until(full, "leader with a full ISR", 120)[0]
                    until(lambda: len(writer.acked) > 0 and writer.acked[-1][1] > time.monotonic() - 0.5,
                          "the writer is being acknowledged", 60)
                    killed = time.monotonic()
                    cluster.brokers[leader].kill()
                    first = writer.first_ack_after(killed)
                    new_leader = until(lambda: (st := partitions(cluster, TOPIC)[0])[0] not in (-1, leader) and st,
                                       "new leader", 60)
                    out.append({"lease_ttl_s": ttl_s, "round": r, "killed": leader, "new_leader": new_leader[0],
                                "leader_epoch": new_leader[1], "failover_s": round(first - killed, 3)})
                    print(out[-1], flush=True)
                    cluster.brokers[leader].start()
                    wait_brokers(cluster, {0, 1, 2})
            assert writer.failed == 0, f"{writer.failed} writes failed"
        finally:
            cluster.stop()
            cluster.close()
    return out


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    ttls = [2] if quick else [2, 6]
    rounds = 2 if quick else 7
    rows = [row for ttl in ttls for row in _rounds(ttl, rounds)]
    summary = {}
    for ttl in ttls:
        times = [x["failover_s"] for x in rows if x["lease_ttl_s"] == ttl]
        summary[f"lease_ttl_{ttl}s"] = {"p50_s": round(statistics.median(times), 3),
                                        "p99_s": round(_percentile(times, 0.99), 3),
                                        "max_s": max(times), "rounds": len(times)}
    result = {
        "what": "seconds from SIGKILL of the partition leader to the producer's first acknowledged write after it",
        "cluster": "etcd + 3 semel broker processes on this machine (semel.launch.local_cluster); 1 partition, RF3, "
                   "min.insync.replicas 2",
        "client": "confluent-kafka, acks=all, idempotent, linger.ms 0, library defaults otherwise",
        "settings": {"lease_ttls_s": ttls, "rounds_per_ttl": rounds, "quick": quick},
        "summary": summary,
        "machine_name": "the 2-core shared development VM of this project (other sessions' tests ran meanwhile)",
        "note": ("Dominated by the lease TTL: the controller sees a SIGKILLed broker only when its lease "
                 "expires (up to TTL after the last keepalive, which is sent every TTL/3). A broker stopped "
                 "cleanly revokes its lease, so its partitions move at once. p99 of a handful of rounds is "
                 "close to their maximum."),
        "rows": rows,
    }
    write_result(out_dir, "failover", result)
    print(f"failover {summary}")
    return result


if __name__ == "__main__":
    main(run)
