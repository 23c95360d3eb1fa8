"""Key-compacted topics (cleanup.policy=compact): what they accept, and the cleaner.

Kafka refuses a record without a key on a compacted topic (there is nothing to
compact it by); the check reads every record's key, so compressed batches are
decompressed, bounded (semel.protocol.codecs: a batch that would expand past the
limit is refused before the memory is taken).

The cleaner keeps, below the cleanable end (the active segment's base or the LSO,
whichever is lower: records of open transactions are never touched), only the
newest record of each key among committed data. What it keeps and why:
- every batch keeps its base offset and last offset delta, so offsets stay
  continuous for recovery and readers (a batch left without records stays as an
  empty batch, as Kafka does; it also keeps the producer's sequence for dedup);
- records of aborted transactions go; transaction markers all stay, so a
  read_committed reader's view never changes (Kafka removes markers later, once
  no record of their transaction is left: not done here);
- a tombstone (null value) that is its key's newest record stays until its
  batch's newest timestamp is older than delete.retention.ms, so a consumer that
  reads the topic from the start within that time learns the key was deleted;
  then it goes too (timestamps decide, as retention.ms does; Kafka's KIP-534
  keeps a per-batch delete horizon instead);
- a rewritten batch is stored uncompressed.
"""
from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import crc32c
from semel.protocol.codecs import DecodeError, uncompressed_batch
from semel.protocol.errors import KafkaError
from semel.protocol.records import (ATTR_COMPRESSION_MASK, CONTROL_ABORT, HEADER_SIZE, BatchHeader,
                                    Buffer, Record, write_bytes, control_type, iter_batches, iter_records,
                                    write_varint)

if TYPE_CHECKING:
    from .log import PartitionLog

# One segment's bytes by its base offset.
_Segments = list[tuple[int, bytes]]

# Most bytes one batch's records may expand to where the broker decompresses them
# (the broker's --max-decompressed-batch-bytes; the cleaner uses this default).
MAX_DECOMPRESSED_BATCH_BYTES = 32 * 1024 * 1024

_COUNT = struct.Struct(">i")


def is_compacted(cleanup_policy: str) -> bool:
    return "compact" in cleanup_policy.split(",")


def check_keys(data: Buffer, batches: list[tuple[int, BatchHeader]],
               limit: int = MAX_DECOMPRESSED_BATCH_BYTES) -> tuple[KafkaError, list[int]]:
    """(error, indexes of the records without a key): INVALID_RECORD if any data record
    has no key, its index counted over the data records of all `batches` in order (what
    a Produce answer reports per record, KIP-467); CORRUPT_MESSAGE if a batch cannot be
    decoded, MESSAGE_TOO_LARGE if its records expand past `limit`,
    UNSUPPORTED_COMPRESSION_TYPE for a codec this install cannot read; control batches
    (written by the coordinator) are not checked."""
    keyless: list[int] = []
    index = 0
    for pos, hdr in batches:
        if hdr.is_control:
            continue
        try:
            for rec in _records(data, pos, hdr, limit):
                if rec.key is None:
                    keyless.append(index)
                index += 1
        except DecodeError as exc:
            return exc.error, []
        except ValueError:
            return KafkaError.CORRUPT_MESSAGE, []
    return (KafkaError.INVALID_RECORD if keyless else KafkaError.NONE), keyless


@dataclass
class CleanResult:
    segments_rewritten: int = 0
    records_removed: int = 0
    # When the oldest tombstone left behind may go (epoch ms), None if none waits:
    # a pass is due then even if nothing new was written.
    next_tombstone_expiry_ms: int | None = None


@dataclass(frozen=True)
class _Tombstones:
    """Which kept tombstones may go: those whose batch's newest timestamp is below
    `horizon_ms` (now - delete.retention.ms); None keeps them all."""
    horizon_ms: int | None
    retention_ms: int

    def expired(self, hdr: BatchHeader) -> bool:
        return self.horizon_ms is not None and hdr.max_timestamp < self.horizon_ms

    def expiry(self, hdr: BatchHeader) -> int:
        return hdr.max_timestamp + self.retention_ms


def clean(plog: PartitionLog, now_ms: int | None = None, delete_retention_ms: int = 86_400_000) -> CleanResult:
    """One cleaning pass over `plog` (a PartitionLog of a compacted topic). With
    `now_ms`, tombstones older than `delete_retention_ms` are removed as well."""
    end = plog.rewrites.cleanable_end()
    segments = plog.rewrites.closed_segments_below(end)
    if not segments:
        return CleanResult()
    batches = [(base, data) for base, data in ((b, plog.rewrites.segment_bytes(b)) for b in segments)]
    aborted = _aborted_batches(plog, batches)
    latest = _latest_offsets(batches, aborted)
    tombs = _Tombstones(None if now_ms is None else now_ms - delete_retention_ms, delete_retention_ms)
    result = CleanResult()
    for base, data in batches:
        new, removed = _rewrite(data, latest, aborted, tombs, result)
        if removed:
            plog.rewrites.replace_segment(base, new)
            result.segments_rewritten += 1
            result.records_removed += removed
    return result


