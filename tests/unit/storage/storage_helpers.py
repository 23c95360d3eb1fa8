"""Small builders and inspectors shared by the storage tests."""
from __future__ import annotations

from pathlib import Path

from semel.protocol.records import build_batch, iter_batches, iter_records, split_batches
from semel.storage import AppendInfo, LogConfig, PartitionLog
from semel.storage.segment import LOG_SUFFIX, segment_name

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=128)


def batch(values: list[bytes] | bytes, *, ts: int = 1_000, pid: int = -1, epoch: int = -1, seq: int = -1,
          txn: bool = False) -> bytes:
    if isinstance(values, bytes):
        values = [values]
    return build_batch([(None, v) for v in values], timestamp_ms=ts, producer_id=pid, producer_epoch=epoch,
                       base_sequence=seq, transactional=txn)


def append(plog: PartitionLog, *payloads: bytes) -> AppendInfo:
    data = b"".join(payloads)
    batches, err = split_batches(data)
    assert err == 0, err
    return plog.append(data, batches)


def fill(plog: PartitionLog, n: int, *, size: int = 40, ts0: int = 1_000) -> list[bytes]:
    """Append n one-record batches with distinct values; returns the values."""
    values = []
    for i in range(n):
        v = (b"%06d-" % i) + b"x" * size
        append(plog, batch(v, ts=ts0 + i))
        values.append(v)
    return values


def dump(plog: PartitionLog) -> list[tuple[int, bytes]]:
    """Every batch from log start to end as (base offset, raw bytes)."""
    out, offset = [], plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20)
        assert data, f"empty read at {offset} < {plog.log_end_offset}"
        for pos, hdr in iter_batches(data):
            out.append((hdr.base_offset, bytes(data[pos:pos + hdr.size])))
            offset = hdr.next_offset
    return out


def values(plog: PartitionLog) -> list[tuple[int, bytes]]:
    """(offset, value) of every record."""
    out = []
    for _, raw in dump(plog):
        out.extend((r.offset, r.value) for r in iter_records(raw))
    return out


def segment_path(directory: Path, base: int) -> Path:
    return Path(directory) / (segment_name(base) + LOG_SUFFIX)
