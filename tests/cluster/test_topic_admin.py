"""DeleteTopics and CreatePartitions in a cluster, on real processes: etcd and three
semel brokers (one set for the module, lease TTL 2 s), driven by unmodified
confluent-kafka and kafka-python admin clients.

A deleted topic is gone from Metadata and from every broker's disk; created again
under the same name it has a new id, epochs from 0 and none of the old records, also
on a broker that was down while it was deleted and created again. Partitions added
to a topic are spread over the brokers, led at epoch 0 with a full ISR, and take
acks=all writes that read back from their leaders. Errors are Kafka's.
"""
from __future__ import annotations

import json

import pytest
from confluent_kafka import OFFSET_INVALID, Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from semel.protocol.errors import KafkaError
from semel.storage.manager import CATALOGUE
from tests.support.admin import commit_offsets, committed_offsets, error_code
from tests.support.cluster import metadata, module_cluster, partitions, wait_brokers
from tests.support.consume import read_values
from tests.support.markers import starts_processes
from tests.support.wait import until


@pytest.fixture(scope="module")
@starts_processes
def cluster(tmp_path_factory):
    with module_cluster(tmp_path_factory, "topic-admin") as c:
        yield c


def _admin(cluster) -> AdminClient:
    """Keep it in a variable while its futures are awaited: they die with it."""
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def _create(cluster, name: str, parts: int, rf: int = 3) -> None:
    admin = _admin(cluster)
    (fut,) = admin.create_topics([NewTopic(name, parts, rf)]).values()
    assert error_code(fut) == KafkaError.NONE
    until(lambda: _visible(cluster, name, parts), f"{name} with {parts} partitions on every broker")


def _visible(cluster, name: str, parts: int) -> bool:
    """Every broker reports the topic with all its partitions led (their watches are apart)."""
    from semel.client.client import Client
    for b in cluster.brokers:
        if not b.alive():
            continue
        with Client(b.bootstrap, timeout_s=5) as c:
            (t,) = c.metadata([name]).topics
            if t.error_code or len(t.partitions) != parts or any(p.leader_id < 0 for p in t.partitions):
                return False
    return True


def _produce(cluster, topic: str, values: list[str], partition_of=lambda i: None) -> None:
    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5, "message.timeout.ms": 60000})
    for i, v in enumerate(values):
        part = partition_of(i)
        if part is None:
            p.produce(topic, value=v.encode())
        else:
            p.produce(topic, value=v.encode(), partition=part)
    assert p.flush(60) == 0


def _local_topics(broker) -> dict:
    """A broker's topic catalogue on disk: name -> its entry (topic_id, partitions)."""
    raw = (broker.data_dir / CATALOGUE).read_bytes()
    return json.loads(raw.partition(b"\n")[2])["topics"]


def _topic_id(cluster, name: str) -> str:
    (t,) = metadata(cluster, [name]).topics
    return str(t.topic_id)


def _gone_everywhere(cluster, name: str) -> bool:
    md = metadata(cluster)
    if any(t.name == name for t in md.topics):
        return False
    return all(name not in _local_topics(b) and not list(b.data_dir.glob(f"{name}-*"))
               for b in cluster.brokers if b.alive())


def test_delete_then_create_again_with_confluent_admin(cluster):
    _create(cluster, "again", 3)
    _produce(cluster, "again", [f"old-{i}" for i in range(30)])
    old_id = _topic_id(cluster, "again")
    admin = _admin(cluster)
    (fut,) = admin.delete_topics(["again"]).values()
    assert error_code(fut) == KafkaError.NONE
    until(lambda: _gone_everywhere(cluster, "again"), "topic gone from Metadata and every broker's disk")
    (fut,) = admin.delete_topics(["again"]).values()
    assert error_code(fut) == KafkaError.UNKNOWN_TOPIC_OR_PARTITION

    _create(cluster, "again", 2)
    new = partitions(cluster, "again")
    assert sorted(new) == [0, 1] and all(epoch == 0 and len(isr) == 3 for _, epoch, _, isr in new.values())
    assert _topic_id(cluster, "again") != old_id
    _produce(cluster, "again", [f"new-{i}" for i in range(20)])
    got = read_values(cluster.bootstrap, "again", 2, want=20)
    assert sorted(got) == sorted(f"new-{i}" for i in range(20))


