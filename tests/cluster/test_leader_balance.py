"""Automatic preferred-leader balance on a real cluster (etcd and three broker processes):
a broker SIGKILLed and started again gets its partitions' leadership back on its own once
it is in sync again (auto.leader.rebalance.enable, checked every second here), while an
acks=all idempotent confluent-kafka producer runs across it and loses nothing."""
from __future__ import annotations

import threading

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.cluster import module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.wait import until
from tests.support.markers import starts_processes

TOPIC, PARTS = "balance", 6


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "balance", 3, 2, "--leader-imbalance-check-interval-seconds", "1",
                        "--replica-lag-time-max-ms", "1000", "--replica-fetch-wait-max-ms", "100") as c:
        yield c


def on_preferred(cluster) -> bool:
    return all(leader == replicas[0] for leader, _, replicas, _ in partitions(cluster, TOPIC).values())


def test_leadership_returns_to_a_restarted_broker_and_acks_all_loses_nothing(cluster):
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTS, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(30)
    until(lambda: all(len(p[3]) == 3 for p in partitions(cluster, TOPIC).values()), "full ISRs")
    assert on_preferred(cluster)
    before = partitions(cluster, TOPIC)
    victim = 1
    theirs = {i for i, p in before.items() if p[2][0] == victim}
    assert theirs

    acked, failed = [], []
    stop = threading.Event()

    def run():
        p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "topic.metadata.refresh.interval.ms": 500, "message.timeout.ms": 120000})
        i = 0
        while not stop.is_set():
            p.produce(TOPIC, value=b"%07d" % i, partition=i % PARTS,
                      on_delivery=lambda err, msg: (failed if err else acked).append(msg.value()))
            i += 1
            p.poll(0.002)
        assert p.flush(120) == 0
    worker = threading.Thread(target=run)
    worker.start()
    try:
        until(lambda: len(acked) > 200, "records acknowledged")
        cluster.brokers[victim].kill()
        until(lambda: all(p[0] not in (victim, -1) for p in partitions(cluster, TOPIC).values()),
              "leaders off the killed broker")
        n = len(acked)
        until(lambda: len(acked) > n + 200, "producing on the survivors")
        cluster.brokers[victim].start()
        wait_brokers(cluster, {0, 1, 2})
        until(lambda: on_preferred(cluster), "leadership back on the preferred replicas", 90)
        n = len(acked)
        until(lambda: len(acked) > n + 200, "producing after the move back")
    finally:
        stop.set()
        worker.join(150)
    after = partitions(cluster, TOPIC)
    for i in theirs:      # the failover's election, then the balance check's
        assert after[i][1] >= before[i][1] + 2
    assert failed == []
    got = read_values(cluster.bootstrap, TOPIC, PARTS, "read_uncommitted", want=len(acked))
    assert sorted(got) == sorted(v.decode() for v in acked)     # every acknowledged record, once
