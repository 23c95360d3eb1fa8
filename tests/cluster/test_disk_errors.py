"""Disk errors on a cluster member (3 brokers, RF 3, min.insync.replicas 2, acks=all):
fsyncs or writes of one partition's log start failing with EIO on one broker (the
storage seam's faults, armed in the running process through its control file). That
broker stops serving the partition and leaves its ISR (semel.cluster.offline): a
leader hands over, so the acks=all producer keeps going on another leader and nothing
it could not persist is acknowledged; once the disk works again the broker reopens
the log, follows, and is taken back into the ISR. At the end every acknowledged
record is in the partition exactly once."""
from __future__ import annotations

import os
import threading

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from semel.launch.local_cluster import LocalCluster
from tests.support.cluster import partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.wait import in_background, until

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def disks(tmp_path_factory):
    d = tmp_path_factory.mktemp("disk-errors")
    c = LocalCluster(d, 3, lease_ttl_s=2, broker_args=["--replica-lag-time-max-ms", "3000",
                                                       "--replica-fetch-wait-max-ms", "100"])
    for n, b in enumerate(c.brokers):
        b.env["SEMEL_FS_FAULTS"] = f"control_file={d / f'faults-{n}'}"
    try:
        c.start()
        wait_brokers(c, {0, 1, 2})
        yield c, d
    finally:
        c.stop()
        c.close()


def arm(d, node: int, spec: str) -> None:
    """Arm faults in broker `node` and wait until it took them (it deletes the file)."""
    path = d / f"faults-{node}"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(spec)
    os.replace(tmp, path)
    until(lambda: not path.exists(), f"broker {node} armed {spec}", 10)


def produce_until(cluster, topic: str, stop: threading.Event, acked: list, failed: list) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": 120000})

    def delivered(err, msg):
        (failed if err else acked).append(f"{msg.value()!r}: {err}" if err else msg.value().decode())
    i = 0
    while not stop.is_set():
        p.produce(topic, value=b"%08d" % i, partition=0, on_delivery=delivered)
        i += 1
        p.poll(0.003)
    assert p.flush(120) == 0


@pytest.mark.parametrize("node,spec", [(0, "fail_next_fsync=1000000"), (1, "fail_next_write=1000000")],
                         ids=["leader-fsync", "follower-write"])
def test_a_failing_disk_hands_the_partition_over_and_it_comes_back(disks, node, spec):
    cluster, d = disks
    topic = f"de-{node}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(topic, 1, replica_assignment=[[0, 1, 2]], config={"min.insync.replicas": "2"})
    admin.create_topics([new])[topic].result(30)
    until(lambda: partitions(cluster, topic)[0][3] == (0, 1, 2), "a full ISR led by broker 0")
    acked: list[str] = []
    failed: list[str] = []
    stop = threading.Event()
    worker, errors = in_background(lambda: produce_until(cluster, topic, stop, acked, failed), threading.Event())
    try:
        until(lambda: len(acked) > 300, "acknowledgements before the fault")
        arm(d, node, f"{spec},path_contains={topic}-0")
        until(lambda: node not in partitions(cluster, topic)[0][3], f"broker {node} out of the ISR", 30)
        leader, _, _, isr = partitions(cluster, topic)[0]
        assert leader != node and leader >= 0 and len(isr) == 2
        n = len(acked)
        until(lambda: len(acked) > n + 300, "acknowledgements while the disk fails", 60)
        arm(d, node, "clear=1")
        until(lambda: node in partitions(cluster, topic)[0][3], f"broker {node} back in the ISR", 90)
        n = len(acked)
        until(lambda: len(acked) > n + 100, "acknowledgements after it came back", 60)
    finally:
        stop.set()
        worker.join(150)
    assert not errors, errors
    assert failed == [], failed[:5]
    stored = read_values(cluster.bootstrap, topic, 1, "read_uncommitted", want=len(acked))
    assert sorted(stored) == sorted(acked)      # every acknowledged record, once
    log = cluster.brokers[node].log_path.read_text(errors="replace")
    assert f"{topic}-0: offline on this broker" in log and f"{topic}-0: disk works again" in log
