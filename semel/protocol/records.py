"""RecordBatch v2 (magic 2): header view, validation, building.

Layout of the 61-byte header (offsets in bytes):
  0 baseOffset i64 | 8 batchLength i32 | 12 partitionLeaderEpoch i32 | 16 magic i8
  17 crc u32 (CRC-32C of bytes 21..end) | 21 attributes i16 | 23 lastOffsetDelta i32
  27 baseTimestamp i64 | 35 maxTimestamp i64 | 43 producerId i64 | 51 producerEpoch i16
  53 baseSequence i32 | 57 recordCount i32
Because the CRC starts at byte 21, the broker may rewrite baseOffset and
partitionLeaderEpoch without recomputing it.
"""
from __future__ import annotations

import mmap
import struct
import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import crc32c

from .errors import KafkaError

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: batchLength counts bytes after these
MAGIC = 2

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_LOG_APPEND = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1

# What record-batch bytes arrive as: a file's read or map, a request frame or a view of either.
Buffer = bytes | bytearray | memoryview | mmap.mmap
# A record header as build_batch takes it (a str key is UTF-8 encoded).
Header = tuple[str | bytes, bytes | None]

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET = struct.Struct(">q")
_LENGTH_AT_8 = struct.Struct(">i")
_EPOCH_AT_12 = struct.Struct(">i")
# verified_prefix reads only the header's first 27 bytes: baseOffset .. lastOffsetDelta.
_VERIFY_PREFIX = struct.Struct(">qiibIhi")
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD


