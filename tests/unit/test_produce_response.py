"""The produce response encoder (semel.protocol.produce_response) against kafka-python's
generic codec: byte for byte the same frame for every version the broker serves,
whether the entries are the handler's plain objects or kafka-python's own (the ACL
gate adds those for denied topics)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from semel.protocol.messages import encode_response, encode_response_parts, response_class
from semel.protocol.produce_response import (
    MAX_VERSION, MIN_VERSION, ProduceAnswer, ProducePartitionAnswer, ProduceTopicAnswer, RecordError,
    encode_produce,
)

CLS = response_class(0)
T = CLS.TopicProduceResponse
P = T.PartitionProduceResponse

i64 = st.integers(-2**63, 2**63 - 1)
partitions = st.lists(st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(-1, 120), i64, i64, i64,
                                st.none() | st.text(max_size=20)), max_size=5)
topics = st.lists(st.tuples(st.text(max_size=15), partitions), max_size=4)


def generic(version, spec, throttle):
    return CLS(version=version, throttle_time_ms=throttle, responses=[
        T(name=n, partition_responses=[
            P(index=i, error_code=e, base_offset=b, log_append_time_ms=a, log_start_offset=s, record_errors=[],
              error_message=m) for i, e, b, a, s, m in parts]) for n, parts in spec])


def plain(version, spec, throttle):
    return ProduceAnswer(version, [
        ProduceTopicAnswer(n, [ProducePartitionAnswer(i, e, b, s, m, log_append_time_ms=a)
                               for i, e, b, a, s, m in parts]) for n, parts in spec], throttle)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(MIN_VERSION, MAX_VERSION), spec=topics, throttle=st.integers(0, 2**31 - 1),
       corr=st.integers(-2**31, 2**31 - 1))
def test_same_bytes_as_the_generic_codec(version, spec, throttle, corr):
    expected = encode_response(0, version, corr, generic(version, spec, throttle))
    assert encode_produce(version, corr, plain(version, spec, throttle)) == expected
    assert encode_produce(version, corr, generic(version, spec, throttle)) == expected
    assert b"".join(encode_response_parts(0, version, corr, plain(version, spec, throttle))) == expected


def test_entries_of_both_kinds_in_one_response():
    """The ACL gate appends kafka-python entries for denied topics to the handler's answer."""
    spec = [("ok", [(0, 0, 41, -1, 0, None)]), ("denied", [(0, 29, -1, -1, -1, None)])]
    mixed = plain(9, spec[:1], 0)
    mixed.responses = list(mixed.responses) + generic(9, spec[1:], 0).responses
    assert encode_produce(9, 5, mixed) == encode_response(0, 9, 5, generic(9, spec, 0))


@settings(max_examples=200, deadline=None)
@given(version=st.integers(MIN_VERSION, MAX_VERSION),
       errors=st.lists(st.tuples(st.integers(0, 2**31 - 1), st.none() | st.text(max_size=30)), min_size=1,
                       max_size=4),
       message=st.none() | st.text(max_size=40))
def test_record_errors_same_bytes_as_the_generic_codec(version, errors, message):
    """KIP-467 per-record errors (v8+; older versions have no field for them)."""
    spec = [("t", [(0, 87, -1, -1, -1, message)])]
    body = generic(version, spec, 0)
    body.responses[0].partition_responses[0].record_errors = [
        P.BatchIndexAndErrorMessage(batch_index=i, batch_index_error_message=m) for i, m in errors]
    ours = plain(version, spec, 0)
    ours.responses[0].partition_responses[0].record_errors = [RecordError(i, m) for i, m in errors]
    expected = encode_response(0, version, 1, body)
    assert encode_produce(version, 1, ours) == expected
    assert encode_produce(version, 1, body) == expected


def test_other_versions_go_to_the_generic_codec():
    assert encode_produce(MAX_VERSION + 1, 1, plain(9, [], 0)) is None
