"""A broker that may lack records it once reported to its leaders leaves every ISR
before it registers, so no election can pick it over a replica that has them; its
leaders take it back once it has caught up (semel.cluster.member, elections.leave_isr).

On a real 3-broker cluster all three brokers go down at once (so no controller is left
to shrink the ISRs: the last ISR of every partition names all three), and the broker
that may have lost records comes back first, alone:
- one whose data directory was wiped meanwhile (a new disk), under the default policy:
  were it elected, the others would truncate to its empty log and every record would
  be gone;
- one that was SIGKILLed while running with `--flush-mode interval` (an unclean stop
  without the durable policy).
Then the other two come back; every acknowledged record must still be there, and the
broker rejoins every ISR once it has caught up."""
from __future__ import annotations

import shutil

import pytest

from semel.launch.local_cluster import LocalCluster
from tests.support.cluster import all_led, create_replicated, fill, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.wait import until

pytestmark = pytest.mark.process


def in_every_isr(cluster, topic: str, node: int) -> bool:
    return all(node in isr for _, _, _, isr in partitions(cluster, topic).values())


def lossy_first(tmp_path, name: str, node: int, broker_args: list[str], wipe: bool) -> None:
    c = LocalCluster(tmp_path / name, 3, lease_ttl_s=2, broker_args=broker_args)
    try:
        c.start()
        wait_brokers(c, {0, 1, 2})
        create_replicated(c, ["lossy"], 2)
        values = fill(c, "lossy", 200, 2)
        until(lambda: all(in_every_isr(c, "lossy", n) for n in range(3)), "every broker in every ISR")
        for b in c.brokers:
            b.kill()
        if wipe:
            shutil.rmtree(c.brokers[node].data_dir)
        c.brokers[node].start()
        log = c.brokers[node].log_path
        until(lambda: "lossy-0: left the ISR" in log.read_text(errors="replace"), f"broker {node} left the ISR", 60)
        for n, b in enumerate(c.brokers):
            if n != node:
                b.start()
        wait_brokers(c, {0, 1, 2})
        until(lambda: all_led(c, ["lossy"]), "every partition led")
        # Leaders have just moved: the reader may need a few seconds (metadata, leader
        # epochs) before its first record, more than read_values' default 1.5 s.
        assert sorted(read_values(c.bootstrap, "lossy", 2, "read_uncommitted", want=200, idle_s=15)) == sorted(values)
        until(lambda: in_every_isr(c, "lossy", node), f"broker {node} back in every ISR once caught up", 60)
    finally:
        c.stop()
        c.close()


def test_a_wiped_disk_is_never_elected_over_the_replicas_that_have_the_records(tmp_path):
    lossy_first(tmp_path, "wiped", 1, ["--replica-lag-time-max-ms", "3000"], wipe=True)


def test_an_unclean_stop_without_the_durable_policy_leaves_the_isr_first(tmp_path):
    lossy_first(tmp_path, "interval", 2, ["--flush-mode", "interval", "--replica-lag-time-max-ms", "3000"],
                wipe=False)