@dataclass(slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


def parse_header(buf: Buffer, pos: int = 0) -> BatchHeader:
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


def batch_size_at(buf: Buffer, pos: int) -> int:
    """Total bytes of the batch starting at pos (needs 12 bytes)."""
    length: int = _LENGTH_AT_8.unpack_from(buf, pos + 8)[0]
    return LOG_OVERHEAD + length


def crc_ok(buf: Buffer, pos: int, size: int) -> bool:
    stored: int = struct.unpack_from(">I", buf, pos + 17)[0]
    return bool(crc32c.crc32c(memoryview(buf)[pos + 21:pos + size]) == stored)


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    _OFFSET.pack_into(buf, pos, base_offset)


def set_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """partitionLeaderEpoch of the batch at pos (outside the CRC, like baseOffset)."""
    _EPOCH_AT_12.pack_into(buf, pos + 12, epoch)


def split_batches(data: bytes | bytearray | memoryview) -> tuple[list[tuple[int, BatchHeader]], KafkaError]:
    """Split a produce payload into batches and validate each.

    Returns ([(position, header)], error). The error is NONE only when every byte
    belongs to a well-formed magic-2 batch with a correct CRC; nothing is
    appended otherwise (a produce request is all-or-nothing per partition).
    """
    out: list[tuple[int, BatchHeader]] = []
    pos, end = 0, len(data)
    if end == 0:
        return out, KafkaError.CORRUPT_MESSAGE
    while pos < end:
        if end - pos < HEADER_SIZE:
            return out, KafkaError.CORRUPT_MESSAGE
        hdr = parse_header(data, pos)
        if hdr.magic != MAGIC:
            return out, KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT
        size = hdr.size
        if hdr.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + size > end:
            return out, KafkaError.CORRUPT_MESSAGE
        if hdr.last_offset_delta < 0 or hdr.record_count < 0:
            return out, KafkaError.CORRUPT_MESSAGE
        if not crc_ok(data, pos, size):
            return out, KafkaError.CORRUPT_MESSAGE
        if hdr.compression > 4:
            return out, KafkaError.UNSUPPORTED_COMPRESSION_TYPE
        out.append((pos, hdr))
        pos += size
    return out, KafkaError.NONE


# --- varints (zig-zag), as used inside records ---------------------------------

def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def write_varint(out: bytearray, n: int) -> None:
    v = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def read_varint(buf: Buffer, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (result >> 1) ^ -(result & 1), pos


@dataclass(slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def write_bytes(out: bytearray, b: bytes | None) -> None:
    if b is None:
        write_varint(out, -1)
    else:
        write_varint(out, len(b))
        out += b


def _read_bytes(buf: Buffer, pos: int) -> tuple[bytes | None, int]:
    n, pos = read_varint(buf, pos)
    if n < 0:
        return None, pos
    if pos + n > len(buf):
        raise ValueError("truncated record field")
    return bytes(buf[pos:pos + n]), pos + n


def build_batch(
    records: Sequence[tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, Sequence[Header]]],
    *,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """An uncompressed batch. Used for internal logs, control markers and tests;
    applications' batches come from their clients and are stored as sent."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    body = bytearray()
    for i, rec in enumerate(records):
        key, value = rec[0], rec[1]
        headers = rec[2] if len(rec) > 2 else []
        r = bytearray()
        r.append(0)  # record attributes
        write_varint(r, 0)  # timestamp delta
        write_varint(r, i)  # offset delta
        write_bytes(r, key)
        write_bytes(r, value)
        write_varint(r, len(headers))
        for hk, hv in headers:
            write_bytes(r, hk.encode() if isinstance(hk, str) else hk)
            write_bytes(r, hv)
        write_varint(body, len(r))
        body += r
    return seal_batch(body, len(records), base_offset=base_offset, timestamp_ms=ts, producer_id=producer_id,
                      producer_epoch=producer_epoch, base_sequence=base_sequence, transactional=transactional,
                      control=control)


def seal_batch(body: bytes | bytearray, count: int, *, timestamp_ms: int, base_offset: int = 0,
               producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1, base_sequence: int = NO_SEQUENCE,
               transactional: bool = False, control: bool = False, compression: int = 0) -> bytes:
    """The batch of `count` encoded records `body` (one timestamp for all): header and CRC.
    compression: the codec `body` is already compressed with (attribute bits 0-2)."""
    attrs = (ATTR_TRANSACTIONAL if transactional else 0) | (ATTR_CONTROL if control else 0) | \
        (compression & ATTR_COMPRESSION_MASK)
    ts = timestamp_ms
    head = bytearray(_HEADER.pack(base_offset, HEADER_SIZE - LOG_OVERHEAD + len(body), -1, MAGIC, 0,
                                  attrs, max(count - 1, 0), ts, ts, producer_id, producer_epoch,
                                  base_sequence, count))
    buf = head + body
    struct.pack_into(">I", buf, 17, crc32c.crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def build_control_batch(kind: int, *, producer_id: int, producer_epoch: int,
                        coordinator_epoch: int = 0, timestamp_ms: int | None = None) -> bytes:
    """A commit (kind=1) or abort (kind=0) marker for one producer."""
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, coordinator_epoch)
    return build_batch([(key, value)], producer_id=producer_id, producer_epoch=producer_epoch,
                       transactional=True, control=True, timestamp_ms=timestamp_ms)


def control_type(batch: bytes | memoryview, pos: int = 0) -> int:
    """CONTROL_COMMIT or CONTROL_ABORT of a control batch."""
    recs = list(iter_records(batch, pos))
    if not recs or recs[0].key is None or len(recs[0].key) < 4:
        raise ValueError("control batch without a control record")
    kind: int = struct.unpack(">hh", recs[0].key[:4])[1]
    return kind


def iter_records(buf: Buffer, pos: int = 0) -> Iterator[Record]:
    """Records of one uncompressed batch at buf[pos:]."""
    hdr = parse_header(buf, pos)
    if hdr.compression:
        raise ValueError("compressed batch: decode with a client library")
    p = pos + HEADER_SIZE
    end = pos + hdr.size
    for _ in range(hdr.record_count):
        length, p = read_varint(buf, p)
        rec_end = p + length
        # A record is never empty; a negative or zero length would move `p` back and,
        # with a record_count of 2^31, hold the event loop for hours.
        if length <= 0 or rec_end > end:
            raise ValueError("record length outside its batch")
        p += 1  # attributes
        ts_delta, p = read_varint(buf, p)
        off_delta, p = read_varint(buf, p)
        key, p = _read_bytes(buf, p)
        value, p = _read_bytes(buf, p)
        nh, p = read_varint(buf, p)
        headers = []
        for _ in range(nh):
            hk, p = _read_bytes(buf, p)
            hv, p = _read_bytes(buf, p)
            headers.append(((hk or b"").decode("utf-8", "replace"), hv))
        yield Record(hdr.base_offset + off_delta, hdr.base_timestamp + ts_delta, key, value, headers)
        p = rec_end


def verified_prefix(data: bytes | memoryview, from_offset: int, crc: bool = True
                    ) -> tuple[bytes | memoryview, int | None]:
    """The whole, well-formed, CRC-correct batches at the start of `data` (offsets
    increasing, the first holding or following `from_offset`), and the offset where
    a damaged batch begins (None when every byte is good). crc=False checks the
    structure and offsets only (for a reader that checks every CRC itself).

    For bytes read back from disk: storage trusts what recovery checked at start,
    so damage that came later (or lies below a clean checkpoint) is caught here,
    before anyone takes a wrong offset or a corrupt record for data. CRC-32C runs
    at many GB/s; the cost is the Python work per batch, which every Fetch pays for
    every batch it serves (100 B records come in batches of a few KiB): so only the
    fields checked are unpacked, no BatchHeader is built."""
    pos, end, expected = 0, len(data), from_offset
    view = memoryview(data)
    prefix, checksum = _VERIFY_PREFIX.unpack_from, crc32c.crc32c
    while end - pos >= HEADER_SIZE:
        base, length, _, magic, stored, _, delta = prefix(view, pos)
        size = LOG_OVERHEAD + length
        last = base + delta
        if (magic != MAGIC or length < _MIN_BATCH_LENGTH or pos + size > end or last < base
                or last < expected or (pos and base < expected)
                or (crc and checksum(view[pos + 21:pos + size]) != stored)):
            return bytes(view[:pos]), expected
        expected = last + 1
        pos += size
    if pos < end:   # bytes that are not a whole batch (reads return whole batches): damage
        return bytes(view[:pos]), expected
    return data, None


def iter_batches(buf: Buffer, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of each complete batch in buf[pos:end]."""
    end = len(buf) if end is None else end
    while end - pos >= HEADER_SIZE:
        hdr = parse_header(buf, pos)
        if pos + hdr.size > end:
            return
        yield pos, hdr
        pos += hdr.size
