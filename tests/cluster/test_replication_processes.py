"""Replication on a real local cluster: etcd and three broker processes
(semel.cluster.local), unmodified confluent-kafka clients, real signals.

- acks=all while the partition's leader is SIGKILLed: every acknowledged record is
  there exactly once once the cluster settles, and all replicas agree byte for byte;
- a follower stopped (SIGSTOP) past replica.lag.time.max.ms leaves the ISR and joins
  again after SIGCONT.
"""
from __future__ import annotations

import threading

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.wait import until

LAG_MS = 1000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "replication", 3, 6, "--replica-lag-time-max-ms", str(LAG_MS),
                        "--replica-fetch-wait-max-ms", "100") as c:
        yield c


def create(cluster, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "2"})])[topic].result(30)
    until(lambda: len(partitions(cluster, topic)[0][3]) == 3, f"{topic}: leader and a full ISR")


def log_files(cluster, topic: str) -> list[bytes]:
    """Each broker's segment files of partition 0, concatenated."""
    out = []
    for b in cluster.brokers:
        files = sorted(b.data_dir.glob(f"{topic}-0/*.log"))
        out.append(b"".join(f.read_bytes() for f in files))
    return out


def test_acks_all_survives_a_sigkilled_leader_exactly_once(cluster):
    create(cluster, "kill")
    leader = partitions(cluster, "kill")[0][0]
    acked, failed = [], []
    halfway = threading.Event()

    def delivered(err, msg):
        (failed if err else acked).append(msg.value())
        if len(acked) >= 1000:
            halfway.set()
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "topic.metadata.refresh.interval.ms": 500, "message.timeout.ms": 60000})
    for i in range(4000):
        p.produce("kill", value=b"%06d" % i, partition=0, on_delivery=delivered)
        p.poll(0)
        if i == 2000:
            assert p.flush(30) == 0 and halfway.is_set()
            cluster.brokers[leader].kill()
    assert p.flush(90) == 0
    assert failed == []
    new_leader = partitions(cluster, "kill")[0][0]
    assert new_leader not in (leader, -1)
    cluster.brokers[leader].restart()
    wait_brokers(cluster, {0, 1, 2})
    until(lambda: len(partitions(cluster, "kill")[0][3]) == 3, "the killed broker back in the ISR")
    got = read_values(cluster.bootstrap, "kill", 1, "read_uncommitted", idle_s=2.0, want=len(acked))
    assert sorted(got) == sorted(v.decode() for v in acked)      # every acknowledged record, once
    assert len(acked) == 4000
    until(lambda: len(set(log_files(cluster, "kill"))) == 1, "three identical replicas")


def test_a_stopped_follower_leaves_the_isr_and_rejoins(cluster):
    create(cluster, "pause")
    leader, _, replicas, _ = partitions(cluster, "pause")[0]
    follower = next(r for r in replicas if r != leader)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    cluster.brokers[follower].pause()
    try:
        for i in range(200):
            p.produce("pause", value=b"p%d" % i, partition=0)
        assert p.flush(30) == 0        # completes once the stopped follower is out of the ISR
        until(lambda: follower not in partitions(cluster, "pause")[0][3], "follower out of the ISR", 10)
    finally:
        cluster.brokers[follower].resume()
    until(lambda: follower in partitions(cluster, "pause")[0][3], "follower back in the ISR", 30)
    until(lambda: len(set(log_files(cluster, "pause"))) == 1, "the follower caught up byte for byte")
