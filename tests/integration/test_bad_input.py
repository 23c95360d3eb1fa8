"""Bad input on the wire: a Kafka error code or a clean close, never a crash or a partial write."""
from __future__ import annotations

import struct

import crc32c
import pytest

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from semel.protocol.messages import decode_response, request_class
from tests.support.brokers import module_broker
from tests.support.wire import call, closed_by_peer, connect, recv_frame, request_bytes


@pytest.fixture(scope="module")
def small_broker(tmp_path_factory):
    """One broker for the module (each test uses its own topics): it must outlive
    every bad input of every test, which _alive checks after each."""
    with module_broker(tmp_path_factory, "bad-input", "--max-request-bytes", "65536") as b:
        yield b


def _alive(broker) -> None:
    assert broker.alive()
    with Client(broker.bootstrap) as c:
        assert c.metadata(None).brokers[0].port == broker.port


def test_too_new_api_versions_gets_unsupported_version_and_ranges(small_broker):
    sock = connect(small_broker.bootstrap)
    # ApiVersions v99: header says a version we do not speak; the body is empty.
    sock.sendall(struct.pack(">ihhih", 10, 18, 99, 7, -1))
    frame = recv_frame(sock)
    corr, body = decode_response(18, 0, frame)
    assert corr == 7
    assert body.error_code == KafkaError.UNSUPPORTED_VERSION
    keys = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert keys[18] == (0, 3) and keys[0][0] == 3


def test_unknown_api_key_closes_connection(small_broker):
    sock = connect(small_broker.bootstrap)
    sock.sendall(struct.pack(">ihhih", 10, 999, 0, 1, -1))
    assert closed_by_peer(sock)
    _alive(small_broker)


def test_oversized_frame_closes_connection(small_broker):
    sock = connect(small_broker.bootstrap)
    sock.sendall(struct.pack(">i", 10_000_000) + b"\0" * 100)
    assert closed_by_peer(sock)
    _alive(small_broker)


def test_negative_frame_size_closes_connection(small_broker):
    sock = connect(small_broker.bootstrap)
    sock.sendall(struct.pack(">i", -5))
    assert closed_by_peer(sock)
    _alive(small_broker)


