"""Random and mutated frames at a running broker: it answers, closes the
connection, or ignores them — and afterwards still serves a normal client."""
from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semel.client import Client
from semel.protocol import records
from semel.protocol.messages import request_class
from tests.support.wire import request_bytes


def _seeds():
    P = request_class(0)
    F = request_class(1)
    batch = records.build_batch([(b"k", b"v", [("h", b"x")])])
    return [
        request_bytes(18, 3, client_software_name="fuzz", client_software_version="1"),
        request_bytes(3, 9, topics=[request_class(3).MetadataRequestTopic(name="fuzz")],
                      allow_auto_topic_creation=False),
        request_bytes(0, 9, transactional_id=None, acks=-1, timeout_ms=1000, topic_data=[
            P.TopicProduceData(name="fuzz", partition_data=[P.TopicProduceData.PartitionProduceData(
                index=0, records=batch)])]),
        request_bytes(1, 12, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=1,
                      session_id=0, session_epoch=-1, topics=[F.FetchTopic(topic="fuzz", partitions=[
                          F.FetchTopic.FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0,
                                                      last_fetched_epoch=-1, log_start_offset=-1,
                                                      partition_max_bytes=1 << 20)])],
                      forgotten_topics_data=[], rack_id=""),
        request_bytes(22, 4, transactional_id="fz", transaction_timeout_ms=1000, producer_id=-1,
                      producer_epoch=-1),
        request_bytes(11, 5, group_id="g", session_timeout_ms=10000, rebalance_timeout_ms=10000,
                      member_id="", group_instance_id=None, protocol_type="consumer", protocols=[]),
    ]


SEEDS = _seeds()


@st.composite
def mutated_frame(draw):
    kind = draw(st.sampled_from(["random", "flip", "truncate", "header", "length"]))
    if kind == "random":
        body = draw(st.binary(min_size=0, max_size=300))
        return struct.pack(">i", len(body)) + body
    seed = bytearray(draw(st.sampled_from(SEEDS)))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(4, len(seed) - 1))
            seed[i] = draw(st.integers(0, 255))
    elif kind == "truncate":
        cut = draw(st.integers(4, len(seed) - 1))
        seed = seed[:cut]
        struct.pack_into(">i", seed, 0, len(seed) - 4)
    elif kind == "header":
        struct.pack_into(">hh", seed, 4, draw(st.integers(-5, 80)), draw(st.integers(-2, 20)))
    else:
        struct.pack_into(">i", seed, 0, draw(st.integers(-10, len(seed) + 50)))
    return bytes(seed)


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    from semel.cli.process import SemelBroker
    d = tmp_path_factory.mktemp("fuzz")
    b = SemelBroker(d / "data", log_path=d / "broker.log", extra_args=["--max-request-bytes", "100000"])
    b.start()
    with Client(b.bootstrap) as c:
        c.create_topic("fuzz", 1)
    yield b
    b.close()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(mutated_frame(), min_size=1, max_size=4))
def test_mutated_frames_never_break_the_broker(fuzz_broker, frames):
    host, port = fuzz_broker.host, fuzz_broker.port
    with socket.create_connection((host, port), timeout=2) as s:
        try:
            s.sendall(b"".join(frames))
            s.settimeout(0.2)
            while s.recv(65536):
                pass
        except (socket.timeout, ConnectionResetError, BrokenPipeError):
            pass
    assert fuzz_broker.alive()


def test_broker_still_serves_after_fuzzing(fuzz_broker):
    from confluent_kafka import Consumer, Producer, TopicPartition
    p = Producer({"bootstrap.servers": fuzz_broker.bootstrap, "enable.idempotence": True})
    p.produce("fuzz", value=b"after-fuzz")
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": fuzz_broker.bootstrap, "group.id": "f", "enable.auto.commit": False})
    c.assign([TopicPartition("fuzz", 0, 0)])
    values = []
    for _ in range(40):
        m = c.poll(0.25)
        if m is not None and not m.error():
            values.append(m.value())
    c.close()
    assert b"after-fuzz" in values
    # Every value in the log is a whole record produced by a client or a fuzz frame that
    # was a valid request: none is torn (the consumer would have raised on a bad CRC).
    assert fuzz_broker.alive()
