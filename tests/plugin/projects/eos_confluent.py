"""An outside project's exactly-once test: a transactional consume-transform-produce
loop with confluent-kafka, the broker SIGKILLed and restarted in the middle of a
transaction; every input is in the output exactly once."""
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

N, BATCH = 120, 20


def produce(config, topic, values):
    p = Producer({**config, "enable.idempotence": True})
    for v in values:
        p.produce(topic, v)
    assert p.flush(30) == 0


def read_committed(config, topic, n, timeout_s=30):
    c = Consumer({**config, "group.id": "checker", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.subscribe([topic])
    got, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(got) < n:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.append(m.value())
    time.sleep(1)   # anything beyond n (a duplicate) would show up now
    while (m := c.poll(0.5)) is not None:
        if not m.error():
            got.append(m.value())
    c.close()
    return got


def rewind(consumer):
    """After an abort: back to the group's committed offsets (the start where none)."""
    for tp in consumer.committed(consumer.assignment(), timeout=30):
        consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))


def commit(producer, consumer):
    """True when the transaction committed; aborted (and the input rewound) otherwise."""
    try:
        producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        return True
    except KafkaException as exc:
        if not exc.args[0].txn_requires_abort():
            raise
        producer.abort_transaction(30)
        rewind(consumer)
        return False


def test_exactly_once_through_a_broker_kill(semel_broker, semel_topic, semel_confluent_config):
    src, dst = semel_topic(partitions=2), semel_topic(partitions=2)
    produce(semel_confluent_config, src, [f"{i}".encode() for i in range(N)])
    consumer = Consumer({**semel_confluent_config, "group.id": "eos-app", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.subscribe([src])
    producer = Producer({**semel_confluent_config, "transactional.id": "eos-app-1"})
    producer.init_transactions(30)
    done, killed, deadline = 0, False, time.monotonic() + 120
    while done < N and time.monotonic() < deadline:
        msgs = [m for m in consumer.consume(BATCH, 1.0) if not m.error()]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(dst, m.value() + b"!", key=m.key())
        if done >= N // 2 and not killed:
            semel_broker.kill()   # mid-transaction: produced, not committed
            semel_broker.restart()
            killed = True
        if commit(producer, consumer):
            done += len(msgs)
    consumer.close()
    assert killed
    out = read_committed(semel_confluent_config, dst, N)
    assert sorted(out) == sorted(f"{i}!".encode() for i in range(N))
