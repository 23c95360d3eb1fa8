"""What the produce/fetch hot path skips, and what still guards it.

The broker reads only batch headers: records are never decoded, the client's bytes
are stored with just the base offset patched in, and Fetch serves them as they lie
in the segment file. So the CRC-32C over the batch is the only check of record
bytes on produce, and recovery's scan is the only check of a torn tail. These tests
run against real broker processes.
"""
from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Producer

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from tests.support.brokers import module_broker
from tests.support.consume import read_values
from tests.support.wait import until

CRC_START = 21            # the CRC-32C covers bytes 21.. of a batch (attributes onwards)


@pytest.fixture(scope="module")
def hot_broker(tmp_path_factory):
    with module_broker(tmp_path_factory, "hotpath") as b:
        yield b


def _batch(values, **kw) -> bytes:
    return records.build_batch([(None, v) for v in values], timestamp_ms=1_700_000_000_000, **kw)


def _patched(payload: bytes, first_offset: int) -> bytes:
    """The client's payload with each batch's base offset set as the broker assigns it."""
    out = bytearray(payload)
    offset = first_offset
    for pos, hdr in records.iter_batches(payload):
        records.set_base_offset(out, pos, offset)
        offset = hdr.next_offset - hdr.base_offset + offset
    return bytes(out)


def test_stored_bytes_are_the_clients_bytes_with_only_the_offset_patched(hot_broker):
    with Client(hot_broker.bootstrap) as c:
        assert c.create_topic("asis", 1) == KafkaError.NONE
        assert c.produce("asis", 0, _batch([b"first"]))[0] == KafkaError.NONE
        # Two batches in one payload, with a base offset the client made up (777):
        # both are rewritten to the log's offsets, nothing else changes.
        payload = _batch([b"a", b"bb", b"ccc"], base_offset=777) + _batch([b"d" * 3000], base_offset=9)
        err, base = c.produce("asis", 0, payload)
        assert (err, base) == (KafkaError.NONE, 1)
        served = c.fetch("asis", 0, 1, max_bytes=1 << 20).records
        assert served == _patched(payload, 1)
        # The CRC was not recomputed and still holds: the patched bytes lie outside it.
        for pos, hdr in records.iter_batches(served):
            assert records.crc_ok(served, pos, hdr.size)
        assert [r.offset for pos, _ in records.iter_batches(served)
                for r in records.iter_records(served, pos)] == [1, 2, 3, 4]


@pytest.mark.parametrize("where", ["attributes", "record value", "last byte"])
def test_a_flipped_byte_under_the_crc_is_corrupt_message_and_nothing_is_stored(hot_broker, where):
    topic = f"flip-{where.replace(' ', '-')}"
    with Client(hot_broker.bootstrap) as c:
        assert c.create_topic(topic, 1) == KafkaError.NONE
        good = _batch([b"keep"])
        bad = bytearray(_batch([b"value-" + b"v" * 100]))
        at = {"attributes": CRC_START, "record value": len(bad) - 40, "last byte": len(bad) - 1}[where]
        bad[at] ^= 0x01
        # A good batch ahead of the bad one in the same payload is refused with it:
        # a partition's payload is all-or-nothing.
        err, _ = c.produce(topic, 0, good + bytes(bad))
        assert err == KafkaError.CORRUPT_MESSAGE
        assert c.list_offset(topic, 0, -1) == 0
        assert c.fetch(topic, 0, 0).records == b""
        assert c.produce(topic, 0, good) == (KafkaError.NONE, 0)


def test_batch_length_pointing_past_the_payload_is_corrupt_message(hot_broker):
    with Client(hot_broker.bootstrap) as c:
        assert c.create_topic("lenpast", 1) == KafkaError.NONE
        bad = bytearray(_batch([b"x" * 50]))
        bad[8:12] = (len(bad) + 100).to_bytes(4, "big")     # batchLength beyond the bytes sent
        assert c.produce("lenpast", 0, bytes(bad))[0] == KafkaError.CORRUPT_MESSAGE
        assert c.list_offset("lenpast", 0, -1) == 0


