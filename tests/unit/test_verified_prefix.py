"""verified_prefix (the check every Fetch runs over the batches it serves) unpacks only
the header fields it checks. It must decide exactly as a check written
with full BatchHeader objects does, on good data and on every kind of damage."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from semel.protocol.records import (
    HEADER_SIZE, LOG_OVERHEAD, MAGIC, build_batch, crc_ok, parse_header, verified_prefix,
)


def reference(data: bytes, from_offset: int, crc: bool = True) -> tuple[bytes, int | None]:
    """The rule spelled out with parsed headers: whole magic-2 batches, CRC-correct
    (unless crc is False: a follower's fetch), offsets increasing, the first one
    holding or following from_offset."""
    pos, end, expected = 0, len(data), from_offset
    while end - pos >= HEADER_SIZE:
        hdr = parse_header(data, pos)
        ok = (hdr.magic == MAGIC and hdr.batch_length >= HEADER_SIZE - LOG_OVERHEAD
              and pos + hdr.size <= end and hdr.last_offset_delta >= 0
              and hdr.last_offset >= expected and (pos == 0 or hdr.base_offset >= expected)
              and (not crc or crc_ok(data, pos, hdr.size)))
        if not ok:
            return bytes(data[:pos]), expected
        expected = hdr.last_offset + 1
        pos += hdr.size
    if pos < end:
        return bytes(data[:pos]), expected
    return data, None


def log_bytes(counts: list[int], start: int) -> bytes:
    out, offset = bytearray(), start
    for n in counts:
        out += build_batch([(None, b"v" * 20)] * n, base_offset=offset, timestamp_ms=1)
        offset += n
    return bytes(out)


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(1, 5), min_size=1, max_size=6), start=st.integers(0, 1000),
       skip=st.integers(0, 3), damage=st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.integers(1, 255))),
       cut=st.integers(0, 80), crc=st.booleans())
def test_same_verdict_as_full_header_check(counts, start, skip, damage, cut, crc):
    data = bytearray(log_bytes(counts, start))
    if damage is not None:              # one byte changed anywhere: header field, CRC or record
        at, flip = damage
        data[at % len(data)] ^= flip
    data = bytes(data[:len(data) - cut]) if cut else bytes(data)   # a torn tail
    from_offset = start + skip
    assert verified_prefix(data, from_offset, crc) == reference(data, from_offset, crc)


def test_good_batches_come_back_as_they_are():
    data = log_bytes([3, 1, 4], 10)
    assert verified_prefix(data, 10) == (data, None)
    assert verified_prefix(data, 12) == (data, None)     # the first batch holds 12


def test_corrupt_record_byte_stops_before_its_batch():
    data = bytearray(log_bytes([2, 2, 2], 0))
    second = parse_header(data, 0).size
    data[second + HEADER_SIZE + 3] ^= 0x40              # inside the second batch's records
    good, bad_at = verified_prefix(bytes(data), 0)
    assert good == bytes(data[:second]) and bad_at == 2
    # Without the CRC (a follower's fetch: the follower checks it) the batch goes out.
    assert verified_prefix(bytes(data), 0, crc=False) == (bytes(data), None)


def test_a_negative_offset_delta_under_a_correct_crc_is_damage():
    """lastOffsetDelta lies under the CRC: only a batch written wrong from the start
    (its CRC computed over the bad field) carries a negative one."""
    import struct

    import crc32c
    data = bytearray(log_bytes([2, 2], 10))
    struct.pack_into(">i", data, 23, -1)    # last offset 9: still past from_offset 0
    size = parse_header(data, 0).size
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:size])))
    assert verified_prefix(bytes(data), 0) == reference(bytes(data), 0) == (b"", 0)
