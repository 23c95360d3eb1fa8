"""CreateTopics with an explicit replica assignment, Kafka's topic-name rules,
topic ids in Metadata, and unmodified clients living through a topic deleted and
re-created under the same name. One broker for the module."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError as CKError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from semel.protocol.errors import KafkaError
from semel.protocol.messages import request_class
from tests.support import wait, wire
from tests.support.admin import (
    ILLEGAL_TOPIC_NAMES, commit_offsets, committed_offsets, delivery_errors, error_code, produce_error)
from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-topics") as b:
        yield b


@pytest.fixture(scope="module")
def admin(mbroker):
    return AdminClient({"bootstrap.servers": mbroker.bootstrap})


def _name(prefix="t"):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create_code(admin, topic):
    return error_code(admin.create_topics([topic])[topic.topic])


def _partitions(admin, name):
    return len(admin.list_topics(name, timeout=30).topics[name].partitions)


def test_explicit_replica_assignment_sets_the_partition_count(admin):
    name = _name()
    assert _create_code(admin, NewTopic(name, 22, replica_assignment=[[0]] * 22)) == CKError.NO_ERROR
    assert _partitions(admin, name) == 22
    assert _create_code(admin, NewTopic(_name(), 2, replica_assignment=[[0], [3]])) == \
        CKError.INVALID_REPLICA_ASSIGNMENT


def test_kafka_python_replica_assignment(mbroker, admin):
    from kafka.admin import KafkaAdminClient, NewTopic as KPNewTopic
    name = _name()
    kp = KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    try:
        kp.create_topics([KPNewTopic(name, replica_assignments={0: [0], 1: [0], 2: [0]})])
    finally:
        kp.close()
    assert _partitions(admin, name) == 3


@pytest.mark.parametrize("bad", ["probe-invalid_topic$#!", ".", "..", "x" * 250, "sp ace"])
def test_illegal_names_are_invalid_topic_exception(admin, bad):
    assert _create_code(admin, NewTopic(bad, 1, 1)) == CKError.TOPIC_EXCEPTION


def test_longest_legal_name_and_dot_underscore_collision(admin):
    assert _create_code(admin, NewTopic("y" * 249, 1, 1)) == CKError.NO_ERROR
    stem = uuid.uuid4().hex[:8]
    assert _create_code(admin, NewTopic(f"c.{stem}", 1, 1)) == CKError.NO_ERROR
    assert _create_code(admin, NewTopic(f"c_{stem}", 1, 1)) == CKError.TOPIC_EXCEPTION


@pytest.mark.parametrize("bad", ["probe-invalid_topic$#!", *ILLEGAL_TOPIC_NAMES])
def test_producer_to_an_illegal_name_fails_instead_of_retrying(mbroker, bad):
    """As on a cluster (tests/cluster/test_cluster_topics.py): final on Metadata and Produce."""
    assert [e.code() for e in delivery_errors(mbroker.bootstrap, bad)] == [CKError.TOPIC_EXCEPTION]
    assert produce_error(mbroker.bootstrap, bad) == KafkaError.INVALID_TOPIC_EXCEPTION


def _metadata_v12(mbroker, names=None, ids=None):
    R = request_class(3)
    topics = None
    if names is not None or ids is not None:
        topics = [R.MetadataRequestTopic(topic_id=i or uuid.UUID(int=0), name=n)
                  for n, i in zip(names or [None] * len(ids), ids or [None] * len(names))]
    sock = wire.connect(mbroker.bootstrap)
    try:
        return wire.call(sock, 3, 12, topics=topics, allow_auto_topic_creation=False,
                         include_topic_authorized_operations=False)
    finally:
        sock.close()


def test_metadata_carries_topic_ids_and_finds_topics_by_id(mbroker, admin):
    name = _name()
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    (t,) = _metadata_v12(mbroker, names=[name]).topics
    first_id = t.topic_id
    assert first_id != uuid.UUID(int=0)
    (by_id,) = _metadata_v12(mbroker, ids=[first_id]).topics
    assert (by_id.name, by_id.error_code) == (name, 0)
    admin.delete_topics([name])[name].result(30)
    wait.until(lambda: name not in admin.list_topics(timeout=30).topics, "topic gone")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    (again,) = _metadata_v12(mbroker, names=[name]).topics
    assert again.topic_id not in (first_id, uuid.UUID(int=0))
    (stale,) = _metadata_v12(mbroker, ids=[first_id]).topics
    assert stale.error_code == CKError.UNKNOWN_TOPIC_ID


def _consume(mbroker, name, partitions, count):
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": _name("g"),
                  "enable.auto.commit": False})
    c.assign([TopicPartition(name, p, 0) for p in range(partitions)])
    out = []

    def step():
        m = c.poll(0.2)
        if m is not None and not m.error():
            out.append(m.value())
        return len(out) >= count
    wait.until(step, f"{count} records read from {name}")
    c.close()
    return out


def test_producer_lives_through_recreation_with_fewer_partitions(mbroker, admin):
    name = _name("re")
    admin.create_topics([NewTopic(name, 4, 1)])[name].result(30)
    p = Producer({"bootstrap.servers": mbroker.bootstrap, "topic.metadata.refresh.interval.ms": 500,
                  "enable.idempotence": True})
    for i in range(200):
        p.produce(name, key=f"k{i}".encode(), value=f"old{i}".encode())
    assert p.flush(30) == 0
    admin.delete_topics([name])[name].result(30)
    wait.until(lambda: name not in admin.list_topics(timeout=30).topics, "topic gone")
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    # The producer's cache still says 4 partitions; it must learn of the new topic.
    wait.until(lambda: len(p.list_topics(name, timeout=10).topics[name].partitions) == 2,
               "producer sees the re-created topic")
    failed = []
    for i in range(200):
        p.produce(name, key=f"k{i}".encode(), value=f"new{i}".encode(),
                  on_delivery=lambda err, msg: err and failed.append(err))
    assert p.flush(60) == 0
    assert failed == []
    got = _consume(mbroker, name, 2, 200)
    assert sorted(got) == sorted(f"new{i}".encode() for i in range(200))


def test_subscribed_consumer_lives_through_recreation(mbroker, admin):
    name = _name("rc")
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(30)
    p = Producer({"bootstrap.servers": mbroker.bootstrap})
    for i in range(30):
        p.produce(name, value=f"old{i}".encode(), partition=i % 3)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": _name("g"),
                  "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 500})
    c.subscribe([name])
    seen = []

    def read_until(pred, what):
        def step():
            m = c.poll(0.2)
            if m is not None and not m.error():
                seen.append(m.value())
            return pred()
        wait.until(step, what)

    read_until(lambda: len(seen) >= 30, "old records read")
    c.commit(asynchronous=False)  # committed positions (10 per partition) outlive the topic
    admin.delete_topics([name])[name].result(30)
    wait.until(lambda: name not in admin.list_topics(timeout=30).topics, "topic gone")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    for i in range(5):
        p.produce(name, value=f"new{i}".encode(), partition=0)
    assert p.flush(60) == 0
    # The consumer's position (and the group's offset) 10 is past the new log's end:
    # it is reset to earliest and reads the new records, as against a Kafka broker.
    read_until(lambda: {f"new{i}".encode() for i in range(5)} <= set(seen), "new records read")
    c.close()


def test_deleting_a_topic_drops_the_groups_offsets_of_it(mbroker, admin):
    """As in Kafka: DeleteTopics removes every group's committed offsets of the topic
    (tombstones, so a restart replays the deletion); OffsetFetch answers -1 after, and
    a group that consumed the old topic reads a topic created again from its start."""
    name, other = _name("od"), _name("keep")
    for t in (name, other):
        admin.create_topics([NewTopic(t, 2, 1)])[t].result(30)
    p = Producer({"bootstrap.servers": mbroker.bootstrap})
    for i in range(6):
        p.produce(name, value=f"old{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    group = _name("g")
    commit_offsets(mbroker.bootstrap, group, name, {0: 3, 1: 3})
    commit_offsets(mbroker.bootstrap, group, other, {0: 5})
    assert committed_offsets(mbroker.bootstrap, group, name, 2) == {0: 3, 1: 3}
    admin.delete_topics([name])[name].result(30)
    none = {0: OFFSET_INVALID, 1: OFFSET_INVALID}
    wait.until(lambda: committed_offsets(mbroker.bootstrap, group, name, 2) == none, "the deleted topic's offsets gone")
    mbroker.restart()
    assert committed_offsets(mbroker.bootstrap, group, name, 2) == none
    assert committed_offsets(mbroker.bootstrap, group, other, 1) == {0: 5}
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(30)
    for i in range(10):    # 5 a partition: the old offsets (3) would be in range
        p.produce(name, value=f"new{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([name])
    got = []
    wait.until(lambda: got.extend(m.value() for m in c.consume(10, 0.5) if not m.error()) or len(got) >= 10,
               "the new records read from offset 0, not from the old topic's offsets")
    c.close()
    assert sorted(got) == sorted(f"new{i}".encode() for i in range(10))
