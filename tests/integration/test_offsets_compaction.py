"""__consumer_offsets stays bounded: once it holds far more records than live
offsets, the live state is rewritten and old segments dropped, and a SIGKILLed
broker restarts into the same committed offsets (plain and transactional)."""
from __future__ import annotations

from semel.client import Client
from tests.support.wait import until

TOPIC = "__consumer_offsets"


def test_offsets_log_is_compacted_and_survives_sigkill(start_broker):
    from confluent_kafka import Consumer, Producer, TopicPartition
    b = start_broker("--offsets-log-compact-records", "100", "--offsets-log-segment-bytes", "4096")
    with Client(b.bootstrap) as c:
        c.create_topic("in", 3)
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "plain", "enable.auto.commit": False})
    for i in range(1, 201):                                    # 600 offset records for 3 live ones
        consumer.commit(offsets=[TopicPartition("in", p, i * 10 + p) for p in range(3)], asynchronous=False)
    txn_group = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "txn", "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "compaction"})
    producer.init_transactions(30)
    for i in range(1, 4):
        producer.begin_transaction()
        producer.send_offsets_to_transaction([TopicPartition("in", 0, 1000 + i)],
                                             txn_group.consumer_group_metadata(), 30)
        producer.commit_transaction(30)

    with Client(b.bootstrap) as c:
        until(lambda: c.list_offset(TOPIC, 0, -2) > 0, "old offsets segments dropped", 30)
        start, end = c.list_offset(TOPIC, 0, -2), c.list_offset(TOPIC, 0, -1)
    assert end - start < 600, (start, end)
    consumer.close()
    txn_group.close()

    b.kill()
    b.restart()
    check = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "plain", "enable.auto.commit": False})
    got = check.committed([TopicPartition("in", p) for p in range(3)], timeout=15)
    check.close()
    assert [tp.offset for tp in got] == [2000, 2001, 2002]
    check = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "txn", "enable.auto.commit": False})
    assert check.committed([TopicPartition("in", 0)], timeout=15)[0].offset == 1003
    check.close()
