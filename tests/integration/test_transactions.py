"""Transactions through three unmodified clients against a real broker process."""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

import pytest

from semel.client import Client
from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker
from tests.support import wait
from tests.support.read_end import read_to_end


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "transactions", "--group-initial-rebalance-delay-ms", "0",
                       "--group-min-session-timeout-ms", "1000", "--transaction-abort-check-interval-ms", "200") as b:
        yield b


@dataclass
class Txn:
    """The module's broker and this test's own topics (so exact reads see only this test)."""
    bootstrap: str
    src: str
    out: str
    other: str


@pytest.fixture
def tbroker(mbroker):
    tag = uuid.uuid4().hex[:8]
    t = Txn(mbroker.bootstrap, f"in-{tag}", f"out-{tag}", f"other-{tag}")
    with Client(t.bootstrap) as c:
        for name, parts in ((t.src, 2), (t.out, 3), (t.other, 1)):
            assert c.create_topic(name, parts) == KafkaError.NONE
    return t


def ck_producer(bootstrap, txn_id, **extra):
    from confluent_kafka import Producer
    conf = {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 1}
    conf.update(extra)
    p = Producer(conf)
    p.init_transactions(20)
    return p


def test_confluent_commit_and_abort_isolation(tbroker):
    p = ck_producer(tbroker.bootstrap, "ck-1")
    p.begin_transaction()
    for i in range(10):
        p.produce(tbroker.out, key=str(i), value=f"c{i}")
    p.commit_transaction(20)
    p.begin_transaction()
    for i in range(10):
        p.produce(tbroker.out, key=str(i), value=f"a{i}")
    p.flush(10)
    p.abort_transaction(20)
    committed = read_to_end(tbroker.bootstrap, tbroker.out, 3, "read_committed")
    uncommitted = read_to_end(tbroker.bootstrap, tbroker.out, 3, "read_uncommitted")
    assert sorted(committed) == sorted(f"c{i}" for i in range(10))
    assert sorted(uncommitted) == sorted([f"c{i}" for i in range(10)] + [f"a{i}" for i in range(10)])


def test_open_transaction_holds_back_read_committed(tbroker):
    p = ck_producer(tbroker.bootstrap, "ck-open")
    p.begin_transaction()
    p.produce(tbroker.other, value="pending")
    p.flush(10)
    with Client(tbroker.bootstrap) as c:
        assert c.list_offset(tbroker.other, 0, -1, isolation=0) == 1      # high watermark
        assert c.list_offset(tbroker.other, 0, -1, isolation=1) == 0      # last stable offset
        fetched = c.fetch(tbroker.other, 0, 0, isolation=1)
        assert fetched.records == b"" and fetched.last_stable_offset == 0
    assert read_to_end(tbroker.bootstrap, tbroker.other, 1, "read_committed") == []
    p.commit_transaction(20)
    with Client(tbroker.bootstrap) as c:
        assert c.list_offset(tbroker.other, 0, -1, isolation=1) == 2      # record + commit marker
    assert read_to_end(tbroker.bootstrap, tbroker.other, 1, "read_committed") == ["pending"]


def test_send_offsets_to_transaction_moves_offsets_only_on_commit(tbroker):
    from confluent_kafka import Consumer, TopicPartition
    group = "ctp"
    c = Consumer({"bootstrap.servers": tbroker.bootstrap, "group.id": group, "enable.auto.commit": False})
    meta = c.consumer_group_metadata()
    p = ck_producer(tbroker.bootstrap, "ck-offsets")
    p.begin_transaction()
    p.produce(tbroker.out, value="x")
    p.send_offsets_to_transaction([TopicPartition(tbroker.src, 0, 5)], meta, 20)
    p.abort_transaction(20)
    assert c.committed([TopicPartition(tbroker.src, 0)], timeout=10)[0].offset < 0
    p.begin_transaction()
    p.produce(tbroker.out, value="y")
    p.send_offsets_to_transaction([TopicPartition(tbroker.src, 0, 7), TopicPartition(tbroker.src, 1, 3)], meta, 20)
    p.commit_transaction(20)
    got = c.committed([TopicPartition(tbroker.src, 0), TopicPartition(tbroker.src, 1)], timeout=10)
    assert [tp.offset for tp in got] == [7, 3]
    c.close()


