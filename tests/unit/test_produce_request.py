"""The produce request decoder (semel.protocol.produce_request) against kafka-python's
generated one: the same fields for every version it serves, records as views of the
frame (writable when the frame is), and any damaged frame either decodes or is a
ProtocolError, never another exception."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.producer import ProduceRequest

import semel.broker.server  # noqa: F401  (registers the handlers: supported_versions)
from semel.broker.router import supported_versions
from semel.protocol.errors import ProtocolError
from semel.protocol.messages import decode_request
from semel.protocol.produce_request import FAST_VERSIONS, FIRST_FLEXIBLE, DecodeInThread

SUPPORTED = {**supported_versions(), 0: (FAST_VERSIONS[0], FAST_VERSIONS[-1])}
T = ProduceRequest.TopicProduceData
P = T.PartitionProduceData

names = st.text(st.characters(codec="utf-8"), max_size=12)
partitions = st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.none() | st.binary(max_size=300)), max_size=4)
requests = st.tuples(st.sampled_from(list(FAST_VERSIONS)), st.none() | names, st.integers(-1, 1),
                     st.integers(-2**31, 2**31 - 1), st.lists(st.tuples(names, partitions), max_size=4),
                     st.none() | names)


def _encode(version, txn_id, acks, timeout, topics, client_id) -> bytearray:
    req = ProduceRequest(version=version, transactional_id=txn_id, acks=acks, timeout_ms=timeout,
                         topic_data=[T(version=version, name=n, partition_data=[
                             P(version=version, index=i, records=r) for i, r in parts]) for n, parts in topics])
    req.with_header(correlation_id=7, client_id=client_id)
    return bytearray(req.encode(version=version, header=True))


def _fields(body):
    return (body.transactional_id, body.acks, body.timeout_ms,
            [(t.name, [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data])
             for t in body.topic_data])


@settings(max_examples=300, deadline=None)
@given(requests)
def test_same_fields_as_the_generic_decoder(spec):
    frame = _encode(*spec)
    req = decode_request(frame, SUPPORTED)
    generic = ProduceRequest.decode(bytes(frame), version=spec[0], header=True)
    assert (req.api_key, req.api_version, req.correlation_id) == (0, spec[0], 7)
    assert req.client_id == generic.header.client_id == spec[5]
    assert _fields(req.body) == _fields(generic)
    assert isinstance(req.body, ProduceRequest)
    # Built without the constructor (produce_request._filled): still the same message.
    assert req.body.version == spec[0] and req.body.tags is None
    assert req.body.encode(version=spec[0]) == generic.encode(version=spec[0])
    for topic in req.body.topic_data:
        for p in topic.partition_data:
            if p.records is not None:
                assert isinstance(p.records, memoryview) and not p.records.readonly


def test_records_are_views_of_the_frame_not_copies():
    frame = _encode(9, "tx", -1, 100, [("t", [(0, b"\x00" * 80)])], "c")
    records = decode_request(frame, SUPPORTED).body.topic_data[0].partition_data[0].records
    records[0] = 0xAB                       # storage patches offsets like this
    assert frame.find(b"\xab" + b"\x00" * 79) > 0
    readonly = decode_request(bytes(frame), SUPPORTED).body.topic_data[0].partition_data[0].records
    assert readonly.readonly                # bytes frames give views storage copies before patching


def test_tagged_fields_of_a_flexible_request_are_skipped():
    """A v9 frame with a tag after a partition, a topic and the body still decodes."""
    frame = _encode(FIRST_FLEXIBLE, None, 1, 5, [("t", [(3, b"abc")])], None)
    # The three trailing tag counts (0) sit at the end: partition, topic, body.
    assert frame[-3:] == b"\x00\x00\x00"
    tag = b"\x01" + b"\x05" + b"\x02" + b"hi"   # one tag: number 5, 2 bytes
    tagged = frame[:-3] + tag + tag + tag
    body = decode_request(tagged, SUPPORTED).body
    assert _fields(body) == (None, 1, 5, [("t", [(3, b"abc")])])


@settings(max_examples=300, deadline=None)
@given(requests, st.data())
def test_a_damaged_frame_decodes_or_is_a_protocol_error(spec, data):
    frame = _encode(*spec)
    cut = data.draw(st.integers(8, len(frame)))
    # From byte 8 on: another api key or version is a different (tested) refusal.
    flips = data.draw(st.lists(st.tuples(st.integers(8, len(frame) - 1), st.integers(0, 255)), max_size=3))
    damaged = bytearray(frame[:cut])
    for at, value in flips:
        if at < len(damaged):
            damaged[at] = value
    try:
        decode_request(damaged, SUPPORTED)
    except ProtocolError:
        pass


@pytest.mark.parametrize("version", [3, 9])
def test_null_topic_array_is_refused(version):
    frame = _encode(version, None, 1, 5, [], None)
    # The empty topic array is the last field: 0 (int32) or 1 (compact, then one tag count).
    frame = frame[:-4] + struct.pack(">i", -1) if version < FIRST_FLEXIBLE else frame[:-2] + b"\x00\x00"
    with pytest.raises(ProtocolError, match="null"):
        decode_request(frame, SUPPORTED)


# --- decoding a large frame on the event loop (connection.DECODE_ON_LOOP_PARTITIONS) ---------

def test_a_produce_naming_few_partitions_decodes_on_the_loop_as_it_would_anyway():
    frame = _encode(9, None, -1, 1000, [("a", [(0, b"r" * 300), (1, None)]), ("b", [(0, b"s")])], "c")
    on_loop = decode_request(frame, SUPPORTED, loop_partitions=3)
    assert _fields(on_loop.body) == _fields(decode_request(frame, SUPPORTED).body)


@pytest.mark.parametrize("version", [FAST_VERSIONS[0], FIRST_FLEXIBLE])
def test_a_produce_naming_more_partitions_is_left_to_a_thread(version):
    """Counted over all topics: two topics of two partitions exceed a budget of three."""
    frame = _encode(version, None, -1, 1000, [("a", [(0, b"r"), (1, b"r")]), ("b", [(0, b"s"), (1, b"s")])], "c")
    with pytest.raises(DecodeInThread):
        decode_request(frame, SUPPORTED, loop_partitions=3)
    assert len(decode_request(frame, SUPPORTED).body.topic_data) == 2


def test_other_apis_are_left_to_a_thread_whatever_their_size():
    metadata_v1 = bytearray(struct.pack(">hhih", 3, 1, 1, 1) + b"c" + struct.pack(">i", -1))  # all topics
    assert decode_request(metadata_v1, SUPPORTED).api_key == 3
    with pytest.raises(DecodeInThread):
        decode_request(metadata_v1, SUPPORTED, loop_partitions=1000)


def test_a_malformed_produce_is_still_a_protocol_error_on_the_loop():
    frame = _encode(9, None, -1, 1000, [("a", [(0, b"r" * 300)])], "c")
    with pytest.raises(ProtocolError):
        decode_request(frame[:-40], SUPPORTED, loop_partitions=64)
