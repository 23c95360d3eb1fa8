"""Unmodified clients against a real broker process: confluent-kafka, kafka-python, aiokafka.

Topics are created through each client's admin API; records carry keys and
headers and go through every compression codec the client offers, at acks 0,
1 and all; they are read back by partition assignment and compared exactly.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
N = 200


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    from semel.launch.process import SemelBroker
    d = tmp_path_factory.mktemp("clients")
    b = SemelBroker(d / "data", log_path=d / "broker.log")
    b.start()
    yield b
    b.close()


def expected(topic):
    return {(f"k{i}", f"{topic}-v{i}", (("h", str(i)),)) for i in range(N)}


# --- confluent-kafka --------------------------------------------------------------

def _ck_admin(bootstrap):
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": bootstrap})


def _ck_create(bootstrap, topic, partitions):
    from confluent_kafka.admin import NewTopic
    admin = _ck_admin(bootstrap)  # the handle must outlive its futures
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def _ck_consume_all(bootstrap, topic, partitions, count, isolation="read_committed"):
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-" + topic,
                  "isolation.level": isolation, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out = []
    deadline = time.monotonic() + 30
    while len(out) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            out.append(m)
    # linger briefly to catch duplicates past the expected count
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        m = c.poll(0.1)
        if m is not None and not m.error():
            out.append(m)
    c.close()
    return out


def test_confluent_admin_create_list_describe(mbroker):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, NewTopic
    admin = _ck_admin(mbroker.bootstrap)
    admin.create_topics([NewTopic("ck-admin", 3, 1, config={"retention.ms": "3600000"})])["ck-admin"].result(15)
    md = admin.list_topics(timeout=10)
    assert len(md.topics["ck-admin"].partitions) == 3
    res = ConfigResource(ConfigResource.Type.TOPIC, "ck-admin")
    configs = admin.describe_configs([res])[res].result(15)
    assert configs["retention.ms"].value == "3600000"
    with pytest.raises(KafkaException) as err:
        admin.create_topics([NewTopic("ck-admin", 3, 1)])["ck-admin"].result(15)
    assert "TOPIC_ALREADY_EXISTS" in str(err.value)
    admin.delete_topics(["ck-admin"])["ck-admin"].result(15)
    assert "ck-admin" not in admin.list_topics(timeout=10).topics


@pytest.mark.parametrize("acks", ["0", "1", "all"])
@pytest.mark.parametrize("codec", CODECS)
def test_confluent_produce_consume(mbroker, acks, codec):
    from confluent_kafka import Producer
    topic = f"ck-{acks}-{codec}"
    _ck_create(mbroker.bootstrap, topic, 2)
    p = Producer({"bootstrap.servers": mbroker.bootstrap, "acks": acks, "compression.type": codec,
                  "linger.ms": 5, "enable.idempotence": acks == "all"})
    failures = []
    for i in range(N):
        p.produce(topic, key=f"k{i}", value=f"{topic}-v{i}", headers=[("h", str(i).encode())],
                  on_delivery=lambda e, m: failures.append(e) if e else None)
    assert p.flush(30) == 0
    assert failures == []
    got = _ck_consume_all(mbroker.bootstrap, topic, 2, N)
    seen = [(m.key().decode(), m.value().decode(), tuple((k, v.decode()) for k, v in m.headers()))
            for m in got]
    assert len(seen) == N
    assert set(seen) == expected(topic)
    # keys hash to a fixed partition: every key lives in exactly one partition
    parts = {}
    for m in got:
        parts.setdefault(m.key(), set()).add(m.partition())
    assert all(len(v) == 1 for v in parts.values())


# --- kafka-python -------------------------------------------------------------------

KP_CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


def test_kafka_python_admin(mbroker):
    from kafka.admin import KafkaAdminClient, NewTopic
    admin = KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    admin.create_topics([NewTopic("kp-admin", 2, 1)])
    desc = admin.describe_topics(["kp-admin"])
    assert len(desc[0]["partitions"]) == 2
    assert "kp-admin" in admin.list_topics()
    admin.delete_topics(["kp-admin"])
    assert "kp-admin" not in admin.list_topics()
    admin.close()


@pytest.mark.parametrize("acks", [0, 1, "all"])
@pytest.mark.parametrize("codec", KP_CODECS)
def test_kafka_python_produce_consume(mbroker, acks, codec):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    topic = f"kp-{acks}-{codec}"
    _ck_create(mbroker.bootstrap, topic, 2)
    p = KafkaProducer(bootstrap_servers=mbroker.bootstrap, acks=acks, compression_type=codec, linger_ms=5)
    futures = [p.send(topic, key=f"k{i}".encode(), value=f"{topic}-v{i}".encode(), headers=[("h", str(i).encode())])
               for i in range(N)]
    p.flush(30)
    for f in futures:
        f.get(10)
    p.close()
    c = KafkaConsumer(bootstrap_servers=mbroker.bootstrap, enable_auto_commit=False,
                      isolation_level="read_committed", consumer_timeout_ms=3000)
    c.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    c.seek_to_beginning()
    seen = [(m.key.decode(), m.value.decode(), tuple((k, v.decode()) for k, v in m.headers)) for m in c]
    c.close()
    assert len(seen) == N
    assert set(seen) == expected(topic)


# --- aiokafka ---------------------------------------------------------------------------

AK_CODECS = [None, "gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("acks", [0, 1, "all"])
@pytest.mark.parametrize("codec", AK_CODECS)
def test_aiokafka_produce_consume(mbroker, acks, codec):
    topic = f"ak-{acks}-{codec}"
    _ck_create(mbroker.bootstrap, topic, 2)
    asyncio.run(_aiokafka_round_trip(mbroker.bootstrap, topic, acks, codec))


async def _aiokafka_round_trip(bootstrap, topic, acks, codec):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=acks, compression_type=codec, linger_ms=5)
    await p.start()
    try:
        futs = [await p.send(topic, key=f"k{i}".encode(), value=f"{topic}-v{i}".encode(),
                             headers=[("h", str(i).encode())]) for i in range(N)]
        await p.flush()
        for f in futs:
            await asyncio.wait_for(f, 10)
    finally:
        await p.stop()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                         isolation_level="read_committed", group_id=None)
    await c.start()
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        seen = []
        deadline = time.monotonic() + 20
        while len(seen) < N and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=500)
            for msgs in batch.values():
                seen += [(m.key.decode(), m.value.decode(), tuple((k, v.decode()) for k, v in m.headers))
                         for m in msgs]
        extra = await c.getmany(timeout_ms=300)
        seen += [m for msgs in extra.values() for m in msgs]
    finally:
        await c.stop()
    assert len(seen) == N
    assert set(seen) == expected(topic)


def test_list_offsets_earliest_latest_timestamp(mbroker):
    from confluent_kafka import Consumer, Producer, TopicPartition
    topic = "offsets-" + uuid.uuid4().hex[:6]
    _ck_create(mbroker.bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": mbroker.bootstrap, "linger.ms": 0})
    base = int(time.time() * 1000)
    for i in range(10):
        p.produce(topic, value=str(i), timestamp=base + i * 1000)
        p.flush(10)
    c = Consumer({"bootstrap.servers": mbroker.bootstrap, "group.id": "x"})
    lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    assert (lo, hi) == (0, 10)
    found = c.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=10)
    assert found[0].offset == 5
    found = c.offsets_for_times([TopicPartition(topic, 0, base + 99_000)], timeout=10)
    assert found[0].offset in (-1, 10)  # "no such record": librdkafka reports end
    c.close()