def test_a_torn_tail_is_cut_on_restart_after_sigkill(start_broker, tmp_path):
    """SIGKILL, then the end of the active segment holds half a batch (a write the
    kill tore): the restarted broker cuts it, serves the acknowledged records as
    they were, and the next append takes the next offset."""
    b = start_broker(data_dir=tmp_path / "torn")
    with Client(b.bootstrap) as c:
        assert c.create_topic("torn", 1) == KafkaError.NONE
        for i in range(20):
            assert c.produce("torn", 0, _batch([b"r%d" % i] * 3))[0] == KafkaError.NONE
        before = c.fetch("torn", 0, 0, max_bytes=1 << 20).records
    b.kill()
    seg = sorted((tmp_path / "torn" / "torn-0").glob("*.log"))[-1]
    size = seg.stat().st_size
    half = _patched(_batch([b"torn" * 100]), 60)
    with open(seg, "ab") as f:
        f.write(half[: len(half) // 2])
    b.start()
    with Client(b.bootstrap) as c:
        assert c.list_offset("torn", 0, -1) == 60
        assert c.fetch("torn", 0, 0, max_bytes=1 << 20).records == before
        assert c.produce("torn", 0, _batch([b"after"])) == (KafkaError.NONE, 60)
        assert [r.value for r in records.iter_records(c.fetch("torn", 0, 60).records)] == [b"after"]
    assert seg.stat().st_size == size + len(_patched(_batch([b"after"]), 60))


def test_large_appends_written_off_the_loop_survive_sigkill_exactly_once(start_broker, tmp_path):
    """Batches of 64 KiB and more are written by a worker thread (PartitionLog.append_async)
    while the loop serves others. Three idempotent confluent-kafka producers (acks=all,
    ~200 KiB batches) write while the broker is SIGKILLed and restarted: every record
    the broker acknowledged is there after the restart, and no record is there twice."""
    b = start_broker(data_dir=tmp_path / "offloop")
    with Client(b.bootstrap) as c:
        assert c.create_topic("offloop", 2) == KafkaError.NONE
    acked: list[str] = []
    stop = threading.Event()

    def run(n: int) -> None:
        p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 20, "batch.size": 200_000, "message.timeout.ms": 30_000})
        pad = "x" * 2000
        i = 0
        while not stop.is_set():
            p.produce("offloop", value=f"p{n}-{i:07d}-{pad}".encode(), partition=i % 2,
                      on_delivery=lambda err, msg: None if err else acked.append(msg.value().decode()))
            p.poll(0)
            i += 1
            if i % 200 == 0:
                time.sleep(0.005)    # keep the producer's queue bounded
        p.flush(60)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    try:
        until(lambda: len(acked) >= 3000, "records acknowledged before the kill")
        b.kill()
        b.start()
        before_restart = len(acked)
        until(lambda: len(acked) >= before_restart + 3000, "records acknowledged after the restart")
    finally:
        stop.set()
        for t in threads:
            t.join(90)
    stored = read_values(b.bootstrap, "offloop", 2, isolation="read_uncommitted", want=len(acked))
    assert len(stored) == len(set(stored)), "a record was stored twice"
    assert set(acked) <= set(stored), f"{len(set(acked) - set(stored))} acknowledged records lost"


def _produce_frame(topic: str, payload: bytes, correlation_id: int) -> bytes:
    """A framed Produce v3 request (acks=-1) for partition 0, as a client sends it."""
    from kafka.protocol.producer import ProduceRequest
    T = ProduceRequest.TopicProduceData
    req = ProduceRequest(version=3, transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        T(version=3, name=topic, partition_data=[T.PartitionProduceData(version=3, index=0, records=payload)])])
    req.with_header(correlation_id=correlation_id, client_id="raw")
    return bytes(req.encode(version=3, header=True, framed=True))


def _read_frame(sock) -> bytes:
    def exactly(n):
        out = b""
        while len(out) < n:
            more = sock.recv(n - len(out))
            assert more, "connection closed before the response"
            out += more
        return out
    return exactly(int.from_bytes(exactly(4), "big"))


def trickle_and_check(bootstrap: str, topic: str, connect) -> None:
    """A ~300 KB produce frame sent in 7 KB pieces over `connect()`'s socket, the last
    piece holding the rest of it and a whole small frame: both must be answered in order
    and stored as sent, offsets patched (test_tls_frames sends it over TLS)."""
    with Client(bootstrap) as c:
        assert c.create_topic(topic, 1) == KafkaError.NONE
    big = _batch([bytes([i % 251]) * 1000 for i in range(300)])          # ~300 KB
    small = _batch([b"after"])
    stream = _produce_frame(topic, big, 1) + _produce_frame(topic, small, 2)
    with connect() as sock:
        for at in range(0, len(stream), 7001):     # the last piece holds the small frame whole
            sock.sendall(stream[at:at + 7001])
            time.sleep(0.001)
        first, second = _read_frame(sock), _read_frame(sock)
    assert first[:4] == (1).to_bytes(4, "big") and second[:4] == (2).to_bytes(4, "big")
    with Client(bootstrap) as c:
        served = c.fetch(topic, 0, 0, max_bytes=1 << 20).records
    assert served == _patched(big, 0) + _patched(small, 300)