def _aborted_batches(plog: PartitionLog, batches: _Segments) -> set[int]:
    """Base offsets of transactional data batches whose transaction aborted. The
    marker may lie after the cleaned segments, so the rest of the log's headers are
    walked too (transactions open at the LSO are above the cleanable end)."""
    open_txn: dict[int, list[int]] = {}
    aborted: set[int] = set()

    def walk(data: bytes) -> None:
        for pos, hdr in iter_batches(data):
            if not hdr.is_transactional:
                continue
            if hdr.is_control:
                bases = open_txn.pop(hdr.producer_id, [])
                if control_type(data, pos) == CONTROL_ABORT:
                    aborted.update(bases)
            else:
                open_txn.setdefault(hdr.producer_id, []).append(hdr.base_offset)

    for _, data in batches:
        walk(data)
    if open_txn:
        walk(plog.rewrites.bytes_after(batches[-1][0]))
    return aborted


def _records(data: Buffer, pos: int, hdr: BatchHeader,
             limit: int = MAX_DECOMPRESSED_BATCH_BYTES) -> Iterator[Record]:
    return iter_records(uncompressed_batch(memoryview(data)[pos:pos + hdr.size], limit))


def _readable(data: bytes, pos: int, hdr: BatchHeader) -> list[Record] | None:
    """The batch's records, or None where they cannot be had (a batch stored before the
    topic became compacted may be too large or in a codec this install lacks): the
    cleaner then leaves that batch as it is."""
    try:
        return list(_records(data, pos, hdr))
    except (DecodeError, ValueError):
        return None


def _latest_offsets(batches: _Segments, aborted: set[int]) -> dict[bytes, int]:
    latest: dict[bytes, int] = {}
    for _, data in batches:
        for pos, hdr in iter_batches(data):
            if hdr.is_control or hdr.base_offset in aborted:
                continue
            for rec in _readable(data, pos, hdr) or ():
                if rec.key is not None:
                    latest[bytes(rec.key)] = rec.offset
    return latest


def _keeps(rec: Record, hdr: BatchHeader, latest: dict[bytes, int], tombs: _Tombstones) -> bool:
    if rec.key is None:
        return True
    if latest.get(bytes(rec.key)) != rec.offset:
        return False                      # superseded by a newer record of its key
    return rec.value is not None or not tombs.expired(hdr)   # tombstones go once expired


def _rewrite(data: bytes, latest: dict[bytes, int], aborted: set[int], tombs: _Tombstones,
             result: CleanResult) -> tuple[bytes, int]:
    """(segment bytes with superseded, aborted and expired-tombstone records removed,
    how many removed); notes in `result` when the next kept tombstone expires."""
    out = bytearray()
    removed = 0
    for pos, hdr in iter_batches(data):
        raw = memoryview(data)[pos:pos + hdr.size]
        if hdr.is_control:
            out += raw
            continue
        records = _readable(data, pos, hdr)
        if records is None:
            out += raw
            continue
        keep = [] if hdr.base_offset in aborted else [r for r in records if _keeps(r, hdr, latest, tombs)]
        if any(r.value is None and r.key is not None for r in keep):
            due = tombs.expiry(hdr)
            if result.next_tombstone_expiry_ms is None or due < result.next_tombstone_expiry_ms:
                result.next_tombstone_expiry_ms = due
        if len(keep) == len(records):
            out += raw
            continue
        removed += len(records) - len(keep)
        out += _rebuild(raw, hdr, keep)
    return bytes(out), removed


def _rebuild(raw: memoryview, hdr: BatchHeader, keep: Sequence[Record]) -> bytes:
    """The batch with only `keep`, uncompressed, same offsets/producer fields, new CRC."""
    body = bytearray()
    for rec in keep:
        r = bytearray(b"\x00")
        write_varint(r, rec.timestamp - hdr.base_timestamp)
        write_varint(r, rec.offset - hdr.base_offset)
        write_bytes(r, None if rec.key is None else bytes(rec.key))
        write_bytes(r, None if rec.value is None else bytes(rec.value))
        write_varint(r, len(rec.headers))
        for hk, hv in rec.headers:
            write_bytes(r, hk.encode() if isinstance(hk, str) else hk)
            write_bytes(r, hv)
        write_varint(body, len(r))
        body += r
    head = bytearray(raw[:HEADER_SIZE])
    struct.pack_into(">i", head, 8, HEADER_SIZE - 12 + len(body))       # batch length
    attrs = struct.unpack_from(">h", head, 21)[0] & ~ATTR_COMPRESSION_MASK
    struct.pack_into(">h", head, 21, attrs)
    _COUNT.pack_into(head, 57, len(keep))
    buf = head + body
    struct.pack_into(">I", buf, 17, crc32c.crc32c(memoryview(buf)[21:]))
    return bytes(buf)