def test_second_instance_fences_first_and_aborts_its_transaction(tbroker):
    from confluent_kafka import KafkaException
    old = ck_producer(tbroker.bootstrap, "ck-fence")
    old.begin_transaction()
    old.produce(tbroker.out, value="zombie")
    old.flush(10)
    new = ck_producer(tbroker.bootstrap, "ck-fence")     # bumps the epoch, aborts the open txn
    new.begin_transaction()
    new.produce(tbroker.out, value="fresh")
    new.commit_transaction(20)
    with pytest.raises(KafkaException) as exc:
        old.produce(tbroker.out, value="zombie-2")
        old.commit_transaction(10)
    assert exc.value.args[0].fatal() or "fenced" in str(exc.value).lower()
    values = read_to_end(tbroker.bootstrap, tbroker.out, 3, "read_committed")
    assert "fresh" in values and "zombie" not in values and "zombie-2" not in values


def test_transaction_timeout_aborts_and_fences(tbroker):
    from confluent_kafka import KafkaException
    p = ck_producer(tbroker.bootstrap, "ck-timeout", **{"transaction.timeout.ms": 1000})
    p.begin_transaction()
    p.produce(tbroker.out, value="too-slow")
    p.flush(10)

    def nothing_open():
        with Client(tbroker.bootstrap) as c:
            lso = [c.list_offset(tbroker.out, i, -1, isolation=1) for i in range(3)]
            hw = [c.list_offset(tbroker.out, i, -1, isolation=0) for i in range(3)]
        return lso == hw
    # The coordinator aborts it (and bumps the epoch) once its 1 s timeout passed: polled, not slept.
    wait.until(nothing_open, "the timed-out transaction aborted (LSO == high watermark)", timeout_s=30)
    with pytest.raises(KafkaException):
        p.commit_transaction(10)
    assert "too-slow" not in read_to_end(tbroker.bootstrap, tbroker.out, 3, "read_committed")


def test_kafka_python_transactions(tbroker):
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    p = KafkaProducer(bootstrap_servers=tbroker.bootstrap, transactional_id="kp-1")
    p.init_transactions()
    p.begin_transaction()
    p.send(tbroker.out, b"kp-commit")
    p.send_offsets_to_transaction({TopicPartition(tbroker.src, 0): _offset_meta(11)}, "kp-group")
    p.commit_transaction()
    p.begin_transaction()
    p.send(tbroker.out, b"kp-abort")
    p.flush()
    p.abort_transaction()
    p.close()
    values = read_to_end(tbroker.bootstrap, tbroker.out, 3, "read_committed")
    assert "kp-commit" in values and "kp-abort" not in values
    assert "kp-abort" in read_to_end(tbroker.bootstrap, tbroker.out, 3, "read_uncommitted")
    c = KafkaConsumer(bootstrap_servers=tbroker.bootstrap, group_id="kp-group", enable_auto_commit=False)
    assert c.committed(TopicPartition(tbroker.src, 0)) == 11
    c.close()


def _offset_meta(offset):
    from kafka.structs import OffsetAndMetadata
    try:
        return OffsetAndMetadata(offset, "", -1)
    except TypeError:
        return OffsetAndMetadata(offset, "")


def test_aiokafka_transactions(tbroker):
    asyncio.run(_aiokafka_txn(tbroker))
    values = read_to_end(tbroker.bootstrap, tbroker.out, 3, "read_committed")
    assert "ak-commit" in values and "ak-abort" not in values


async def _aiokafka_txn(tbroker):
    bootstrap = tbroker.bootstrap
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="ak-1")
    await p.start()
    try:
        async with p.transaction():
            await p.send_and_wait(tbroker.out, b"ak-commit")
            await p.send_offsets_to_transaction({TopicPartition(tbroker.src, 1): 4}, "ak-group")
        await p.begin_transaction()
        await p.send_and_wait(tbroker.out, b"ak-abort")
        await p.abort_transaction()
    finally:
        await p.stop()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id="ak-group", enable_auto_commit=False)
    await c.start()
    try:
        assert await c.committed(TopicPartition(tbroker.src, 1)) == 4
    finally:
        await c.stop()
