"""SIGKILL the broker under load: every acknowledged record survives exactly once."""
from __future__ import annotations

import threading
import time

from semel.client import Client
from tests.support.consume import read_values

N = 12_000


def test_idempotent_acks_all_survives_repeated_sigkill(start_broker):
    from confluent_kafka import Producer
    broker = start_broker()
    with Client(broker.bootstrap) as c:
        c.create_topic("crash", 4)
    acked: list[int] = []
    failed: list[str] = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 2, "message.timeout.ms": 120000, "retry.backoff.ms": 100,
                         "reconnect.backoff.max.ms": 500})

    def on_delivery(err, msg):
        if err is None:
            acked.append(int(msg.value()))
        else:
            failed.append(str(err))

    def produce():
        for i in range(N):
            while True:
                try:
                    producer.produce("crash", key=str(i % 97), value=str(i), on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            if i % 200 == 0:
                time.sleep(0.05)
        producer.flush(120)

    t = threading.Thread(target=produce)
    t.start()
    for _ in range(3):
        time.sleep(1.0)
        broker.kill()           # SIGKILL: no clean shutdown, no final flush
        time.sleep(0.3)
        broker.restart()
    t.join(180)
    assert not t.is_alive()
    assert failed == [], failed[:3]
    assert len(acked) == N
    values = [int(v) for v in read_values(broker.bootstrap, "crash", 4, idle_s=3.0, want=N)]
    assert len(values) == len(set(values)), "duplicates after broker SIGKILL"
    assert set(values) == set(acked), "acknowledged records lost"


def test_committed_offsets_survive_sigkill(start_broker):
    from confluent_kafka import Consumer, TopicPartition
    broker = start_broker()
    with Client(broker.bootstrap) as c:
        c.create_topic("offs", 3)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "keeper", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("offs", p, 10 + p) for p in range(3)], asynchronous=False)
    c.close()
    broker.kill()
    broker.restart()
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "keeper", "enable.auto.commit": False})
    got = c.committed([TopicPartition("offs", p) for p in range(3)], timeout=15)
    c.close()
    assert [tp.offset for tp in got] == [10, 11, 12]