def test_truncated_frame_then_disconnect_leaves_broker_serving(small_broker):
    sock = connect(small_broker.bootstrap)
    full = request_bytes(3, 9, topics=None, allow_auto_topic_creation=False)
    sock.sendall(full[: len(full) // 2])
    sock.close()
    _alive(small_broker)


def test_malformed_body_closes_connection(small_broker):
    sock = connect(small_broker.bootstrap)
    # Metadata v9 header followed by garbage where the compact topic array should be.
    head = struct.pack(">hhih", 3, 9, 1, 4) + b"test" + b"\0"
    payload = head + b"\xff\xff\xff\xff\xff\xff\xff"
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    assert closed_by_peer(sock)
    _alive(small_broker)


def test_crc_mismatch_is_corrupt_message_and_nothing_is_appended(small_broker):
    with Client(small_broker.bootstrap) as c:
        assert c.create_topic("crc", 1) == KafkaError.NONE
        batch = bytearray(records.build_batch([(b"k", b"v")]))
        batch[-1] ^= 0xFF
        err, _ = c.produce("crc", 0, bytes(batch))
        assert err == KafkaError.CORRUPT_MESSAGE
        assert c.list_offset("crc", 0, -1) == 0
        # A truncated batch (length says more than was sent) is rejected the same way.
        good = records.build_batch([(b"k", b"v")])
        err, _ = c.produce("crc", 0, good[:-3])
        assert err == KafkaError.CORRUPT_MESSAGE
        assert c.list_offset("crc", 0, -1) == 0
        err, base = c.produce("crc", 0, good)
        assert (err, base) == (KafkaError.NONE, 0)


def test_old_magic_is_rejected(small_broker):
    with Client(small_broker.bootstrap) as c:
        c.create_topic("magic", 1)
        batch = bytearray(records.build_batch([(b"k", b"v")]))
        batch[16] = 1
        err, _ = c.produce("magic", 0, bytes(batch))
        assert err == KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT
        assert c.list_offset("magic", 0, -1) == 0


@pytest.mark.parametrize("name", ["bad name", "x" * 250, "..", "a/b", ""])
def test_invalid_topic_names(small_broker, name):
    with Client(small_broker.bootstrap) as c:
        assert c.create_topic(name, 1) == KafkaError.INVALID_TOPIC_EXCEPTION


def test_unknown_topic_and_partition(small_broker):
    with Client(small_broker.bootstrap) as c:
        err, _ = c.produce("nope", 0, records.build_batch([(None, b"v")]))
        assert err == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        c.create_topic("one", 1)
        err, _ = c.produce("one", 5, records.build_batch([(None, b"v")]))
        assert err == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        assert c.fetch("nope", 0, 0).error == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        assert "nope" not in {t.name for t in c.metadata(None).topics}


def test_auto_create_when_enabled(start_broker):
    b = start_broker("--auto-create-topics", "--default-partitions", "3")
    with Client(b.bootstrap) as c:
        err, base = c.produce("auto", 2, records.build_batch([(None, b"v")]))
        assert (err, base) == (KafkaError.NONE, 0)
        assert c.partitions("auto") == 3


def test_duplicate_topic_and_bad_partition_count(small_broker):
    with Client(small_broker.bootstrap) as c:
        assert c.create_topic("dup", 2) == KafkaError.NONE
        assert c.create_topic("dup", 2) == KafkaError.TOPIC_ALREADY_EXISTS
        assert c.create_topic("zero", 0) == KafkaError.INVALID_PARTITIONS


def test_clients_cannot_write_internal_topics(small_broker):
    with Client(small_broker.bootstrap) as c:
        err, _ = c.produce("__consumer_offsets", 0, records.build_batch([(b"k", b"v")]))
        assert err != KafkaError.NONE
        assert c.delete_topic("__consumer_offsets") != KafkaError.NONE


def test_invalid_acks(small_broker):
    with Client(small_broker.bootstrap) as c:
        c.create_topic("acks", 1)
        err, _ = c.produce("acks", 0, records.build_batch([(None, b"v")]), acks=7)
        assert err == KafkaError.INVALID_REQUIRED_ACKS
        assert c.list_offset("acks", 0, -1) == 0


def test_unsupported_version_of_other_api_closes(small_broker):
    sock = connect(small_broker.bootstrap)
    sock.sendall(struct.pack(">ihhih", 10, 3, 42, 1, -1))
    assert closed_by_peer(sock)
    _alive(small_broker)


def test_fetch_out_of_range(small_broker):
    with Client(small_broker.bootstrap) as c:
        c.create_topic("oor", 1)
        c.produce("oor", 0, records.build_batch([(None, b"v")]))
        assert c.fetch("oor", 0, 50).error == KafkaError.OFFSET_OUT_OF_RANGE
        assert c.fetch("oor", 0, 0).error == KafkaError.NONE


def test_request_pipelining_keeps_order(small_broker):
    """Several requests written at once are answered in order (correlation ids)."""
    sock = connect(small_broker.bootstrap)
    frames = b"".join(request_bytes(3, 9, corr=i, topics=None, allow_auto_topic_creation=False)
                      for i in range(1, 21))
    sock.sendall(frames)
    for i in range(1, 21):
        frame = recv_frame(sock)
        corr, _ = decode_response(3, 9, frame)
        assert corr == i
    assert call(sock, 18, 3, corr=99, client_software_name="t", client_software_version="1").error_code == 0
    request_class(18)  # keep import used


def test_clients_cannot_write_control_batches(small_broker):
    """A control batch (commit/abort marker) is the coordinator's alone, with or
    without the transactional bit."""
    with Client(small_broker.bootstrap) as c:
        c.create_topic("ctl", 1)
        marker = bytearray(records.build_control_batch(records.CONTROL_COMMIT, producer_id=5, producer_epoch=0))
        assert c.produce("ctl", 0, bytes(marker))[0] == KafkaError.INVALID_RECORD
        # clear the transactional bit (attributes at byte 21..22) and fix the CRC
        attrs = struct.unpack_from(">h", marker, 21)[0] & ~records.ATTR_TRANSACTIONAL
        struct.pack_into(">h", marker, 21, attrs)
        struct.pack_into(">I", marker, 17, crc32c.crc32c(bytes(marker[21:])))
        assert c.produce("ctl", 0, bytes(marker))[0] == KafkaError.INVALID_RECORD
        assert c.list_offset("ctl", 0, -1) == 0
