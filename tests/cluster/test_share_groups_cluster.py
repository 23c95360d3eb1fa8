"""Share groups (KIP-932) on a 3-broker cluster, with confluent-kafka's ShareConsumer.

librdkafka sends ShareGroupHeartbeat to the group's coordinator and ShareFetch /
ShareAcknowledge to each partition's leader; each leader keeps its partitions'
share state and writes acknowledgements to etcd before it answers
(docs/internals/share-groups.md). Shown here, on exact record sets:
  - one ShareConsumer reads every record of a topic whose partitions have three
    different leaders, each once;
  - a SIGKILL of the broker leading the partition (and holding its share state) in the
    middle of consumption: what was acknowledged before is never delivered again, what
    was acquired but not acknowledged is delivered again, nothing is lost;
  - a topic deleted and created again is read from its new start;
  - a SIGKILL of the group's coordinator (which holds only the membership): the
    consumer joins the next one and reads on, every record once.
"""
from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from semel.coordinator.txn import OFFSETS_TOPIC
from tests.support.cluster import leader_of, metadata, module_cluster, partitions, wait_brokers
from tests.support.markers import starts_processes
from tests.support.share import (
    ONE_PER_BATCH, accept_some_then, drain, names, poll_until, read_all, set_group_configs, share_consumer,
)
from tests.support.wait import until

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "share-cluster", 3, 2, "--group-initial-rebalance-delay-ms", "0",
                        "--min-insync-replicas", "2", "--offsets-topic-partitions", "1") as c:
        yield c


def create_and_fill(cluster, topic: str, parts: int, n: int, assignment=None) -> list[str]:
    """`n` records v0.. round-robin over `parts` partitions (RF 3, or the replicas of
    `assignment`, the first one leading); every partition led."""
    from confluent_kafka import Producer
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    new = NewTopic(topic, parts, replica_assignment=assignment) if assignment else NewTopic(topic, parts, 3)
    admin.create_topics([new])[topic].result(30)
    until(lambda: all(leader >= 0 for leader, *_ in partitions(cluster, topic).values()), f"{topic}: leaders")
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", **ONE_PER_BATCH})
    values = [f"v{i}" for i in range(n)]
    for i, v in enumerate(values):
        p.produce(topic, value=v.encode(), partition=i % parts)
    assert p.flush(30) == 0
    return values


def _values(msgs) -> list[str]:
    return [m.value().decode() for m in msgs]


def test_one_share_consumer_reads_every_partition_once_across_leaders(cluster):
    topic, group = names("across")
    values = create_and_fill(cluster, topic, 6, 60)
    leaders = {leader for leader, *_ in partitions(cluster, topic).values()}
    assert len(leaders) == 3   # the reads go to three brokers
    set_group_configs(cluster.bootstrap, group, share_auto_offset_reset="earliest")
    seen = read_all(cluster.bootstrap, group, topic, len(values), quiet_s=3)
    assert sorted(_values(seen)) == sorted(values)   # each once
    assert {m.delivery_count() for m in seen} == {1}


def test_a_topic_created_again_is_read_from_its_new_start(cluster):
    topic, group = names("again")
    set_group_configs(cluster.bootstrap, group, share_auto_offset_reset="earliest")
    wait_brokers(cluster, {0, 1, 2})
    # led by one broker both times: what it held of the old topic must not stand for the new one
    first = create_and_fill(cluster, topic, 1, 20, assignment=[[0, 1, 2]])
    assert sorted(_values(read_all(cluster.bootstrap, group, topic, len(first)))) == sorted(first)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})   # kept alive until the answer comes
    admin.delete_topics([topic])[topic].result(30)
    until(lambda: all(t.name != topic for t in metadata(cluster).topics)
          and not any(list(b.data_dir.glob(f"{topic}-*")) for b in cluster.brokers), f"{topic}: deleted")
    second = create_and_fill(cluster, topic, 1, 5, assignment=[[0, 1, 2]])   # offsets 0..4, below the old window
    assert sorted(_values(read_all(cluster.bootstrap, group, topic, len(second)))) == sorted(second)


def test_leader_sigkill_keeps_acknowledged_and_redelivers_what_was_held(cluster):
    wait_brokers(cluster, {0, 1, 2})
    topic, group = names("kill")
    values = create_and_fill(cluster, topic, 1, 30)
    set_group_configs(cluster.bootstrap, group, share_auto_offset_reset="earliest")
    victim = leader_of(cluster, topic)   # it holds the partition's share state
    accepted_pairs, held_pairs = accept_some_then(cluster.bootstrap, group, topic, 15, cluster.brokers[victim].kill)
    accepted, held = [v for _, v in accepted_pairs], [v for _, v in held_pairs]
    try:
        successor = leader_of(cluster, topic, skip={victim})
        assert successor != victim
        seen = read_all(cluster.bootstrap, group, topic, len(values) - len(accepted), quiet_s=4)
    finally:
        cluster.brokers[victim].restart()
    got = _values(seen)
    assert len(accepted) == 15 and held
    assert sorted(got) == sorted(set(values) - set(accepted))   # acknowledged: never again; none lost, none twice
    counts = {m.value().decode(): m.delivery_count() for m in seen}
    assert all(counts[v] >= 2 for v in held)   # acquired before the kill: delivered again


def test_the_group_coordinators_sigkill_loses_no_record_and_repeats_none(cluster):
    wait_brokers(cluster, {0, 1, 2})
    topic, group = names("coord")
    set_group_configs(cluster.bootstrap, group, share_auto_offset_reset="earliest")
    coordinator = leader_of(cluster, OFFSETS_TOPIC)   # one __consumer_offsets partition: every group's
    a, b = sorted({0, 1, 2} - {coordinator})
    # the partitions are led away from the coordinator: their share state stays put
    values = create_and_fill(cluster, topic, 2, 40, assignment=[[a, b, coordinator], [b, a, coordinator]])
    c = share_consumer(cluster.bootstrap, group, topic, max_poll_records=5)
    try:
        seen = poll_until(c, lambda s: len(s) >= 10)
        cluster.brokers[coordinator].kill()
        seen += poll_until(c, lambda s: len(seen) + len(s) >= len(values), timeout_s=90)
        seen += drain(c, 4)
        c.commit_sync()
    finally:
        c.close()
        cluster.brokers[coordinator].restart()
    assert sorted(_values(seen)) == sorted(values)   # every record, none twice
