"""What compaction needs of a partition log: where it may clean, the closed segments'
bytes, and the crash-safe swap of one closed segment's contents.

A SegmentRewrites works on one PartitionLog (semel.storage.log), given to it as a
RewrittenLog: the members below are all it touches. storage.compaction reaches it as
the log's `rewrites`.
"""
from __future__ import annotations

from array import array
from bisect import bisect_right
from typing import Protocol

from semel.protocol.records import iter_batches

from .errors import StorageError
from .segment import INDEX_SUFFIX, LOG_SUFFIX, TIMEINDEX_SUFFIX, Segment
from .segment_rolls import SegmentedLog


class RewrittenLog(SegmentedLog, Protocol):
    """What SegmentRewrites needs of its log (PartitionLog)."""

    @property
    def last_stable_offset(self) -> int: ...

    def settle(self) -> None: ...

    def check_writable(self) -> None: ...

    def offline(self, reason: str) -> StorageError: ...


class SegmentRewrites:
    """The closed segments of one log, as compaction reads and rewrites them."""

    def __init__(self, log: RewrittenLog) -> None:
        self._log = log

    def cleanable_end(self) -> int:
        """Where a compaction may stop: the active segment and anything at or above the
        LSO (open transactions) are never cleaned."""
        return min(self._log.segments[-1].base, self._log.last_stable_offset)

    def closed_segments_below(self, offset: int) -> list[int]:
        """Bases of the non-active segments that end at or below `offset`."""
        return [seg.base for seg in self._log.segments[:-1] if seg.next_offset <= offset]

    def _segment(self, base: int) -> Segment:
        bases = self._log.bases
        i = bisect_right(bases, base) - 1
        if i < 0 or bases[i] != base:
            raise StorageError(f"{self._log.directory}: no segment at {base}")
        return self._log.segments[i]

    def segment_bytes(self, base: int) -> bytes:
        seg = self._segment(base)
        try:
            return self._log.fs.pread(seg.log, seg.size, 0)
        except OSError as exc:
            raise StorageError(f"read of {seg.path(LOG_SUFFIX)} failed: {exc}") from exc

    def bytes_after(self, base: int) -> bytes:
        """Every batch of the segments after the one at `base` (for walking headers)."""
        i = self._log.bases.index(base) + 1
        return b"".join(self._log.fs.pread(seg.log, seg.size, 0) for seg in self._log.segments[i:])

    def replace_segment(self, base: int, data: bytes) -> None:
        """Swap a closed segment's contents for `data` (same offsets, fewer records).
        Crash-safe: the offset/time index files are emptied first (an empty sparse
        index is valid for either content), then the log file is replaced atomically,
        then the indexes are rebuilt. The aborted-transaction index is kept."""
        plog, fs = self._log, self._log.fs
        plog.settle()   # first: a roll in a worker thread waits for io_lock
        with plog.io_lock:
            plog.check_writable()
            seg = self._segment(base)
            if seg is plog.segments[-1]:
                raise StorageError(f"{plog.directory}: the active segment is never rewritten")
            try:
                for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                    fs.write_atomic(seg.path(suffix), b"", sync_dir=False)
                with plog.state_lock:
                    seg.close()
                    fs.write_atomic(seg.path(LOG_SUFFIX), data, sync_dir=True)
                    seg.idx_rel, seg.idx_pos, seg.idx_persisted = array("I"), array("I"), 0
                    seg.tidx_ts, seg.tidx_rel, seg.tidx_persisted = array("q"), array("q"), 0
                    seg.max_ts, seg.max_ts_offset = -1, -1
                    for pos, hdr in iter_batches(data):
                        seg.note_batch(pos, hdr.base_offset, hdr, plog.config.index_interval_bytes)
                    seg.seal_time_index()
                seg.persist_indexes(sync=True)
            except OSError as exc:
                raise plog.offline(f"rewriting segment {base} failed: {exc}") from exc
