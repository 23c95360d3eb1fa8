"""Record batches (v2; records optionally compressed) built from Arrow binary columns with NumPy.

The sink's tasks get their rows as Arrow record batches. Building a Kafka batch
record by record (aiokafka's compiled builder, one Python call per record) cost
about 3-5 us a record here, the largest per-row cost of the exactly-once sink.
Here every field of every record is computed for all records at once: varint
lengths and bytes with array arithmetic, keys and values copied from the Arrow
data buffers with one gather each. The bytes are the same a record-by-record
builder makes (semel.protocol.records.build_batch; the test compares them).

Only what the columnar path needs (compressed or not): no headers, timestamp delta 0 for every record
(one timestamp per batch, as the builder was given), keys and values binary or
null.
"""
from __future__ import annotations

import numpy as np

from semel.client import txn as wire
from semel.protocol import records

# zigzag(int32) needs at most 5 bytes of 7 bits
_MAX_VARINT = 5


class BinaryColumn:
    """A binary (or string) Arrow array as NumPy views: where each value starts in the
    data buffer, its length (-1 for null) and the data buffer itself; no copy."""

    def __init__(self, arr):
        import pyarrow as pa
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            arr = arr.cast(pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary())
        if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
            arr = arr.cast(pa.binary())
        _, offsets, data = arr.buffers()
        width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
        off = np.frombuffer(offsets, dtype=width, count=len(arr) + 1 + arr.offset)[arr.offset:].astype(np.int64)
        self.starts = off[:-1]
        self.lengths = np.diff(off)
        if arr.null_count:
            self.lengths[~valid(arr)] = -1
        self.data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)

    def sizes(self):
        """Bytes of each value (0 for null)."""
        return np.maximum(self.lengths, 0)


# Arrow's to_numpy() would do for the two below, but its first call imports pandas for
# its converter: a quarter second of every Python worker that runs a sink task.

def valid(arr):
    """Whether each value of an Arrow array with a validity bitmap is not null (bools)."""
    bits = np.unpackbits(np.frombuffer(arr.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[arr.offset:arr.offset + len(arr)].astype(bool)


def ints(arr):
    """A signed integer Arrow array without nulls as a NumPy view (no copy)."""
    width = arr.type.bit_width // 8
    return np.frombuffer(arr.buffers()[1], dtype=np.dtype(f"<i{width}"), count=len(arr), offset=arr.offset * width)


def _zigzag(v):
    return (v << 1) ^ (v >> 63)


def _varint_len(u):
    n = np.ones(len(u), dtype=np.int64)
    for k in range(1, _MAX_VARINT):
        n += u >= (1 << (7 * k))
    return n


def _put_varint(out, pos, u, nb) -> None:
    """Write varint u[i] (zigzagged already) of nb[i] bytes at out[pos[i]:]."""
    for k in range(_MAX_VARINT):
        m = nb > k
        if not m.any():
            break
        byte = (u[m] >> (7 * k)) & 0x7F
        byte |= (nb[m] > k + 1).astype(np.int64) << 7
        out[pos[m] + k] = byte


def _put_bytes(out, dst, col: BinaryColumn, rows) -> None:
    """Copy the values of `rows` into out at dst[i] (one gather for all of them)."""
    lengths = np.maximum(col.lengths[rows], 0)
    total = int(lengths.sum())
    if total == 0:
        return
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[np.repeat(dst, lengths) + within] = col.data[np.repeat(col.starts[rows], lengths) + within]


def encode(keys: BinaryColumn | None, values: BinaryColumn, rows, *, producer_id: int, producer_epoch: int,
           base_sequence: int, timestamp_ms: int, transactional: bool = True, compression: int = 0) -> bytes:
    """One batch of the records at `rows` (indices into the columns, in order), its records
    compressed with `compression` (a record-batch codec; 0 none)."""
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    klen = keys.lengths[rows] if keys is not None else np.full(n, -1, np.int64)
    vlen = values.lengths[rows]
    zoff, zk, zv = _zigzag(np.arange(n, dtype=np.int64)), _zigzag(klen), _zigzag(vlen)
    noff, nk, nv = _varint_len(zoff), _varint_len(zk), _varint_len(zv)
    # attributes, timestamp delta and header count are one zero byte each
    body = 3 + noff + nk + np.maximum(klen, 0) + nv + np.maximum(vlen, 0)
    zbody = _zigzag(body)
    nbody = _varint_len(zbody)
    start = np.cumsum(nbody + body) - (nbody + body)
    out = np.zeros(int((nbody + body).sum()), dtype=np.uint8)
    _put_varint(out, start, zbody, nbody)
    at = start + nbody + 2  # past attributes and timestamp delta
    _put_varint(out, at, zoff, noff)
    at = at + noff
    _put_varint(out, at, zk, nk)
    at = at + nk
    if keys is not None:
        _put_bytes(out, at, keys, rows)
    at = at + np.maximum(klen, 0)
    _put_varint(out, at, zv, nv)
    _put_bytes(out, at + nv, values, rows)
    body = out.tobytes()
    if compression:
        body = wire.compress(compression, body)
    return records.seal_batch(body, n, timestamp_ms=timestamp_ms, producer_id=producer_id,
                              producer_epoch=producer_epoch, base_sequence=base_sequence,
                              transactional=transactional, compression=compression)
