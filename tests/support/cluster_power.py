"""Power cuts of a real 3-broker cluster under load, each broker's data directory (and
etcd's) on its own power-cut disk (semel.launch.lazyfs: whatever was not fsynced is gone
when the power goes, creations, renames and removals included).

Throughout, the two clients of tests/support/cluster_traffic.py run: an acks=all
idempotent producer writing numbered records to DATA and a transactional copier from
SRC to DST. A cut
either takes the whole cluster (every broker and etcd at once: SIGKILL, then each disk
drops what it had not synced) or one broker; then the dead start again, in a random
order. The caller checks what survived: every acknowledged record once, the copy exact.
"""
from __future__ import annotations

import random
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from semel.launch.lazyfs import PowerCutDisk
from semel.launch.local_cluster import LocalCluster
from tests.support.cluster import all_led, wait_brokers
from tests.support.cluster_traffic import Clients, Topics, Traffic
from tests.support.wait import until

DATA, SRC, DST, PARTS = "pc-data", "pc-in", "pc-out", 3
INTERNAL = ("__transaction_state", "__consumer_offsets")
WHOLE = "whole cluster"


@dataclass
class Outcome(Traffic):
    cuts: list[str] = field(default_factory=list)


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
    cluster, rng, out = pc.cluster, random.Random(seed), Outcome()

    def paced(commits: int) -> None:
        time.sleep(0.15)      # slow enough that every cut finds the copy under way
    clients = Clients(cluster, Topics(DATA, SRC, DST, PARTS), out, copy_records, "pc-copy", paced,
                      delivery_timeout_s=300)
    try:
        clients.wait_running(120)
        for what in schedule:
            clients.wait_acks(100, "acknowledgements before the cut", 180)
            time.sleep(rng.uniform(0, 0.5))
            out.cuts.append(f"{what} after {len(out.acked)} acks, {clients.copier.commits} copy commits")
            if what == WHOLE:
                pc.cut_all(rng)
            else:
                pc.cut_one(int(what))
            wait_brokers(cluster, {0, 1, 2})
            until(lambda: led(cluster), "every partition led again", 120)
        clients.wait_acks(100, "producing after the last cut", 180)
    finally:
        clients.stop(330)
    clients.finish()
    return out
