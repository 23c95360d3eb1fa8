"""Power cuts of a real 3-broker cluster under load, each broker's data directory (and
etcd's) on its own power-cut disk (semel.launch.lazyfs: whatever was not fsynced is gone
when the power goes, creations, renames and removals included).

Throughout, two unmodified confluent-kafka clients run in their own threads, as in
tests/support/rolling.py: an acks=all idempotent producer writing numbered records to
DATA, noting each acknowledgement, and a transactional copier from SRC to DST. A cut
either takes the whole cluster (every broker and etcd at once: SIGKILL, then each disk
drops what it had not synced) or one broker; then the dead start again, in a random
order. The caller checks what survived: every acknowledged record once, the copy exact.
"""
from __future__ import annotations

import random
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from semel.launch.lazyfs import PowerCutDisk
from semel.launch.local_cluster import LocalCluster
from tests.support.cluster import all_led, create_replicated, fill, wait_brokers
from tests.support.consume import read_values
from tests.support.copier import Copier
from tests.support.wait import in_background, until

DATA, SRC, DST, PARTS = "pc-data", "pc-in", "pc-out", 3
INTERNAL = ("__transaction_state", "__consumer_offsets")
WHOLE = "whole cluster"


@dataclass
class Outcome:
    acked: list[bytes] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cuts: list[str] = field(default_factory=list)
    input_values: list[str] = field(default_factory=list)
    copied: list[str] = field(default_factory=list)
    data_values: list[str] = field(default_factory=list)
    copier_failures: list[str] = field(default_factory=list)
    copy_commits: int = 0


class PowerCutCluster:
    """A LocalCluster whose brokers and etcd keep their data on power-cut disks."""

    def __init__(self, root: Path, nodes: int = 3, broker_args: list[str] = (), lease_ttl_s: int = 2):
        self.root = Path(root)
        home = self.root / "cluster"
        names = [f"broker-{n}" for n in range(nodes)] + ["etcd"]
        self.disks = {name: PowerCutDisk(self.root / "backing" / name, home / name) for name in names}
        self.cluster = LocalCluster(home, nodes, lease_ttl_s=lease_ttl_s, broker_args=list(broker_args))

    def start(self) -> LocalCluster:
        for disk in self.disks.values():
            disk.start()
        self.cluster.start()
        wait_brokers(self.cluster, set(range(len(self.cluster.brokers))))
        return self.cluster

    def stop(self) -> None:
        try:
            self.cluster.stop()
            self.cluster.close()
        finally:
            for disk in self.disks.values():
                disk.stop()

    def cut_all(self, rng: random.Random) -> None:
        """Power off every broker and etcd at once, then on again (etcd first, as a real
        cluster's metadata quorum comes back; the brokers in a random order)."""
        for b in self.cluster.brokers:
            b.kill()
        self.cluster.etcd.kill()
        for disk in self.disks.values():
            disk.cut()
        self.cluster.etcd.start()
        order = list(self.cluster.brokers)
        rng.shuffle(order)
        for b in order:
            b.start()

    def cut_one(self, n: int) -> None:
        broker = self.cluster.brokers[n]
        broker.kill()
        self.disks[f"broker-{n}"].cut()
        broker.start()


@contextmanager
def power_cut_cluster(root: Path, *broker_args: str):
    pc = PowerCutCluster(root, broker_args=list(broker_args))
    with ExitStack() as stack:
        stack.callback(pc.stop)
        pc.start()
        yield pc


def led(cluster) -> bool:
    """Every partition of the test's and the internal topics has a leader."""
    return all_led(cluster, (DATA, SRC, DST, *INTERNAL))


def run_power_cuts(pc: PowerCutCluster, schedule: list[str | int], seed: int, copy_records: int = 1500) -> Outcome:
    """Cut the power as `schedule` says (WHOLE, or a broker's node id), each at a random
    moment while both clients work; then let both finish and read what survived."""
    from confluent_kafka import Producer
    cluster, rng, out = pc.cluster, random.Random(seed), Outcome()
    create_replicated(cluster, (DATA, SRC, DST), PARTS)
    out.input_values = fill(cluster, SRC, copy_records, PARTS)
    ends = {p: sum(1 for i in range(copy_records) if i % PARTS == p) for p in range(PARTS)}
    copier = Copier(cluster, SRC, DST, "pc-copy")
    copying = threading.Event()

    def paced(commits: int) -> None:
        copying.set()
        time.sleep(0.15)      # slow enough that every cut finds the copy under way
    copy_thread, copy_errors = in_background(lambda: copier.run(ends, paced), copying)

    stop = threading.Event()

    def delivered(err, msg):
        if err:
            out.failed.append(f"{msg.value()!r}: {err}")
        else:
            out.acked.append(msg.value())

    def produce() -> None:
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "message.timeout.ms": 300000})
        i = 0
        while not stop.is_set():
            p.produce(DATA, value=b"%08d" % i, partition=i % PARTS, on_delivery=delivered)
            i += 1
            p.poll(0.002)
        assert p.flush(300) == 0
    producing = threading.Event()
    prod_thread, prod_errors = in_background(produce, producing)
    try:
        until(lambda: len(out.acked) > 200 and copier.commits >= 2, "producing and copying", 120)
        for what in schedule:
            n = len(out.acked)
            until(lambda: len(out.acked) > n + 100, "acknowledgements before the cut", 180)
            time.sleep(rng.uniform(0, 0.5))
            out.cuts.append(f"{what} after {len(out.acked)} acks, {copier.commits} copy commits")
            if what == WHOLE:
                pc.cut_all(rng)
            else:
                pc.cut_one(int(what))
            wait_brokers(cluster, {0, 1, 2})
            until(lambda: led(cluster), "every partition led again", 120)
        n = len(out.acked)
        until(lambda: len(out.acked) > n + 100, "producing after the last cut", 180)
    finally:
        stop.set()
        prod_thread.join(330)
        copy_thread.join(240)
    assert not prod_errors and not prod_thread.is_alive(), prod_errors
    assert not copy_errors and not copy_thread.is_alive(), (copy_errors, copier.failures[-5:])
    out.copy_commits = copier.commits
    out.copier_failures = list(copier.failures)
    out.copied = read_values(cluster.bootstrap, DST, PARTS, "read_committed", want=copy_records)
    out.data_values = read_values(cluster.bootstrap, DATA, PARTS, "read_uncommitted", want=len(out.acked))
    return out
