"""The Fetch response framed around stored record bytes (semel.protocol.fetch_response)
is byte for byte what the generic codec (kafka-python's, generated from Kafka's
message specs) encodes, for every version the broker serves and any content."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from semel.protocol.fetch_response import INLINE_RECORDS_BYTES, MAX_VERSION, MIN_VERSION, encode_fetch
from semel.protocol.messages import encode_response, encode_response_parts, response_class

FETCH = response_class(1)
T = FETCH.FetchableTopicResponse
P = T.PartitionData

i32 = st.integers(-2**31, 2**31 - 1)
i64 = st.integers(-2**63, 2**63 - 1)
records = st.one_of(
    st.none(), st.binary(max_size=300),
    st.integers(INLINE_RECORDS_BYTES - 2, INLINE_RECORDS_BYTES + 40_000).map(lambda n: bytes(range(256)) * (n // 256)),
)
aborted = st.one_of(st.none(), st.lists(st.tuples(i64, i64), max_size=4))


@st.composite
def partition(draw):
    recs = draw(records)
    if recs is not None and draw(st.booleans()):
        recs = memoryview(b"\x00" * 7 + recs + b"\x00" * 5)[7:7 + len(recs)]   # a view, as storage gives
    ab = draw(aborted)
    return P(partition_index=draw(i32), error_code=draw(st.integers(-1, 120)), high_watermark=draw(i64),
             last_stable_offset=draw(i64), log_start_offset=draw(i64),
             aborted_transactions=None if ab is None else [P.AbortedTransaction(producer_id=a, first_offset=b)
                                                           for a, b in ab],
             preferred_read_replica=draw(i32), records=recs)


bodies = st.builds(
    lambda topics, throttle, err, session: dict(responses=topics, throttle_time_ms=throttle, error_code=err,
                                                session_id=session),
    st.lists(st.builds(lambda name, parts: T(topic=name, partitions=parts),
                       st.text(min_size=1, max_size=30), st.lists(partition(), max_size=4)), max_size=4),
    i32, st.integers(-1, 120), i32)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(MIN_VERSION, MAX_VERSION), fields=bodies, correlation_id=i32)
def test_same_bytes_as_the_generic_codec(version, fields, correlation_id):
    body = FETCH(version=version, **fields)
    pieces = encode_fetch(version, correlation_id, body)
    assert pieces is not None
    assert b"".join(pieces) == encode_response(1, version, correlation_id, body)
    # Large records travel as the very object storage produced: not copied.
    big = [p.records for t in fields["responses"] for p in t.partitions
           if p.records is not None and len(p.records) >= INLINE_RECORDS_BYTES]
    assert [id(x) for x in pieces if any(x is b for b in big)] == [id(b) for b in big]


def test_a_tagged_field_or_another_version_goes_to_the_generic_codec():
    leader = P.LeaderIdAndEpoch(leader_id=2, leader_epoch=7)
    part = P(partition_index=0, error_code=6, high_watermark=-1, last_stable_offset=-1, log_start_offset=-1,
             aborted_transactions=None, records=b"", current_leader=leader)
    body = FETCH(version=12, throttle_time_ms=0, error_code=0, session_id=0,
                 responses=[T(topic="t", partitions=[part])])
    assert encode_fetch(12, 5, body) is None
    assert encode_response_parts(1, 12, 5, body) == [encode_response(1, 12, 5, body)]
    old = FETCH(version=3, throttle_time_ms=0, responses=[])
    assert encode_fetch(3, 5, old) is None
    assert b"".join(encode_response_parts(1, 3, 5, old)) == encode_response(1, 3, 5, old)
