"""Random and mutated frames at a running broker: it answers, closes the
connection, or ignores them — and afterwards still serves a normal client.

The structure-aware part draws requests of every API key and version
the running broker advertises in ApiVersions from the codec's own schemas
(tests/support/wire_fuzz.py), mutates half of them, and after each one checks:
the broker answered or closed that connection and is alive; a bystander
connection is answered within the watchdog's stall bound; a request the broker
rejected (closed without an answer) appended nothing but transaction markers
(which timed-out fuzz transactions may get at any moment) to any partition; and
the records written before fuzzing read back byte for byte.

A mutated header can turn a seed into another well-formed request: the Metadata
seed read as DeleteTopics deletes the fuzzed topic, as Kafka would. The broker
logs every deletion, and the check after fuzzing accepts a missing topic only
with that line (then creates it again).
"""
from __future__ import annotations

import random
import socket
import struct
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semel.client import Client
from semel.protocol import records
from semel.protocol.errors import KafkaError
from semel.protocol.messages import decode_response, request_class
from tests.support.brokers import module_broker
from tests.support.markers import starts_processes
from tests.support.wire import call, connect, recv_frame, request_bytes
from tests.support.wire_fuzz import advertised, mutate, random_request

STALL_BOUND_S = 2.0   # the broker's default --loop-stall-ms


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
@starts_processes
def fuzz_broker(tmp_path_factory):
    with module_broker(tmp_path_factory, "fuzz", "--max-request-bytes", "100000") as b:
        with Client(b.bootstrap) as c:
            c.create_topic("fuzz", 1)
        yield b


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


def _fuzzed_delete_topics(version: int) -> bytes:
    """The Metadata v9 seed under a header that the "header" mutation draws now and then:
    api 20 (DeleteTopics) v4 or v5. For one topic the two flexible bodies line up byte for
    byte (the compact array of one name; the topic's tag buffer and Metadata's three booleans,
    all zero, read as timeout_ms=0; Metadata's tag buffer as the request's), so the frame is a well-formed
    request to delete topic "fuzz" and the broker deletes it, as Kafka would."""
    frame = bytearray(SEEDS[1])
    struct.pack_into(">hh", frame, 4, 20, version)
    return bytes(frame)


def _topic_or_its_deletion(b, topic: str) -> None:
    """`topic` exists, or the broker log says a well-formed DeleteTopics deleted it (a fuzz
    frame can be one: _fuzzed_delete_topics); then it is created again, so that what follows
    checks the broker, not an idempotent producer waiting for a topic nobody will create.
    A topic gone without that line was lost, and the test fails."""
    with Client(b.bootstrap) as c:
        if c.metadata([topic]).topics[0].error_code == KafkaError.NONE:
            return
        log = b.log_path.read_text(errors="replace")
        assert f"deleted topic {topic} (DeleteTopics" in log, f"topic {topic} vanished without a DeleteTopics"
        assert c.create_topic(topic, 1) == KafkaError.NONE


def _served_idempotently(bootstrap: str, topic: str, value: bytes) -> None:
    """An idempotent confluent-kafka producer gets `value` acknowledged, and a consumer reads it."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    p.produce(topic, value=value)
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "f", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    values = []
    for _ in range(40):
        m = c.poll(0.25)
        if m is not None and not m.error():
            values.append(m.value())
    c.close()
    assert value in values
    # Every value in the log is a whole record produced by a client or a fuzz frame that
    # was a valid request: none is torn (the consumer would have raised on a bad CRC).


def test_broker_still_serves_after_fuzzing(fuzz_broker):
    _topic_or_its_deletion(fuzz_broker, "fuzz")
    _served_idempotently(fuzz_broker.bootstrap, "fuzz", b"after-fuzz")
    assert fuzz_broker.alive()


@pytest.fixture
@starts_processes
def delete_broker(tmp_path_factory):
    with module_broker(tmp_path_factory, "fuzzdelete", "--max-request-bytes", "100000") as b:
        yield b


def test_a_mutated_header_that_spells_delete_topics_is_served_as_one(delete_broker):
    """The frame sequence behind a flush that timed out after fuzzing, replayed: a mutated
    Metadata header made a DeleteTopics of the fuzzed topic. The broker answers it as the
    well-formed request it is, logs the deletion, and serves an idempotent producer at once
    when the topic exists again."""
    b = delete_broker
    with Client(b.bootstrap) as c:
        for version in (4, 5):
            assert c.create_topic("fuzz", 1) == KafkaError.NONE
            with connect(b.bootstrap) as s:
                s.sendall(_fuzzed_delete_topics(version))
                frame = recv_frame(s)
            assert frame is not None
            answer = decode_response(20, version, frame)[1]
            assert [(r.name, r.error_code) for r in answer.responses] == [("fuzz", KafkaError.NONE)]
            assert c.metadata(["fuzz"]).topics[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    log = b.log_path.read_text(errors="replace")
    assert "deleted topic fuzz (DeleteTopics v4 from" in log and "deleted topic fuzz (DeleteTopics v5 from" in log
    _topic_or_its_deletion(b, "fuzz")
    _served_idempotently(b.bootstrap, "fuzz", b"after-delete")
    assert b.alive()


# --- structure-aware: every advertised API and version, from the schemas ----------

@pytest.fixture(scope="module")
@starts_processes
def schema_fuzz(tmp_path_factory):
    with module_broker(tmp_path_factory, "schemafuzz", "--max-request-bytes", "1000000") as b:
        with Client(b.bootstrap) as c:
            c.create_topic("kept", 1)
            c.create_topic("fuzz", 2)
            for i in range(20):
                c.produce("kept", 0, records.build_batch([(b"k%d" % i, b"kept-%d" % i)]))
            b.kept = c.fetch("kept", 0, 0).records
            versions = c.request(18, client_software_name="fuzz", client_software_version="1")
        # What the running broker advertises: handlers added later are fuzzed without a change here.
        b.pairs = advertised({k.api_key: (k.min_version, k.max_version) for k in versions.api_keys})
        with connect(b.bootstrap, timeout=30) as b.bystander:
            yield b


def _segment_sizes(data_dir: Path) -> dict[Path, int]:
    """Sizes of the user partitions' segment files (internal logs are written in the background)."""
    return {p: p.stat().st_size for p in data_dir.glob("*/*.log") if not p.parent.name.startswith("__")}


