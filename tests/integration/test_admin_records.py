"""DeleteRecords (21) through confluent-kafka's and kafka-python's admin clients:
the low watermark moves, reads below it are OFFSET_OUT_OF_RANGE, ListOffsets
earliest follows, nothing above is touched, and it survives a SIGKILL."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError as CKError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support import wire
from tests.support.admin import error_code
from tests.support.brokers import module_broker

N = 300


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    with module_broker(tmp_path_factory, "admin-records") as b:
        yield b


def _topic(b, config=None):
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    name = "trim-" + uuid.uuid4().hex[:8]
    # small segments so a trim also drops whole segment files
    cfg = {"segment.bytes": "4096", **(config or {})}
    admin.create_topics([NewTopic(name, 1, 1, config=cfg)])[name].result(30)
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    for i in range(N):
        p.produce(name, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=0)
    assert p.flush(30) == 0
    return admin, name


def _delete(admin, name, offset):
    tp = TopicPartition(name, 0, offset)
    return admin.delete_records([tp])[tp].result(30)


def _watermarks(b, name):
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(name, 0), 30)
    finally:
        c.close()


def _read_all(b, name, start):
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "r-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(name, 0, start)])
    out = []
    while True:
        m = c.poll(5)
        if m is None:
            break
        assert not m.error(), m.error()
        out.append((m.offset(), m.value()))
        if m.offset() == N - 1:
            break
    c.close()
    return out


def test_trim_moves_low_watermark_and_keeps_the_rest(mbroker):
    admin, name = _topic(mbroker)
    result = _delete(admin, name, 120)
    assert result.low_watermark == 120
    assert _watermarks(mbroker, name) == (120, N)
    got = _read_all(mbroker, name, 120)
    assert got == [(i, f"v{i}".encode()) for i in range(120, N)]
    # a lower offset than the current start is no change
    assert _delete(admin, name, 50).low_watermark == 120
    # a reader positioned below the start is reset (it got OFFSET_OUT_OF_RANGE) to the start
    assert _read_all(mbroker, name, 10)[0][0] == 120


def test_fetch_below_start_is_offset_out_of_range(mbroker):
    from kafka import KafkaConsumer, TopicPartition as KTP
    from kafka.errors import OffsetOutOfRangeError
    admin, name = _topic(mbroker)
    _delete(admin, name, 200)
    c = KafkaConsumer(bootstrap_servers=mbroker.bootstrap, auto_offset_reset="none",
                      enable_auto_commit=False)
    try:
        tp = KTP(name, 0)
        c.assign([tp])
        c.seek(tp, 5)
        with pytest.raises(OffsetOutOfRangeError):
            for _ in range(50):
                c.poll(timeout_ms=500)
        assert c.beginning_offsets([tp])[tp] == 200  # ListOffsets earliest follows
    finally:
        c.close()


def test_errors_are_kafkas(mbroker):
    admin, name = _topic(mbroker)
    for offset in (N + 1, -5):
        tp = TopicPartition(name, 0, offset)
        assert error_code(admin.delete_records([tp])[tp]) == CKError.OFFSET_OUT_OF_RANGE
    # clients find no leader for an unknown partition and send nothing: ask on the wire
    from semel.protocol.messages import request_class
    R = request_class(21)
    topics = [R.DeleteRecordsTopic(name=n, partitions=[R.DeleteRecordsTopic.DeleteRecordsPartition(
        partition_index=p, offset=1)]) for n, p in ((name, 7), ("no-such-topic", 0))]
    sock = wire.connect(mbroker.bootstrap)
    try:
        resp = wire.call(sock, 21, 2, topics=topics, timeout_ms=1000)
    finally:
        sock.close()
    assert [(t.name, t.partitions[0].error_code, t.partitions[0].low_watermark) for t in resp.topics] == [
        (name, CKError.UNKNOWN_TOPIC_OR_PART, -1), ("no-such-topic", CKError.UNKNOWN_TOPIC_OR_PART, -1)]
    admin2, compacted = _topic(mbroker, {"cleanup.policy": "compact"})
    tp = TopicPartition(compacted, 0, 1)
    assert error_code(admin2.delete_records([tp])[tp]) == CKError.POLICY_VIOLATION
    assert _watermarks(mbroker, name) == (0, N)


def test_kafka_python_admin_and_high_watermark(mbroker):
    from kafka.admin import KafkaAdminClient
    from kafka import TopicPartition as KTP
    _, name = _topic(mbroker)
    kp = KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    try:
        out = kp.delete_records({KTP(name, 0): 30})
        assert out[KTP(name, 0)]["low_watermark"] == 30
    finally:
        kp.close()
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    # OFFSET_END (-1 on the wire) trims up to the high watermark
    tp = TopicPartition(name, 0, -1)
    assert admin.delete_records([tp])[tp].result(30).low_watermark == N
    assert _watermarks(mbroker, name) == (N, N)


def test_trim_survives_sigkill(mbroker):
    admin, name = _topic(mbroker)
    _delete(admin, name, 77)
    mbroker.kill()
    mbroker.restart()
    assert _watermarks(mbroker, name) == (77, N)
    assert _read_all(mbroker, name, 77) == [(i, f"v{i}".encode()) for i in range(77, N)]
