"""OffsetDelete (47) through kafka-python's admin client (confluent-kafka's Python
binding has no call for it; its list_consumer_group_offsets reads the result):
offsets go (durably), a live consumer group keeps the offsets of topics it
subscribes to, an unknown group is GROUP_ID_NOT_FOUND."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError as CKError, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import wait
from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-offset-delete") as b:
        yield b


def _topics(admin, *names):
    futs = admin.create_topics([NewTopic(n, 2, 1) for n in names])
    for f in futs.values():
        f.result(30)


def _commit(b, group, offsets):
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(t, p, o) for t, p, o in offsets], asynchronous=False)
    c.close()


def _committed(admin, group, topic):
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0), TopicPartition(topic, 1)])
    got = admin.list_consumer_group_offsets([req])[group].result(30)
    return [tp.offset for tp in got.topic_partitions]


def _delete(b, group, tps):
    """{(topic, partition): kafka-python error class} or the group-level error raised."""
    from kafka import TopicPartition as KTP
    from kafka.admin import KafkaAdminClient
    kp = KafkaAdminClient(bootstrap_servers=b.bootstrap)
    try:
        got = kp.delete_group_offsets(group, [KTP(t, p) for t, p in tps])
    finally:
        kp.close()
    return {(tp.topic, tp.partition): err.errno for tp, err in got.items()}


def test_delete_offsets_of_an_empty_group_durably(mbroker):
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    topic, group = "od-" + uuid.uuid4().hex[:8], "g-" + uuid.uuid4().hex[:8]
    _topics(admin, topic)
    _commit(mbroker, group, [(topic, 0, 5), (topic, 1, 7)])
    assert _delete(mbroker, group, [(topic, 0)]) == {(topic, 0): 0}
    assert _committed(admin, group, topic) == [-1001, 7]  # -1001: no committed offset
    mbroker.kill()
    mbroker.restart()
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    assert _committed(admin, group, topic) == [-1001, 7]


def test_live_group_keeps_offsets_of_subscribed_topics(mbroker):
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    used, other = "used-" + uuid.uuid4().hex[:8], "other-" + uuid.uuid4().hex[:8]
    group = "g-" + uuid.uuid4().hex[:8]
    _topics(admin, used, other)
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": group, "enable.auto.commit": False})
    c.subscribe([used])
    wait.until(lambda: (c.poll(0.2), c.assignment())[1], "consumer joined and got partitions")
    c.commit(offsets=[TopicPartition(used, 0, 3), TopicPartition(other, 0, 4)], asynchronous=False)
    assert _delete(mbroker, group, [(used, 0), (other, 0)]) == {
        (used, 0): CKError.GROUP_SUBSCRIBED_TO_TOPIC, (other, 0): 0}
    assert _committed(admin, group, other)[0] == -1001
    assert _committed(admin, group, used)[0] == 3
    c.close()


def test_unknown_group(mbroker):
    from kafka.errors import GroupIdNotFoundError
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    topic = "od-" + uuid.uuid4().hex[:8]
    _topics(admin, topic)
    with pytest.raises(GroupIdNotFoundError):
        _delete(mbroker, "no-such-group-" + uuid.uuid4().hex, [(topic, 0)])
