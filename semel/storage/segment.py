"""One segment of a partition log: a data file and its sparse indexes.

Files, named by the segment's base offset (20 digits):
  <base>.log        record batches exactly as produced, baseOffset patched
  <base>.index      sparse offset index: (relative offset u32, position u32), big-endian,
                    one entry per index_interval_bytes of data, pointing at a batch start
  <base>.timeindex  time index: (max timestamp so far i64, relative offset i64 of the last
                    offset of the batch that reached it), appended when the max grows
  <base>.txnindex   aborted transactions whose marker is in this segment (see txn_index.py)

The indexes live in memory (compact arrays) and are written to their files in
batches: at flush checkpoints, at roll (with fsync) and at close. Their on-disk
copies can therefore lag or, after power loss, hold garbage at the end; whoever
loads them keeps only a verified prefix and rebuilds the rest by scanning
headers (see PartitionLog recovery).
"""
from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Iterator

from semel.protocol.records import (
    ATTR_TIMESTAMP_LOG_APPEND, HEADER_SIZE, LOG_OVERHEAD, MAGIC, BatchHeader, Buffer, crc_ok, iter_records,
    parse_header,
)

from .fs import FileHandle, FileSystem
from .txn_index import TxnIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TXNINDEX_SUFFIX = ".txnindex"
INDEX_SUFFIXES = (INDEX_SUFFIX, TIMEINDEX_SUFFIX, TXNINDEX_SUFFIX)

MAX_RELATIVE_OFFSET = 2**31 - 1   # relative offsets are stored as u32; stay well inside
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
_SCAN_CHUNK = 1 << 16
_BIG_ENDIAN = sys.byteorder == "big"
# baseOffset, batchLength, leaderEpoch, magic, crc, attributes, lastOffsetDelta: enough to step
_PREFIX = struct.Struct(">qiibIhi")


def segment_name(base: int) -> str:
    return f"{base:020d}"


def parse_segment_file(name: str, suffix: str) -> int | None:
    """Base offset of '<20 digits><suffix>', else None."""
    if len(name) != 20 + len(suffix) or not name.endswith(suffix):
        return None
    stem = name[:20]
    return int(stem) if stem.isdigit() else None


def _to_disk(a: array[int]) -> bytes:
    if _BIG_ENDIAN:
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


def _from_disk(typecode: str, data: bytes) -> array[int]:
    a = array(typecode)
    a.frombytes(data)
    if not _BIG_ENDIAN:
        a.byteswap()
    return a


