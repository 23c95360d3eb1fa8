"""CreatePartitions (37) through unmodified admin clients, and an unmodified
producer/consumer living through partition growth. One broker for the module."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError as CKError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from tests.support import wait
from tests.support.admin import error_code
from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-partitions") as b:
        yield b


def _admin(b):
    return AdminClient({"bootstrap.servers": b.bootstrap})


def _topic(admin, partitions):
    name = "grow-" + uuid.uuid4().hex[:8]
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    return name


def _partition_count(admin, name):
    return len(admin.list_topics(name, timeout=30).topics[name].partitions)



def test_grow_and_write_new_partitions_at_once(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin, 2)
    admin.create_partitions([NewPartitions(name, 5)])[name].result(30)
    assert _partition_count(admin, name) == 5
    p = Producer({"bootstrap.servers": mbroker.bootstrap, "enable.idempotence": True})
    for part in range(5):
        p.produce(name, value=f"v{part}".encode(), partition=part)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": "g-" + name,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    lo_hi = [c.get_watermark_offsets(TopicPartition(name, part), 30)
             for part in range(5)]
    c.close()
    # The new partitions started empty: each holds exactly the one record just written.
    assert lo_hi == [(0, 1)] * 5


def test_errors_are_kafkas(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin, 3)
    assert error_code(admin.create_partitions([NewPartitions(name, 3)])[name]) == CKError.INVALID_PARTITIONS
    assert error_code(admin.create_partitions([NewPartitions(name, 2)])[name]) == CKError.INVALID_PARTITIONS
    missing = "nope-" + uuid.uuid4().hex[:8]
    assert error_code(admin.create_partitions([NewPartitions(missing, 4)])[missing]) == \
        CKError.UNKNOWN_TOPIC_OR_PART
    bad = NewPartitions(name, 5, replica_assignment=[[0]])  # 2 new partitions, one assignment
    assert error_code(admin.create_partitions([bad])[name]) == CKError.INVALID_REPLICA_ASSIGNMENT
    assert _partition_count(admin, name) == 3


def test_validate_only_changes_nothing(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin, 1)
    admin.create_partitions([NewPartitions(name, 4)], validate_only=True)[name].result(30)
    assert _partition_count(admin, name) == 1
    ok = NewPartitions(name, 3, replica_assignment=[[0], [0]])
    admin.create_partitions([ok])[name].result(30)
    assert _partition_count(admin, name) == 3


def test_kafka_python_admin(mbroker):
    from kafka.admin import KafkaAdminClient, NewPartitions as KPNewPartitions
    from kafka.errors import InvalidPartitionsError
    name = _topic(_admin(mbroker), 1)
    kp = KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    try:
        kp.create_partitions({name: KPNewPartitions(total_count=3)})
        with pytest.raises(InvalidPartitionsError):
            kp.create_partitions({name: KPNewPartitions(total_count=2)}, raise_errors=True)
    finally:
        kp.close()
    assert _partition_count(_admin(mbroker), name) == 3


def test_subscribed_consumer_picks_up_new_partitions(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin, 1)
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": "g-" + name,
                  "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 500})
    c.subscribe([name])
    p = Producer({"bootstrap.servers": mbroker.bootstrap, "topic.metadata.refresh.interval.ms": 500})
    seen: set[tuple[int, bytes]] = set()

    def poll_until(want):
        def step():
            m = c.poll(0.2)
            if m is not None and not m.error():
                seen.add((m.partition(), m.value()))
            return want <= seen
        wait.until(step, f"consumer saw {sorted(want - seen)}")

    p.produce(name, value=b"before", partition=0)
    assert p.flush(30) == 0
    poll_until({(0, b"before")})
    admin.create_partitions([NewPartitions(name, 3)])[name].result(30)
    # The same producer (cached metadata of one partition) learns of the new ones.
    wait.until(lambda: len(p.list_topics(name, timeout=10).topics[name].partitions) == 3,
               "producer sees 3 partitions")
    for part in (1, 2):
        p.produce(name, value=f"after{part}".encode(), partition=part)
    assert p.flush(30) == 0
    poll_until({(0, b"before"), (1, b"after1"), (2, b"after2")})
    c.close()
    assert len(seen) == 3
