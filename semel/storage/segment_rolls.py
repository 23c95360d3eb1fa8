"""Rolling a partition log: when the active segment is full, and starting the next one.

A SegmentRolls works on one PartitionLog (semel.storage.log), given to it as a
RolledLog: the members below are all it touches. A roll fsyncs the old segment with
its indexes before the new one is linked in, so everything below the new base is
durable, then checkpoints at the new base.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol

from semel.protocol.records import BatchHeader

from .errors import StorageError
from .fs import FileSystem
from .fsync_repair import FsyncRepair
from .log_config import LogConfig
from .segment import MAX_RELATIVE_OFFSET, Segment


class SegmentedLog(Protocol):
    """A PartitionLog's segments (the last one active) and their base offsets, its files
    and settings, and the locks they change under."""
    directory: Path
    config: LogConfig
    fs: FileSystem
    io_lock: threading.RLock
    state_lock: threading.Lock
    segments: list[Segment]
    bases: list[int]


class RolledLog(SegmentedLog, Protocol):
    """What SegmentRolls needs of its log (PartitionLog)."""
    log_end_offset: int
    flushed_offset: int
    storage_failures: int
    fsync_failures: int
    fsync_repair: FsyncRepair

    def flush_locked(self, *, force_checkpoint: bool = False, clean: bool = False, strict: bool = False) -> int: ...


class SegmentRolls:
    """The segment rolls of one log."""

    def __init__(self, log: RolledLog) -> None:
        self._log = log

    def due(self, size: int, batches: list[tuple[int, BatchHeader]]) -> bool:
        """Would `size` bytes of these batches overflow the active segment (bytes, or
        offsets relative to its base)?"""
        seg = self._log.segments[-1]
        if seg.size == 0:
            return False
        count = sum(h.last_offset_delta + 1 for _, h in batches)
        return (seg.size + size > self._log.config.segment_bytes
                or self._log.log_end_offset + count - 1 - seg.base > MAX_RELATIVE_OFFSET)

    def roll(self, new_base: int, close_old: bool = True) -> Segment:
        """Start a new active segment at new_base; the old one is fsynced with its indexes.
        Returns the old segment (closed unless close_old is False: see WriteOffload.roll_in_thread)."""
        plog, fs = self._log, self._log.fs
        with plog.io_lock:
            old = plog.segments[-1]
            new = Segment(fs, plog.directory, new_base)
            try:
                fs.fsync(old.log)
            except OSError as exc:
                plog.storage_failures += 1
                plog.fsync_repair.failed()   # its dropped pages: the tail past flushed_offset is untrusted
                raise StorageError(f"cannot roll {plog.directory} at offset {new_base}: {exc}") from exc
            try:
                old.seal_time_index()
                old.persist_indexes(sync=True)
                new.create_files()
                fs.fsync_dir(plog.directory)
            except OSError as exc:
                plog.storage_failures += 1
                plog.fsync_failures += 1   # an index or directory fsync may be the step that failed
                try:
                    new.delete_files()
                except OSError:
                    pass
                raise StorageError(f"cannot roll {plog.directory} at offset {new_base}: {exc}") from exc
            with plog.state_lock:
                plog.segments.append(new)
                plog.bases.append(new_base)
            plog.fsync_repair.advance(new_base)   # not past a tail a failed fsync left untrusted
            if close_old:
                old.close()
            # checkpoint + producer snapshot at the new base (failure only costs restart time;
            # none vouches for a tail a failed fsync left untrusted)
            if plog.fsync_repair.trusted:
                plog.flush_locked(force_checkpoint=True)
            return old
