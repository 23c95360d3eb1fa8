"""Removing a partition log's oldest data: retention by time and size, DeleteRecords,
and a coordinator's drop of segments it has rewritten past.

Each records the new log start in a checkpoint before it deletes any file, so a crash
midway never serves records below the start it announced. A Retention works on one
PartitionLog, given to it as a RetainedLog: the members below are all it touches.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from .errors import OffsetOutOfRange, StorageError
from .log_config import LogConfig
from .producer_state import ProducerStateManager
from .segment import Segment


class RetainedLog(Protocol):
    """What Retention needs of its log (PartitionLog): the segments and log start it
    moves, under the log's locks, and the checkpoint that records the new start."""
    directory: Path
    config: LogConfig
    io_lock: threading.RLock
    state_lock: threading.Lock
    segments: list[Segment]
    bases: list[int]
    producers: ProducerStateManager
    log_start_offset: int

    @property
    def high_watermark(self) -> int: ...

    def settle(self) -> None: ...

    def check_writable(self) -> None: ...

    def size_bytes(self) -> int: ...

    def flush_locked(self, *, force_checkpoint: bool = False, clean: bool = False, strict: bool = False) -> int: ...


class Retention:
    """The deletion of a log's whole old segments."""

    def __init__(self, log: RetainedLog) -> None:
        self._log = log

    def enforce_retention(self, now_ms: int) -> int:
        """Delete whole non-active segments past retention_ms (by their max timestamp) or
        while the log exceeds retention_bytes. Returns how many were deleted."""
        cfg = self._log.config
        self._log.settle()   # first: a roll in a worker thread waits for io_lock
        with self._log.io_lock:
            self._log.check_writable()
            size = self._log.size_bytes()
            doomed: list[Segment] = []
            for seg in self._log.segments[:-1]:
                too_old = cfg.retention_ms >= 0 and now_ms - seg.largest_timestamp() > cfg.retention_ms
                too_big = cfg.retention_bytes >= 0 and size - seg.size >= cfg.retention_bytes
                if not (too_old or too_big):
                    break
                doomed.append(seg)
                size -= seg.size
            with self._log.state_lock:
                self._log.producers.expire(now_ms, cfg.producer_id_expiration_ms)
            if not doomed:
                return 0
            self._drop_first_segments(len(doomed), None, "retention")
            return len(doomed)

    def delete_segments_before(self, offset: int) -> int:
        """Drop whole non-active segments holding only offsets below `offset`; the
        log start moves to the first kept segment. For coordinators that have
        rewritten their live state at or after `offset` (compaction by rewrite)."""
        self._log.settle()   # first: a roll in a worker thread waits for io_lock
        with self._log.io_lock:
            self._log.check_writable()
            doomed = []
            for seg, nxt in zip(self._log.segments[:-1], self._log.segments[1:]):
                if nxt.base > offset:
                    break
                doomed.append(seg)
            if not doomed:
                return 0
            self._drop_first_segments(len(doomed), None, "deleting old segments")
            return len(doomed)

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start up to `offset` (at most the high watermark)
        and drop the whole segments below it. Nothing at or above `offset` is touched;
        a batch straddling it stays on disk but reads below the start are refused.
        Returns the log start offset after the call."""
        self._log.settle()   # first: a roll in a worker thread waits for io_lock
        with self._log.io_lock:
            self._log.check_writable()
            if not 0 <= offset <= self._log.high_watermark:
                raise OffsetOutOfRange(offset, self._log.log_start_offset, self._log.high_watermark)
            if offset <= self._log.log_start_offset:
                return self._log.log_start_offset
            cut = sum(1 for nxt in self._log.segments[1:] if nxt.base <= offset)
            self._drop_first_segments(cut, offset, "deleting records")
            return self._log.log_start_offset

    def _drop_first_segments(self, count: int, log_start: int | None, what: str) -> None:
        """With io_lock held: take the first `count` segments out of the log, move the log
        start to `log_start` (None: the first kept segment's base, if higher), then delete
        their files. The new log start is checkpointed before any file goes, so a crash
        between the deletions still refuses reads below it at the next open."""
        with self._log.state_lock:
            doomed = self._log.segments[:count]
            del self._log.segments[:count]
            del self._log.bases[:count]
            if log_start is None:
                log_start = max(self._log.log_start_offset, self._log.segments[0].base)
            self._log.log_start_offset = log_start
        try:
            self._log.flush_locked(force_checkpoint=True, strict=True)
            for seg in doomed:
                seg.delete_files()
        except (OSError, StorageError) as exc:
            raise StorageError(f"{what} in {self._log.directory} failed: {exc}") from exc
