"""An outside project's tests: produce and consume with each client library against
the semel plugin's fixtures (run by tests/plugin/test_plugin_clients.py as test_clients.py
in a folder of its own; it imports nothing of the semel test-suite)."""
import asyncio
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer
from kafka import KafkaConsumer, KafkaProducer


def consume_confluent(config, topic, n, timeout_s=30):
    c = Consumer({**config, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed"})
    c.subscribe([topic])
    got, deadline = [], time.monotonic() + timeout_s
    try:
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append(m.value())
    finally:
        c.close()
    return got


def produce_confluent(config, topic, values):
    p = Producer(config)
    for v in values:
        p.produce(topic, v)
    assert p.flush(30) == 0


def test_confluent_round_trip(semel_topic, semel_confluent_config):
    topic = semel_topic(partitions=3)
    produce_confluent(semel_confluent_config, topic, [b"a", b"b", b"c"])
    assert sorted(consume_confluent(semel_confluent_config, topic, 3)) == [b"a", b"b", b"c"]


def test_kafka_python_round_trip(semel_topic, semel_kafka_python_config):
    topic = semel_topic()
    p = KafkaProducer(**semel_kafka_python_config, acks="all")
    for i in range(3):
        p.send(topic, f"m{i}".encode())
    p.flush(30)
    p.close()
    c = KafkaConsumer(topic, **semel_kafka_python_config, auto_offset_reset="earliest", consumer_timeout_ms=15000)
    got = []
    for m in c:
        got.append(m.value)
        if len(got) == 3:
            break
    c.close()
    assert got == [b"m0", b"m1", b"m2"]


def test_aiokafka_round_trip(semel_topic, semel_aiokafka_config):
    topic = semel_topic(partitions=2)

    async def main():
        p = AIOKafkaProducer(**semel_aiokafka_config, enable_idempotence=True)
        await p.start()
        try:
            for i in range(4):
                await p.send_and_wait(topic, f"m{i}".encode(), partition=i % 2)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(topic, **semel_aiokafka_config, auto_offset_reset="earliest")
        await c.start()
        got = []
        try:
            async with asyncio.timeout(30):
                while len(got) < 4:
                    batch = await c.getmany(timeout_ms=500)
                    got += [m.value for msgs in batch.values() for m in msgs]
        finally:
            await c.stop()
        return got
    assert sorted(asyncio.run(main())) == [b"m0", b"m1", b"m2", b"m3"]


def test_topics_are_per_test(semel_broker, semel_topic):
    a, b = semel_topic(), semel_topic(config={"cleanup.policy": "compact"})
    assert a != b and a.startswith("test_topics_are_per_test-")


def test_kill_then_restart_keeps_acknowledged_records(semel_broker, semel_topic, semel_confluent_config):
    topic = semel_topic()
    produce_confluent(semel_confluent_config, topic, [b"before"])
    semel_broker.kill()
    assert not semel_broker.alive()
    semel_broker.restart()
    produce_confluent(semel_confluent_config, topic, [b"after"])
    assert consume_confluent(semel_confluent_config, topic, 2) == [b"before", b"after"]


def test_shared_broker_is_back_after_a_test_left_it_down(semel_broker):
    semel_broker.kill()


def test_shared_broker_is_back(semel_broker, semel_topic, semel_confluent_config):
    topic = semel_topic()
    produce_confluent(semel_confluent_config, topic, [b"x"])
    assert consume_confluent(semel_confluent_config, topic, 1) == [b"x"]


def test_paused_broker_answers_nothing_until_resumed(semel_broker, semel_topic, semel_confluent_config):
    topic = semel_topic()
    p = Producer({**semel_confluent_config, "message.timeout.ms": 60000})
    with semel_broker.paused():
        p.produce(topic, b"held")
        assert p.flush(1.5) == 1   # still queued: the broker is stopped
    assert p.flush(30) == 0
    assert consume_confluent(semel_confluent_config, topic, 1) == [b"held"]


def test_fresh_broker_is_its_own(semel_broker, semel_broker_fresh):
    assert semel_broker_fresh.bootstrap_servers != semel_broker.bootstrap_servers
    cfg = semel_broker_fresh.client_configs()["confluent"]
    topic = semel_broker_fresh.topics("fresh").make()
    produce_confluent(cfg, topic, [b"own"])
    assert consume_confluent(cfg, topic, 1) == [b"own"]


def test_sasl_broker(semel_broker_sasl):
    cfg = semel_broker_sasl.client_configs()["confluent"]
    topic = semel_broker_sasl.topics("sasl").make()
    produce_confluent(cfg, topic, [b"secret"])
    assert consume_confluent(cfg, topic, 1) == [b"secret"]
    errors = []
    p = Producer({**cfg, "sasl.password": "wrong", "error_cb": errors.append})
    deadline = time.monotonic() + 20
    while not errors and time.monotonic() < deadline:
        p.poll(0.2)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors


def test_tls_broker_with_each_library(semel_broker_tls):
    cfgs = semel_broker_tls.client_configs()
    topic = semel_broker_tls.topics("tls").make()
    produce_confluent(cfgs["confluent"], topic, [b"c"])
    p = KafkaProducer(**cfgs["kafka_python"], acks="all")
    p.send(topic, b"k").get(30)
    p.close()

    async def aio():
        p = AIOKafkaProducer(**cfgs["aiokafka"])
        await p.start()
        try:
            await p.send_and_wait(topic, b"a")
        finally:
            await p.stop()
    asyncio.run(aio())
    assert consume_confluent(cfgs["confluent"], topic, 3) == [b"c", b"k", b"a"]


def test_cluster_round_trip_through_a_broker_kill(semel_cluster, semel_cluster_topic):
    cfg = semel_cluster.client_configs()["confluent"]
    topic = semel_cluster_topic(partitions=3)
    produce_confluent({**cfg, "acks": "all"}, topic, [b"one"])
    semel_cluster.brokers[0].kill()
    produce_confluent({**cfg, "acks": "all"}, topic, [b"two"])
    assert sorted(consume_confluent(cfg, topic, 2, timeout_s=60)) == [b"one", b"two"]


def test_sasl_ssl_broker_with_kafka_python(semel_broker_factory):
    broker = semel_broker_factory(security="SASL_SSL")
    cfg = broker.client_configs()["kafka_python"]
    assert cfg["security_protocol"] == "SASL_SSL" and cfg["ssl_cafile"]
    topic = broker.topics("sasl-ssl").make()
    p = KafkaProducer(**cfg, acks="all")
    p.send(topic, b"both").get(30)
    p.close()
    assert consume_confluent(broker.client_configs()["confluent"], topic, 1) == [b"both"]
