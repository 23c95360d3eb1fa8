"""The consumer group protocol (KIP-848) on a real local cluster (etcd and three broker
processes): a confluent-kafka member on `group.protocol=consumer` reads a replicated
topic; the group coordinator's broker is SIGKILLed; the next leader of
`__consumer_offsets` serves the same group (epochs, member, assignment, read from the
replicated log), the member goes on at its epoch and reads what comes next, each
record once."""
from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from semel.client.client import Client
from semel.protocol.api_keys import ApiKey
from tests.support.cluster import leader_of, module_cluster, wait_brokers
from tests.support.consumer_protocol import Member, wait_for
from tests.support.markers import starts_processes
from tests.support.wait import until

OFFSETS_TOPIC = "__consumer_offsets"
PARTS = 3
N = 30   # per partition


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "consumer-protocol", 3, 2, "--min-insync-replicas", "2",
                        "--offsets-topic-partitions", "1", "--group-consumer-heartbeat-interval-ms", "500",
                        "--group-consumer-session-timeout-ms", "30000") as c:
        yield c


def view(cluster, node: int, group: str):
    with Client(cluster.brokers[node].bootstrap, timeout_s=10) as c:
        (g,) = c.request(ApiKey.CONSUMER_GROUP_DESCRIBE, group_ids=[group],
                         include_authorized_operations=False).groups
    return g


def served_by(cluster, node: int, group: str):
    """The group as `node` describes it, once it serves it."""
    def served():
        try:
            g = view(cluster, node, group)
        except Exception:   # still loading, or the view has not moved yet
            return None
        return g if g.error_code == 0 else None
    return until(served, f"group {group} served by broker {node}", 90)


def members_of(g) -> list:
    return [(x.member_id, x.member_epoch, sorted((t.topic_name, tuple(t.partitions))
                                                 for t in x.assignment.topic_partitions))
            for x in g.members]


def produce(bootstrap: str, topic: str, tag: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for part in range(PARTS):
        for i in range(N):
            p.produce(topic, value=f"{tag}-{part}-{i}".encode(), partition=part)
    assert p.flush(60) == 0


def started_member(cluster, topic: str, group: str) -> Member:
    """A replicated topic filled with N records a partition, and a member reading it."""
    wait_brokers(cluster, {0, 1, 2})
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, PARTS, 3)])[topic].result(30)
    produce(cluster.bootstrap, topic, "a")
    m = Member(cluster.bootstrap, group, [topic])
    m.start()
    return m


def test_group_moves_with_the_coordinator(cluster):
    m = started_member(cluster, "cp-in", "cp-group")
    victim = None
    try:
        wait_for(lambda: m.count() >= PARTS * N, 90, "every record before the failover")
        victim = leader_of(cluster, OFFSETS_TOPIC)
        before = view(cluster, victim, "cp-group")
        assert before.group_state == "Stable" and len(before.members) == 1
        cluster.brokers[victim].kill()
        successor = leader_of(cluster, OFFSETS_TOPIC, skip={victim})

        after = served_by(cluster, successor, "cp-group")
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert [(x.member_id, x.member_epoch) for x in after.members] == \
            [(x.member_id, x.member_epoch) for x in before.members]
        produce(cluster.bootstrap, "cp-in", "b")
        wait_for(lambda: m.count() >= 2 * PARTS * N, 120, "records produced after the failover")
        assert [x.member_id for x in view(cluster, successor, "cp-group").members] == [before.members[0].member_id]
    finally:
        m.stop()
        if victim is not None:
            cluster.brokers[victim].restart()
    values = [(t, p, o) for t, p, o in m.seen]
    assert len(values) == len(set(values)) == 2 * PARTS * N


def test_group_survives_a_reassignment_of_its_offsets_partition(cluster):
    """__consumer_offsets-0 is moved off the broker leading it (kafka-python's admin, as an
    operator does): the broker it moves to loads the group from the replicated log with the
    same epochs, member and assignment, and the member goes on reading, each record once."""
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient

    from tests.support.cluster import partitions
    m = started_member(cluster, "cp-ra", "cp-ra-group")
    kp = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        wait_for(lambda: m.count() >= PARTS * N, 90, "every record before the move")
        leader = leader_of(cluster, OFFSETS_TOPIC)
        until(lambda: view(cluster, leader, "cp-ra-group").group_state == "Stable" or None,
              "a stable group", 60)
        before = view(cluster, leader, "cp-ra-group")
        _, _, replicas, _ = partitions(cluster, OFFSETS_TOPIC)[0]
        target = [n for n in (0, 1, 2) if n != leader][:len(replicas)]
        tp = KTP(OFFSETS_TOPIC, 0)
        assert kp.alter_partition_reassignments({tp: target}) == {tp: None}
        until(lambda: kp.list_partition_reassignments() == {} or None, "the move finished", 120)
        successor = leader_of(cluster, OFFSETS_TOPIC, skip={leader})
        assert successor != leader and tuple(partitions(cluster, OFFSETS_TOPIC)[0][2]) == tuple(target)

        after = served_by(cluster, successor, "cp-ra-group")
        assert (after.group_epoch, after.assignment_epoch) == (before.group_epoch, before.assignment_epoch)
        assert members_of(after) == members_of(before)
        produce(cluster.bootstrap, "cp-ra", "b")
        wait_for(lambda: m.count() >= 2 * PARTS * N, 120, "records produced after the move")
    finally:
        m.stop()
        kp.close()
    values = [(t, p, o) for t, p, o in m.seen]
    assert len(values) == len(set(values)) == 2 * PARTS * N
