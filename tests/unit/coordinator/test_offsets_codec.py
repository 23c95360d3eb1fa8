"""Record format of __consumer_offsets: round trips and refusal of what we cannot read."""
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from semel.coordinator.offsets import (
    CommittedOffset, GroupKey, GroupOffsets, GroupRecord, MemberRecord, OffsetKey, OffsetsLogError,
    decode_group_value, decode_key, decode_offset_value, group_key, group_value, offset_key,
    offset_value,
)

names = st.text(min_size=0, max_size=40)


@given(names, names, st.integers(0, 2**31 - 1))
def test_offset_key_round_trip(group, topic, partition):
    assert decode_key(offset_key(group, topic, partition)) == OffsetKey(group, topic, partition)


@given(names)
def test_group_key_round_trip(group):
    assert decode_key(group_key(group)) == GroupKey(group)


@given(st.integers(-1, 2**63 - 1), st.integers(-1, 2**31 - 1), st.none() | names,
       st.integers(0, 2**62))
def test_offset_value_round_trip(offset, epoch, metadata, ts):
    value = CommittedOffset(offset, epoch, metadata, ts)
    assert decode_offset_value(offset_value(value), 77) == value._replace(log_offset=77)


def test_group_value_round_trip():
    rec = GroupRecord("consumer", 7, "range", "m-1", 123456, [
        MemberRecord("m-1", None, "client-a", "/127.0.0.1", 30000, 10000, b"sub-a", b"asg-a"),
        MemberRecord("m-2", "inst-2", "client-b", "/10.0.0.2", 30000, 45000, b"", b"asg-b"),
    ])
    assert decode_group_value(group_value(rec)) == rec
    empty = GroupRecord(None, 3, None, None, 1)
    assert decode_group_value(group_value(empty)) == empty


def test_unknown_key_type_is_refused():
    with pytest.raises(OffsetsLogError, match="unknown key type"):
        decode_key(struct.pack(">h", 9) + b"rest")
    with pytest.raises(OffsetsLogError):
        decode_key(None)


def test_unknown_value_version_is_refused():
    raw = bytearray(offset_value(CommittedOffset(5)))
    raw[0:2] = struct.pack(">h", 3)
    with pytest.raises(OffsetsLogError, match="unknown value version"):
        decode_offset_value(bytes(raw), 0)


@pytest.mark.parametrize("cut", [1, 3, 10, 20])
def test_truncated_values_are_refused_not_misread(cut):
    raw = offset_value(CommittedOffset(5, 1, "meta", 9))
    with pytest.raises(OffsetsLogError):
        decode_offset_value(raw[:-cut], 0)
    graw = group_value(GroupRecord("consumer", 1, "range", "m", 1, [
        MemberRecord("m", None, "c", "h", 1, 1, b"x", b"y")]))
    with pytest.raises(OffsetsLogError):
        decode_group_value(graw[:-cut])


def test_later_log_position_wins_regardless_of_apply_order():
    offs = GroupOffsets()
    offs.put(("t", 0), CommittedOffset(10, log_offset=5))
    offs.put(("t", 0), CommittedOffset(3, log_offset=2))      # older write arriving late
    assert offs.committed[("t", 0)].offset == 10
    offs.remove(("t", 0), 4)                                   # tombstone older than the value
    assert ("t", 0) in offs.committed
    offs.remove(("t", 0), 6)
    assert offs.is_empty()


def test_pending_offsets_complete_by_marker():
    offs = GroupOffsets()
    offs.put(("t", 0), CommittedOffset(1, log_offset=1))
    offs.add_pending(42, ("t", 0), CommittedOffset(9, log_offset=3))
    offs.add_pending(43, ("t", 1), CommittedOffset(8, log_offset=4))
    assert offs.has_pending(("t", 0)) and offs.committed[("t", 0)].offset == 1
    offs.complete(42, commit=True)
    assert offs.committed[("t", 0)].offset == 9 and not offs.has_pending(("t", 0))
    offs.complete(43, commit=False)
    assert ("t", 1) not in offs.committed and not offs.pending


def test_expiry_rules():
    offs = GroupOffsets()
    offs.put(("t", 0), CommittedOffset(1, commit_ts=1000, log_offset=1))
    offs.put(("t", 1), CommittedOffset(1, commit_ts=5000, log_offset=2))
    # manual-assignment group: each offset ages from its commit
    assert offs.expired(now_ms=7000, retention_ms=5000, since_ms=None) == [("t", 0)]
    # consumer group: everything ages from the moment the group became empty
    assert offs.expired(now_ms=7000, retention_ms=5000, since_ms=3000) == []
    assert sorted(offs.expired(now_ms=8000, retention_ms=5000, since_ms=3000)) == [("t", 0), ("t", 1)]
    assert offs.expired(now_ms=10**12, retention_ms=-1, since_ms=None) == []
