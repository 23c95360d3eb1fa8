"""Read side for the Spark source: metadata, offsets, committed group offsets and
exact offset-range reads, over the standard Kafka protocol only (any
Kafka-compatible broker or cluster).

Why not a confluent-kafka consumer in the executors: a Spark partition is an
exact offset range [start, end), and a read_committed consumer never tells its
application about the offsets it skips (aborted records, transaction markers),
so it cannot know that a range whose tail is skipped is finished. Reading the
raw batches ourselves gives exact boundaries, and the Cython record decoder of
aiokafka keeps it fast; rows leave as Arrow columns.

Requests go through the cluster router (semel.client.cluster.ClusterRouter).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from aiokafka.errors import CorruptRecordException, UnsupportedCodecError
from aiokafka.record.default_records import DefaultRecordBatch

from ..backoff import Backoff
from ..protocol.errors import KafkaError
from ..protocol.records import ATTR_CONTROL, ATTR_TRANSACTIONAL, CONTROL_ABORT, crc_ok, iter_batches
from .cluster import EARLIEST, LATEST, TP, ClusterRouter, ReaderError

EMPTY_RETRY_S = 0.05   # between fetches that came back empty below the high watermark

# --- exact range reads ----------------------------------------------------------

@dataclass
class Rows:
    """Decoded records of one fetch, column by column (the caller makes Arrow of them)."""
    keys: list
    values: list
    offsets: list
    timestamps: list
    timestamp_types: list
    headers: list | None

    def __len__(self) -> int:
        return len(self.offsets)


class DataLoss(ReaderError):
    """The range starts below the partition's log start (records were deleted)."""

    def __init__(self, tp: TP, offset: int, log_start: int):
        super().__init__(f"{tp[0]}-{tp[1]}: offsets {offset}..{log_start - 1} are gone "
                         f"(log start is {log_start}); set failOnDataLoss=false to skip them",
                         KafkaError.OFFSET_OUT_OF_RANGE)
        self.log_start = log_start


def read_range(cluster: ClusterRouter, tp: TP, start: int, end: int, *, read_committed: bool,
               include_headers: bool, max_bytes: int = 4 << 20,
               fail_on_data_loss: bool = True) -> Iterator[Rows]:
    """The records of [start, end) in offset order, one Rows per fetch.

    Under read_committed `end` must be at or below the LSO (the driver plans it
    so): every transaction in the range is decided, so aborted records and
    control records are dropped by the rule Kafka's consumers use, and reading
    the same range again yields the same rows."""
    pos = start
    empty: Backoff | None = None   # while answers come back empty: their deadline
    while pos < end:
        p = cluster.fetch(tp, pos, read_committed, max_bytes)
        if p.error_code == KafkaError.OFFSET_OUT_OF_RANGE:
            log_start = cluster.list_offsets([tp], EARLIEST, False)[tp]
            if pos < log_start:
                if fail_on_data_loss:
                    raise DataLoss(tp, pos, log_start)
                pos = log_start
                continue
            raise ReaderError(f"{tp[0]}-{tp[1]}: offset {pos} is past the end of the log "
                              f"(range ends at {end})", KafkaError.OFFSET_OUT_OF_RANGE)
        if pos < p.log_start_offset and p.log_start_offset > 0 and fail_on_data_loss:
            raise DataLoss(tp, pos, p.log_start_offset)
        data = p.records or b""
        aborted = sorted((a.first_offset, a.producer_id) for a in (p.aborted_transactions or [])) \
            if read_committed else []
        rows, next_pos = _decode(memoryview(data), pos, end, aborted, read_committed, include_headers)
        if next_pos == pos:
            if p.high_watermark <= pos:
                raise ReaderError(f"{tp[0]}-{tp[1]}: the log ends at {p.high_watermark}, before "
                                  f"the planned range end {end} (was the topic recreated?)")
            if data:
                raise ReaderError(f"{tp[0]}-{tp[1]}: a record batch at {pos} is larger than "
                                  f"{max_bytes} bytes; raise kafka.max.partition.fetch.bytes")
            # An empty answer below the high watermark: retried at a steady short
            # interval (the records are there to read), within bounds.
            empty = empty or Backoff(cluster.retry.timeout_s, first_s=EMPTY_RETRY_S, max_s=EMPTY_RETRY_S)
            if empty.expired():
                raise ReaderError(f"{tp[0]}-{tp[1]}: no records at {pos} for "
                                  f"{cluster.retry.timeout_s:g} s though the range ends at {end}")
            empty.wait()
            continue
        empty = None
        pos = next_pos
        if len(rows):
            yield rows


def _decode(buf: memoryview, pos: int, end: int, aborted: list[tuple[int, int]],
            read_committed: bool, include_headers: bool) -> tuple[Rows, int]:
    rows = Rows([], [], [], [], [], [] if include_headers else None)
    # Producers whose aborted transaction started at or before the batch being
    # read (KIP-98): their transactional batches are dropped until their ABORT marker.
    aborting: set[int] = set()
    ai = 0
    nxt = pos
    for bpos, hdr in iter_batches(buf):
        last = hdr.base_offset + hdr.last_offset_delta
        if last < nxt:
            continue  # a batch the broker sent from before our position
        if hdr.base_offset >= end:
            break
        nxt = last + 1
        if not crc_ok(buf, bpos, hdr.size):
            raise ReaderError(f"record batch at offset {hdr.base_offset} fails its CRC-32C check",
                              KafkaError.CORRUPT_MESSAGE)
        while ai < len(aborted) and aborted[ai][0] <= last:
            aborting.add(aborted[ai][1])
            ai += 1
        if hdr.attributes & ATTR_CONTROL:
            if hdr.producer_id in aborting and _is_abort(buf, bpos, hdr):
                aborting.discard(hdr.producer_id)
            continue
        if read_committed and hdr.attributes & ATTR_TRANSACTIONAL and hdr.producer_id in aborting:
            continue
        batch = DefaultRecordBatch(bytes(buf[bpos:bpos + hdr.size]))
        try:
            _append(rows, batch, pos, end, include_headers)
        except UnsupportedCodecError as exc:
            raise ReaderError(f"record batch at offset {hdr.base_offset}: {exc} "
                              "(snappy, lz4 and zstd need the cramjam package)") from None
        except CorruptRecordException as exc:
            raise ReaderError(f"record batch at offset {hdr.base_offset}: {exc}",
                              KafkaError.CORRUPT_MESSAGE) from None
    return rows, min(nxt, end)


def _is_abort(buf: memoryview, bpos: int, hdr) -> bool:
    for rec in DefaultRecordBatch(bytes(buf[bpos:bpos + hdr.size])):
        key = rec.key
        return key is not None and len(key) >= 4 and int.from_bytes(key[2:4], "big", signed=True) == CONTROL_ABORT
    return False


def _append(rows: Rows, batch: DefaultRecordBatch, lo: int, hi: int, include_headers: bool) -> None:
    ts_type = batch.timestamp_type
    for rec in batch:
        off = rec.offset
        if off < lo or off >= hi:
            continue
        rows.keys.append(rec.key)
        rows.values.append(rec.value)
        rows.offsets.append(off)
        rows.timestamps.append(rec.timestamp)
        rows.timestamp_types.append(ts_type)
        if include_headers:
            rows.headers.append([{"key": k, "value": v} for k, v in rec.headers] or None)


__all__ = ["ClusterRouter", "ReaderError", "DataLoss", "Rows", "read_range", "EARLIEST", "LATEST"]
