"""Removing a partition log's oldest data: retention by time and size, DeleteRecords,
and a coordinator's drop of segments it has rewritten past.

Each records the new log start in a checkpoint before it deletes any file, so a crash
midway never serves records below the start it announced. Retention is one of
PartitionLog's parts (storage/log.py holds the state it works on).
"""
from __future__ import annotations

from .errors import OffsetOutOfRange, StorageError
from .segment import Segment


class Retention:
    """PartitionLog's deletion of whole old segments."""

    def enforce_retention(self, now_ms: int) -> int:
        """Delete whole non-active segments past retention_ms (by their max timestamp) or
        while the log exceeds retention_bytes. Returns how many were deleted."""
        cfg = self.config
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            size = self.size_bytes()
            doomed: list[Segment] = []
            for seg in self._segments[:-1]:
                too_old = cfg.retention_ms >= 0 and now_ms - seg.largest_timestamp() > cfg.retention_ms
                too_big = cfg.retention_bytes >= 0 and size - seg.size >= cfg.retention_bytes
                if not (too_old or too_big):
                    break
                doomed.append(seg)
                size -= seg.size
            with self._lock:
                self.producers.expire(now_ms, cfg.producer_id_expiration_ms)
                if not doomed:
                    return 0
                del self._segments[:len(doomed)]
                del self._bases[:len(doomed)]
                self.log_start_offset = max(self.log_start_offset, self._segments[0].base)
            try:
                # Record the new log start first: if a crash interrupts the deletions,
                # the next open still refuses reads below it.
                self._flush_locked(force_checkpoint=True, strict=True)
                for seg in doomed:
                    seg.delete_files()
            except (OSError, StorageError) as exc:
                raise StorageError(f"retention in {self.directory} failed: {exc}") from exc
            return len(doomed)

    def delete_segments_before(self, offset: int) -> int:
        """Drop whole non-active segments holding only offsets below `offset`; the
        log start moves to the first kept segment. For coordinators that have
        rewritten their live state at or after `offset` (compaction by rewrite)."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            doomed = []
            for seg, nxt in zip(self._segments[:-1], self._segments[1:]):
                if nxt.base > offset:
                    break
                doomed.append(seg)
            if not doomed:
                return 0
            with self._lock:
                del self._segments[:len(doomed)]
                del self._bases[:len(doomed)]
                self.log_start_offset = max(self.log_start_offset, self._segments[0].base)
            try:
                self._flush_locked(force_checkpoint=True, strict=True)  # log start first, then files
                for seg in doomed:
                    seg.delete_files()
            except (OSError, StorageError) as exc:
                raise StorageError(f"deleting old segments in {self.directory} failed: {exc}") from exc
            return len(doomed)

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start up to `offset` (at most the high watermark)
        and drop the whole segments below it. Nothing at or above `offset` is touched;
        a batch straddling it stays on disk but reads below the start are refused.
        Returns the log start offset after the call."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            if not 0 <= offset <= self.high_watermark:
                raise OffsetOutOfRange(offset, self.log_start_offset, self.high_watermark)
            if offset <= self.log_start_offset:
                return self.log_start_offset
            with self._lock:
                cut = sum(1 for nxt in self._segments[1:] if nxt.base <= offset)
                doomed = self._segments[:cut]
                del self._segments[:cut]
                del self._bases[:cut]
                self.log_start_offset = offset
            try:
                self._flush_locked(force_checkpoint=True, strict=True)  # the new start is durable first
                for seg in doomed:
                    seg.delete_files()
            except (OSError, StorageError) as exc:
                raise StorageError(f"deleting records in {self.directory} failed: {exc}") from exc
            return self.log_start_offset