def test_a_large_frame_trickling_in_is_stored_as_sent_and_answered(hot_broker):
    """A produce frame far above the frame reader's scratch buffer, sent in small pieces
    with a small frame right behind it in the same write: both are answered in order
    and the big one's bytes are stored as sent, offsets patched."""
    import socket
    host, port = hot_broker.bootstrap.split(":")
    trickle_and_check(hot_broker.bootstrap, "trickle",
                      lambda: socket.create_connection((host, int(port)), timeout=30))


def test_responses_still_go_out_after_the_client_shuts_its_side(hot_broker):
    """A client that sends a request and then shuts down its writing side (half-close)
    still gets the answer, as on the stream path."""
    import socket
    with Client(hot_broker.bootstrap) as c:
        assert c.create_topic("halfclose", 1) == KafkaError.NONE
    host, port = hot_broker.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(_produce_frame("halfclose", _batch([b"x"]), 5))
        sock.shutdown(socket.SHUT_WR)
        assert _read_frame(sock)[:4] == (5).to_bytes(4, "big")


def _produce_many(c: Client, topic: str, batches: dict[int, bytes]) -> dict[int, KafkaError]:
    """One acks=all Produce naming several partitions; each partition's error."""
    from semel.protocol.messages import request_class
    T = request_class(0).TopicProduceData
    resp = c.request(0, transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[T(name=topic, partition_data=[
        T.PartitionProduceData(index=p, records=b) for p, b in batches.items()])])
    return {p.index: KafkaError(p.error_code) for p in resp.responses[0].partition_responses}


def test_acks_all_is_answered_only_after_an_fsync_covered_the_batch(start_broker, tmp_path):
    """The acks=all paths of one node (PartitionLog.append_async): a large single-
    partition append is fsynced by its own write thread; when that fsync fails the
    producer gets KAFKA_STORAGE_ERROR, never NONE (no later fsync vouches for pages the
    failed one may have dropped), and the next append cuts the batch back first
    (storage/fsync_repair.py). A request naming several partitions writes them on the
    loop and each gets the outcome of its own log's fsync."""
    from test_txn_faults import arm
    ctl = tmp_path / "faults"
    b = start_broker(env={"SEMEL_FS_FAULTS": f"control_file={ctl}"})
    b.control_file = ctl
    big = [b"w" * 1000] * 200                        # ~200 KB: over the off-loop write size
    with Client(b.bootstrap) as c:
        assert c.create_topic("wt", 1) == KafkaError.NONE
        assert c.create_topic("multi", 3) == KafkaError.NONE
        assert c.produce("wt", 0, _batch(big)) == (KafkaError.NONE, 0)
        arm(b, "fail_next_fsync=1,path_contains=wt-0/")     # the write's own fsync
        assert c.produce("wt", 0, _batch(big))[0] == KafkaError.KAFKA_STORAGE_ERROR
        assert c.produce("wt", 0, _batch(big)) == (KafkaError.NONE, 200)   # written where it was cut
        arm(b, "clear=1,fail_next_fsync=1,path_contains=multi-1/")
        got = _produce_many(c, "multi", {p: _batch(big) for p in range(3)})
        assert got == {0: KafkaError.NONE, 1: KafkaError.KAFKA_STORAGE_ERROR, 2: KafkaError.NONE}
        arm(b, "clear=1")
        assert _produce_many(c, "multi", {p: _batch([b"m"]) for p in range(3)}) == {p: KafkaError.NONE for p in range(3)}
    # What failed its fsync was cut back: only the batches acknowledged are stored.
    assert read_values(b.bootstrap, "wt", 1, "read_uncommitted", want=400) == ["w" * 1000] * 400
    multi = read_values(b.bootstrap, "multi", 3, "read_uncommitted", want=400 + 3)
    assert sorted(multi) == sorted(["w" * 1000] * 400 + ["m"] * 3)   # multi-1's big batch was cut