class Segment:
    """In-memory view of one segment. Not thread-safe by itself: PartitionLog locks around it."""

    __slots__ = ("fs", "directory", "base", "_log", "size", "next_offset", "max_ts", "max_ts_offset",
                 "idx_rel", "idx_pos", "idx_persisted", "tidx_ts", "tidx_rel", "tidx_persisted",
                 "txn")

    def __init__(self, fs: FileSystem, directory: Path, base: int):
        self.fs = fs
        self.directory = directory
        self.base = base
        self._log: FileHandle | None = None
        self.size = 0
        self.next_offset = base          # one past the last offset stored here
        self.max_ts = -1                 # largest batch max timestamp seen
        self.max_ts_offset = -1          # last offset of the batch that holds max_ts
        self.idx_rel = array("I")
        self.idx_pos = array("I")
        self.idx_persisted = 0           # entries of idx_* already in the .index file
        self.tidx_ts = array("q")
        self.tidx_rel = array("q")
        self.tidx_persisted = 0
        self.txn = TxnIndex(fs, self.path(TXNINDEX_SUFFIX))

    # -- files -----------------------------------------------------------------------
    def path(self, suffix: str) -> Path:
        return self.directory / (segment_name(self.base) + suffix)

    @property
    def log(self) -> FileHandle:
        if self._log is None:
            self._log = self.fs.open(self.path(LOG_SUFFIX), create=False)
        return self._log

    def create_files(self) -> None:
        """Create an empty segment on disk (log file last: a log file implies a segment)."""
        for suffix in INDEX_SUFFIXES:
            self.fs.close(self.fs.open(self.path(suffix)))
        self._log = self.fs.open(self.path(LOG_SUFFIX))
        if self.fs.size(self._log):
            self.fs.truncate(self._log, 0)

    def close(self) -> None:
        if self._log is not None:
            log, self._log = self._log, None
            self.fs.close(log)

    def delete_files(self) -> None:
        """Remove the segment: the log file first, so a crash midway leaves only orphan
        index files, which the next open removes."""
        self.close()
        self.fs.unlink(self.path(LOG_SUFFIX))
        for suffix in INDEX_SUFFIXES:
            self.fs.unlink(self.path(suffix))

    # -- bookkeeping of appended batches ---------------------------------------------
    def note_batch(self, pos: int, base_offset: int, hdr: BatchHeader, interval: int) -> None:
        """Account for a batch written at pos (by append or found by a recovery scan)."""
        last = base_offset + hdr.last_offset_delta
        if hdr.max_timestamp > self.max_ts:
            self.max_ts = hdr.max_timestamp
            self.max_ts_offset = last
        last_pos = self.idx_pos[-1] if self.idx_pos else 0
        if pos > 0 and pos - last_pos >= interval:
            self.idx_rel.append(base_offset - self.base)
            self.idx_pos.append(pos)
            self._maybe_time_entry()
        self.size = pos + hdr.size
        self.next_offset = last + 1

    def _maybe_time_entry(self) -> None:
        if self.max_ts >= 0 and (not self.tidx_ts or self.max_ts > self.tidx_ts[-1]):
            self.tidx_ts.append(self.max_ts)
            self.tidx_rel.append(self.max_ts_offset - self.base)

    def seal_time_index(self) -> None:
        """Make the last time-index entry carry the segment's max (done when it stops growing)."""
        self._maybe_time_entry()

    # -- persistence of the in-memory indexes -------------------------------------------
    def persist_indexes(self, sync: bool) -> None:
        """Write index entries not yet on disk; fsync them when sync. Raises OSError."""
        self.idx_persisted = self._write_pairs(INDEX_SUFFIX, "I", 8, self.idx_rel, self.idx_pos,
                                               self.idx_persisted, sync)
        self.tidx_persisted = self._write_pairs(TIMEINDEX_SUFFIX, "q", 16, self.tidx_ts, self.tidx_rel,
                                                self.tidx_persisted, sync)
        self.txn.persist(sync)

    def _write_pairs(self, suffix: str, typecode: str, width: int, first: array[int], second: array[int],
                     persisted: int, sync: bool) -> int:
        """Append the entries of an index file past `persisted` (entry i is first[i], second[i],
        `width` bytes together); returns how many are on disk now."""
        n = len(first)
        if n > persisted:
            pairs = array(typecode, bytes(width * (n - persisted)))
            pairs[0::2] = first[persisted:n]
            pairs[1::2] = second[persisted:n]
            self._write_at(suffix, _to_disk(pairs), width * persisted, sync)
            return n
        if sync:
            self._write_at(suffix, b"", 0, sync)
        return persisted

    def _write_at(self, suffix: str, data: bytes, pos: int, sync: bool) -> None:
        f = self.fs.open(self.path(suffix))
        try:
            if data:
                self.fs.pwrite(f, data, pos)
            if sync:
                self.fs.fsync(f)
        finally:
            self.fs.close(f)

    def load_indexes(self, limit_pos: int, limit_offset: int) -> None:
        """Load the index files, keeping only entries that point below limit_pos /
        limit_offset, increase strictly, and (for the last one) match the log.

        The files are cut to what was kept, so later appends continue cleanly.
        """
        rel, pos = self._read_pairs(INDEX_SUFFIX, "I", 8)
        keep = 0
        prev_rel, prev_pos = -1, 0
        for r, p in zip(rel, pos):
            if r <= prev_rel or p <= prev_pos or p >= limit_pos or self.base + r >= limit_offset:
                break
            prev_rel, prev_pos = r, p
            keep += 1
        while keep and not self._batch_starts_at(pos[keep - 1], self.base + rel[keep - 1]):
            keep -= 1  # stale entry from before a crash: drop it and anything after
        self.idx_rel, self.idx_pos = rel[:keep], pos[:keep]
        self.idx_persisted = keep
        self._cut_file(INDEX_SUFFIX, 8 * keep, 8 * len(rel))

        ts, trel = self._read_pairs(TIMEINDEX_SUFFIX, "q", 16)
        keep = 0
        prev_ts, prev_rel = -1, -1
        for t, r in zip(ts, trel):
            if t <= prev_ts or r < prev_rel or r < 0 or self.base + r >= limit_offset:
                break
            prev_ts, prev_rel = t, r
            keep += 1
        self.tidx_ts, self.tidx_rel = ts[:keep], trel[:keep]
        self.tidx_persisted = keep
        self._cut_file(TIMEINDEX_SUFFIX, 16 * keep, 16 * len(ts))
        if keep:
            self.max_ts, self.max_ts_offset = ts[keep - 1], self.base + trel[keep - 1]
        self.txn.load(limit_offset)

    def _read_pairs(self, suffix: str, typecode: str, entry: int) -> tuple[array[int], array[int]]:
        try:
            data = self.fs.read_file(self.path(suffix))
        except FileNotFoundError:
            return array(typecode), array(typecode)
        data = data[: len(data) - len(data) % entry]
        flat = _from_disk(typecode, data)
        return flat[0::2], flat[1::2]

    def _cut_file(self, suffix: str, keep_bytes: int, had_bytes: int) -> None:
        path = self.path(suffix)
        if not self.fs.exists(path):
            self.fs.close(self.fs.open(path))
            return
        if self.fs.file_size(path) != keep_bytes:
            f = self.fs.open(path)
            try:
                self.fs.truncate(f, keep_bytes)
            finally:
                self.fs.close(f)

    def reset_indexes(self) -> None:
        """Forget all index entries (they will be rebuilt by a scan)."""
        self.idx_rel, self.idx_pos, self.idx_persisted = array("I"), array("I"), 0
        self.tidx_ts, self.tidx_rel, self.tidx_persisted = array("q"), array("q"), 0
        self.max_ts, self.max_ts_offset = -1, -1
        for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            self._cut_file(suffix, 0, -1)
        self.txn.reset()

    def _batch_starts_at(self, pos: int, offset: int) -> bool:
        head = self.fs.pread(self.log, 17, pos)
        if len(head) < 17:
            return False
        fields: tuple[int, int, int, int] = struct.unpack(">qiib", head)
        base, length, _, magic = fields
        return base == offset and magic == MAGIC and length >= _MIN_BATCH_LENGTH

    def truncate_to(self, offset: int) -> None:
        """Cut the segment before the batch holding `offset` (replica truncation): the
        data file, the offset and time indexes (in memory and on disk), the running
        max timestamp and the aborted-transaction index. Raises OSError.
        Where the bytes from `offset` on do not read back as batches (the pages a failed
        fsync dropped, storage.fsync_repair), it cuts where the last batch before ends,
        when that is `offset`."""
        cut_pos, cut_off = (0, self.base) if offset <= self.base else (self.size, self.next_offset)
        # From a batch before `offset`: the one holding it may be what does not read back.
        for pos, hdr in self.iter_headers(self.lookup(offset - 1)):
            if hdr.last_offset >= offset:
                cut_pos, cut_off = pos, hdr.base_offset
                break
            if hdr.next_offset == offset:
                cut_pos, cut_off = pos + hdr.size, offset
        if cut_pos >= self.size:
            return
        self.fs.truncate(self.log, cut_pos)
        self.size, self.next_offset = cut_pos, cut_off
        keep = bisect_left(self.idx_rel, cut_off - self.base)
        del self.idx_rel[keep:], self.idx_pos[keep:]
        if self.idx_persisted > keep:
            self.idx_persisted = keep
            self._cut_file(INDEX_SUFFIX, 8 * keep, -1)
        keep = bisect_left(self.tidx_rel, cut_off - self.base)
        del self.tidx_ts[keep:], self.tidx_rel[keep:]
        if self.tidx_persisted > keep:
            self.tidx_persisted = keep
            self._cut_file(TIMEINDEX_SUFFIX, 16 * keep, -1)
        self.max_ts, self.max_ts_offset = -1, -1
        for _, hdr in self.iter_headers(0):
            if hdr.max_timestamp > self.max_ts:
                self.max_ts, self.max_ts_offset = hdr.max_timestamp, hdr.last_offset
        self.txn.truncate_to(cut_off)

    # -- lookups ---------------------------------------------------------------------------
    def lookup(self, offset: int) -> int:
        """Position of a batch start at or before the batch holding offset."""
        i = bisect_right(self.idx_rel, offset - self.base) - 1
        return self.idx_pos[i] if i >= 0 else 0

    def iter_headers(self, start: int, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of trusted batches in [start, end), reading in chunks."""
        end = self.size if end is None else end
        pos, buf, buf_start = start, b"", 0
        while end - pos >= HEADER_SIZE:
            if pos < buf_start or pos + HEADER_SIZE > buf_start + len(buf):
                buf_start = pos
                buf = self.fs.pread(self.log, min(_SCAN_CHUNK, end - pos), pos)
                if len(buf) < HEADER_SIZE:
                    return
            hdr = parse_header(buf, pos - buf_start)
            if hdr.batch_length < _MIN_BATCH_LENGTH:
                return  # never in a recovered log; stop rather than loop
            yield pos, hdr
            pos += hdr.size

    def read(self, offset: int, max_bytes: int, upper_bound: int) -> bytes | memoryview | None:
        """Whole batches from the one holding offset; None when offset is past this segment.

        One pread covers the walk from the index entry (less than index_interval_bytes
        before the wanted batch) and max_bytes after it; the answer is a view of that
        buffer, so the batches are copied once (kernel to user) on their way to a
        socket. The buffer is a fresh immutable bytes object: a view of it stays valid
        whatever happens to the file later (truncation, deletion)."""
        start = self.lookup(offset)
        avail = self.size - start
        if avail < HEADER_SIZE:
            return None
        want = max(max_bytes, 0)
        buf = self.fs.pread(self.log, min(min(self.next_gap(start), _SCAN_CHUNK) + want, avail), start)
        first = _first_batch(buf, offset)
        if first is None and len(buf) < avail:
            # The wanted batch lies further from its index entry than expected (entries
            # written under another index interval): find it by walking headers.
            first = self._walk_to(offset, start)
            if first is not None:
                p, size, last = first
                buf, start = self.fs.pread(self.log, min(max(want, size), self.size - p), p), p
                first = 0, size, last
        if first is None:
            return None            # offset is past this segment's last batch
        p, size, last = first
        if last >= upper_bound:
            return b""
        if p + size > len(buf):   # one batch bigger than max_bytes: served whole
            buf, p = self.fs.pread(self.log, size, start + p), 0
        end = _batches_end(buf, p + size, p + max(want, size), upper_bound)
        return buf if p == 0 and end == len(buf) else memoryview(buf)[p:end]

    def _walk_to(self, offset: int, start: int) -> tuple[int, int, int] | None:
        for pos, hdr in self.iter_headers(start):
            if hdr.last_offset >= offset:
                return pos, hdr.size, hdr.last_offset
        return None

    def next_gap(self, pos: int) -> int:
        """Bytes from index position pos to the next index entry (or the segment end).
        A batch start with no entry of its own lies less than index_interval_bytes
        after the entry before it, so the wanted batch usually begins early in this gap."""
        i = bisect_right(self.idx_pos, pos)
        return (self.idx_pos[i] if i < len(self.idx_pos) else self.size) - pos

    def find_timestamp(self, ts: int, min_offset: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record at or after min_offset with timestamp >= ts."""
        i = bisect_left(self.tidx_ts, ts) - 1
        # entry i says: every record up to that offset has a timestamp < ts
        start_off = max(min_offset, self.base + self.tidx_rel[i] + 1 if i >= 0 else self.base)
        for pos, hdr in self.iter_headers(self.lookup(start_off)):
            if hdr.last_offset < start_off or hdr.max_timestamp < ts:
                continue
            return self._record_at_or_after(pos, hdr, ts, start_off)
        return None

    def _record_at_or_after(self, pos: int, hdr: BatchHeader, ts: int, min_offset: int) -> tuple[int, int]:
        # Compressed and log-append-time batches are not opened: their base offset is a
        # safe answer (a reader starting there sees a few records early, none missed).
        if hdr.compression or hdr.is_control or hdr.attributes & ATTR_TIMESTAMP_LOG_APPEND:
            return hdr.max_timestamp, max(hdr.base_offset, min_offset)
        batch = self.fs.pread(self.log, hdr.size, pos)
        try:
            for rec in iter_records(batch):
                if rec.offset >= min_offset and rec.timestamp >= ts:
                    return rec.timestamp, rec.offset
        except ValueError:
            pass
        return hdr.max_timestamp, max(hdr.base_offset, min_offset)

    def largest_timestamp(self) -> int:
        """For time retention: the max record timestamp, or the file's mtime when there is none."""
        if self.max_ts >= 0:
            return self.max_ts
        try:
            return self.fs.mtime_ms(self.path(LOG_SUFFIX))
        except OSError:
            return -1


def scan_valid(buf: Buffer, start: int, end: int, expected_offset: int, crc_from: int
               ) -> Iterator[tuple[int, BatchHeader]]:
    """Batches of buf[start:end] that are well formed, continue the offsets, and (from
    position crc_from on) pass their CRC. Stops silently at the first one that does not:
    that is where a torn or corrupt tail begins."""
    pos = start
    while end - pos >= HEADER_SIZE:
        hdr = parse_header(buf, pos)
        size = hdr.size
        if (hdr.magic != MAGIC or hdr.batch_length < _MIN_BATCH_LENGTH or pos + size > end
                or hdr.base_offset != expected_offset or hdr.last_offset_delta < 0
                or hdr.last_offset_delta > MAX_RELATIVE_OFFSET or hdr.record_count < 0):
            return
        if pos >= crc_from and not crc_ok(buf, pos, size):
            return
        yield pos, hdr
        pos += size
        expected_offset = hdr.next_offset


def _first_batch(buf: Buffer, offset: int) -> tuple[int, int, int] | None:
    """(position, size, last offset) of the first batch of buf whose last offset is at
    or after offset; None when buf ends first. Only the fixed prefix of each header
    is read: no per-batch objects."""
    p, n = 0, len(buf)
    while n - p >= _PREFIX.size:
        base, length, _, _, _, _, delta = _PREFIX.unpack_from(buf, p)
        size = LOG_OVERHEAD + length
        if length < _MIN_BATCH_LENGTH:
            return None     # never in a recovered log; stop rather than loop
        if base + delta >= offset:
            return p, size, base + delta
        p += size
    return None


def _batches_end(buf: Buffer, p: int, limit: int, upper_bound: int) -> int:
    """End of the whole batches of buf from p that fit below limit and hold only
    offsets below upper_bound."""
    end, n = p, min(len(buf), limit)
    while n - p >= _PREFIX.size:
        base, length, _, _, _, _, delta = _PREFIX.unpack_from(buf, p)
        size = LOG_OVERHEAD + length
        if p + size > n or base + delta >= upper_bound or length < _MIN_BATCH_LENGTH:
            break
        p += size
        end = p
    return end