def _only_markers_added(before: dict[Path, int], after: dict[Path, int]) -> list[str]:
    wrong = []
    for path, size in after.items():
        old = before.get(path, 0)
        if size == old:
            continue
        data = path.read_bytes()[old:size]
        for _, hdr in records.iter_batches(data):
            if not hdr.is_control:
                wrong.append(f"{path.parent.name}: a data batch at offset {hdr.base_offset}")
    return wrong


def _send_one(b, frame: bytes) -> str:
    """'answered', 'closed' or 'pending' (no answer yet: a long poll, acks=0, a short frame)."""
    with socket.create_connection((b.host, b.port), timeout=5) as s:
        s.sendall(frame)
        s.settimeout(0.3)
        try:
            head = s.recv(4)
        except socket.timeout:
            return "pending"
        except ConnectionResetError:
            return "closed"
        return "answered" if head else "closed"


def _bystander_seconds(b) -> float:
    t0 = time.monotonic()
    resp = call(b.bystander, 18, 3, client_software_name="bystander", client_software_version="1")
    assert resp is not None and resp.error_code == 0
    return time.monotonic() - t0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), mutated=st.booleans())
def test_schema_drawn_requests_of_every_api_never_break_the_broker(schema_fuzz, data, seed, mutated):
    b = schema_fuzz
    key, version = data.draw(st.sampled_from(b.pairs), label="api")
    rng = random.Random(seed)
    frame = random_request(rng, key, version, corr=seed & 0x7FFFFFFF)
    if mutated:
        frame = mutate(rng, frame)
    before = _segment_sizes(b.data_dir)
    outcome = _send_one(b, frame)
    assert b.alive(), f"broker died on api {key} v{version}"
    if outcome == "closed":
        wrong = _only_markers_added(before, _segment_sizes(b.data_dir))
        assert not wrong, f"a rejected api {key} v{version} request wrote {wrong}"
    assert _bystander_seconds(b) < STALL_BOUND_S


def test_every_advertised_api_was_fuzzed_and_data_is_intact(schema_fuzz):
    b = schema_fuzz
    keys = {k for k, _ in b.pairs}
    assert {0, 1, 2, 3, 18, 22, 24, 26} <= keys      # and whatever else the router offers now
    with Client(b.bootstrap) as c:
        assert c.fetch("kept", 0, 0).records == b.kept   # byte for byte
    log = (b.log_path).read_text(errors="replace")
    # A handler that raised is our bug even when only that connection closed.
    assert "failed for" not in log, [line for line in log.splitlines() if "failed for" in line][:5]
    assert b.alive()


# --- sans-IO: the decoder alone ---------------------------------------------------

def _broker_versions():
    import semel.broker.handlers  # noqa: F401  (registers the routes)
    from semel.broker.router import supported_versions
    return supported_versions()


@settings(max_examples=500, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**32 - 1), length_at=st.integers(0, 400),
       length=st.sampled_from([-2, -1, 0x7FFFFFFF, 0x7FFFFFF0, 0xFFFF]))
def test_any_frame_either_decodes_or_is_a_protocol_error(data, seed, length_at, length):
    """h11's invariant for our decoder: schema-drawn frames with a length-like int
    forced to an extreme anywhere (or otherwise mutated) decode, or raise
    ProtocolError / UnsupportedVersion — never another exception."""
    from semel.protocol.errors import ProtocolError
    from semel.protocol.messages import UnsupportedVersion, decode_request
    supported = _broker_versions()
    key, version = data.draw(st.sampled_from(advertised(supported)), label="api")
    rng = random.Random(seed)
    frame = bytearray(random_request(rng, key, version))
    if length_at + 8 <= len(frame):
        struct.pack_into(">i", frame, 4 + length_at, length)
    else:
        frame = bytearray(mutate(rng, bytes(frame)))
    try:
        decode_request(bytes(frame[4:]), supported)
    except (ProtocolError, UnsupportedVersion):
        pass