def test_delete_then_create_again_with_kafka_python_admin(cluster):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic as KNewTopic
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap.split(","))
    try:
        admin.create_topics([KNewTopic("kp-again", 2, 3)])
        until(lambda: _visible(cluster, "kp-again", 2), "kp-again visible")
        _produce(cluster, "kp-again", [f"old-{i}" for i in range(10)])
        admin.delete_topics(["kp-again"])
        until(lambda: _gone_everywhere(cluster, "kp-again"), "kp-again gone")
        admin.create_topics([KNewTopic("kp-again", 2, 3)])
        until(lambda: _visible(cluster, "kp-again", 2), "kp-again visible again")
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap.split(","), acks="all")
    for i in range(10):
        producer.send("kp-again", f"new-{i}".encode(), partition=i % 2)
    producer.flush(60)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap.split(","), enable_auto_commit=False,
                             consumer_timeout_ms=3000)
    consumer.assign([TopicPartition("kp-again", p) for p in range(2)])
    consumer.seek_to_beginning()
    got = sorted(m.value.decode() for m in consumer)
    consumer.close()
    assert got == sorted(f"new-{i}" for i in range(10))


def test_internal_and_unknown_topics_are_refused(cluster):
    admin = _admin(cluster)
    futs = admin.delete_topics(["__consumer_offsets", "__transaction_state", "never-was"])
    assert {t: error_code(f) for t, f in futs.items()} == {
        "__consumer_offsets": KafkaError.INVALID_REQUEST, "__transaction_state": KafkaError.INVALID_REQUEST,
        "never-was": KafkaError.UNKNOWN_TOPIC_OR_PARTITION}


def test_a_broker_away_during_delete_and_create_drops_the_old_records(cluster):
    _create(cluster, "away", 3)
    _produce(cluster, "away", [f"old-{i}" for i in range(30)])
    away = cluster.brokers[2]
    old_id = _local_topics(away)["away"]["topic_id"]
    assert old_id == _topic_id(cluster, "away")     # local logs carry the cluster's id
    away.stop()
    wait_brokers(cluster, {0, 1})
    admin = _admin(cluster)
    (fut,) = admin.delete_topics(["away"]).values()
    assert error_code(fut) == KafkaError.NONE
    (fut,) = admin.create_topics([NewTopic("away", 3, 2)]).values()
    assert error_code(fut) == KafkaError.NONE
    until(lambda: _visible(cluster, "away", 3), "away created again on the live brokers")
    assert _local_topics(away)["away"]["topic_id"] == old_id     # still the old one on disk
    away.start()
    wait_brokers(cluster, {0, 1, 2})
    new_id = _topic_id(cluster, "away")
    until(lambda: _local_topics(away).get("away", {}).get("topic_id") == new_id,
          "the returning broker replaced its stale logs with the new topic's")
    _produce(cluster, "away", [f"new-{i}" for i in range(9)])
    assert sorted(read_values(cluster.bootstrap, "away", 3, want=9)) == sorted(f"new-{i}" for i in range(9))


def test_create_partitions_spreads_them_and_they_take_acks_all(cluster):
    _create(cluster, "grow", 2)
    admin = _admin(cluster)
    futs = admin.create_partitions([NewPartitions("grow", 6)])
    assert error_code(futs["grow"]) == KafkaError.NONE
    until(lambda: _visible(cluster, "grow", 6), "6 partitions on every broker")
    grown = partitions(cluster, "grow")
    for leader, epoch, replicas, isr in grown.values():
        assert epoch == 0 and replicas[0] == leader and sorted(replicas) == sorted(isr) == [0, 1, 2]
    assert sorted(grown[p][0] for p in range(2, 6)).count(grown[2][0]) <= 2   # new leaders spread
    _produce(cluster, "grow", [f"v-{i}" for i in range(40)], partition_of=lambda i: 2 + i % 4)
    from semel.client.client import Client
    for p in range(2, 6):     # each new partition read back from its leader
        leader = grown[p][0]
        with Client(cluster.brokers[leader].bootstrap, timeout_s=10) as c:
            assert c.list_offset("grow", p, -1) == 10
    assert sorted(read_values(cluster.bootstrap, "grow", 6, want=40)) == sorted(f"v-{i}" for i in range(40))


def test_create_partitions_errors_as_kafka(cluster):
    _create(cluster, "fixed", 3)
    admin = _admin(cluster)
    futs = admin.create_partitions([NewPartitions("fixed", 2), NewPartitions("no-such", 4)])
    assert {t: error_code(f) for t, f in futs.items()} == {
        "fixed": KafkaError.INVALID_PARTITIONS, "no-such": KafkaError.UNKNOWN_TOPIC_OR_PARTITION}
    (fut,) = admin.create_partitions([NewPartitions("fixed", 4, [[0, 1]])]).values()   # rf 3 topic
    assert error_code(fut) == KafkaError.INVALID_REPLICA_ASSIGNMENT
    (fut,) = admin.create_partitions([NewPartitions("fixed", 4, [[2, 1, 0]])]).values()
    assert error_code(fut) == KafkaError.NONE
    until(lambda: _visible(cluster, "fixed", 4), "fixed grown to 4")
    assert partitions(cluster, "fixed")[3][2] == (2, 1, 0)
    (fut,) = admin.create_partitions([NewPartitions("__consumer_offsets", 5)]).values()
    assert error_code(fut) == KafkaError.INVALID_REQUEST


def test_kafka_python_create_partitions(cluster):
    from kafka.admin import KafkaAdminClient, NewPartitions as KNewPartitions
    _create(cluster, "kp-grow", 1)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap.split(","))
    try:
        admin.create_partitions({"kp-grow": KNewPartitions(total_count=3)})
    finally:
        admin.close()
    until(lambda: _visible(cluster, "kp-grow", 3), "kp-grow grown to 3")
    _produce(cluster, "kp-grow", [f"k-{i}" for i in range(9)], partition_of=lambda i: i % 3)
    assert sorted(read_values(cluster.bootstrap, "kp-grow", 3, want=9)) == sorted(f"k-{i}" for i in range(9))



def _group_coordinator(cluster, group: str) -> int:
    def ask():
        with cluster.connect(cluster.brokers[0].bootstrap if cluster.brokers[0].alive()
                             else cluster.brokers[1].bootstrap) as c:
            r = c.request(10, key=group, key_type=0)
        return (r.node_id,) if r.error_code == KafkaError.NONE else None
    return until(ask, f"the coordinator of {group}")[0]


def test_deleting_a_topic_drops_its_committed_offsets_across_a_coordinator_move(cluster):
    """Kafka drops every group's offsets of a deleted topic: the group coordinator writes
    tombstones when it sees the deletion, so OffsetFetch answers -1 (confluent-kafka:
    OFFSET_INVALID) also after its broker is SIGKILLed and another loads the log; the
    group's offsets of other topics stay."""
    _create(cluster, "offs-gone", 2)
    _create(cluster, "offs-kept", 1)
    group = "offs-group"
    commit_offsets(cluster.bootstrap, group, "offs-gone", {0: 3, 1: 4})
    commit_offsets(cluster.bootstrap, group, "offs-kept", {0: 5})
    assert committed_offsets(cluster.bootstrap, group, "offs-gone", 2) == {0: 3, 1: 4}
    admin = _admin(cluster)
    (fut,) = admin.delete_topics(["offs-gone"]).values()
    assert error_code(fut) == KafkaError.NONE
    none = {0: OFFSET_INVALID, 1: OFFSET_INVALID}
    until(lambda: committed_offsets(cluster.bootstrap, group, "offs-gone", 2) == none, "the offsets dropped")
    victim = _group_coordinator(cluster, group)
    cluster.brokers[victim].kill()
    try:
        until(lambda: _group_coordinator(cluster, group) != victim, "the group coordinator moved")
        assert committed_offsets(cluster.bootstrap, group, "offs-gone", 2) == none
        assert committed_offsets(cluster.bootstrap, group, "offs-kept", 1) == {0: 5}
    finally:
        cluster.brokers[victim].restart()
    wait_brokers(cluster, {0, 1, 2})
