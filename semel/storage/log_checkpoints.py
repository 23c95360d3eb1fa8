"""A partition log's recovery checkpoints: when one is due, and writing one.

A checkpoint lets open() skip the CRC scan of everything below it (log_loader). It
is written with the active segment's indexes and a producer-state snapshot, in that
order, the checkpoint file last so that it only ever vouches for files already on
disk. RecoveryCheckpoints belongs to one PartitionLog (semel.storage.log), which
calls it from its flush; it owns the bookkeeping (bytes appended since the last
checkpoint, when that was, and the last write's error).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from . import checkpoint as cpfile
from .errors import StorageError
from .fs import FileSystem
from .log_config import LogConfig
from .producer_state import ProducerStateManager, prune_snapshots, write_snapshot
from .segment import Segment

log = logging.getLogger("semel.storage")

Captured = tuple[cpfile.Checkpoint, bytes]   # the checkpoint and the producer snapshot it vouches for


class RecoveryCheckpoints:
    """The checkpoints of the log in `directory`, written through `fs`; `config` says how
    often (checkpoint_interval_bytes, checkpoint_interval_ms)."""

    def __init__(self, fs: FileSystem, directory: Path, config: LogConfig) -> None:
        self.fs = fs
        self.directory = directory
        self.config = config
        self.bytes_since = 0
        self._last = time.monotonic()
        # Why the last checkpoint could not be written (None: it was).
        self.last_error: OSError | None = None

    def note_appended(self, size: int) -> None:
        self.bytes_since += size

    def due(self) -> bool:
        cfg = self.config
        return (self.bytes_since >= cfg.checkpoint_interval_bytes
                or (time.monotonic() - self._last) * 1000 >= cfg.checkpoint_interval_ms)

    @staticmethod
    def capture(seg: Segment, leo: int, clean: bool, log_start_offset: int,
                producers: ProducerStateManager) -> Captured:
        """Everything a checkpoint at leo needs; the caller holds the log's state_lock so
        it is one instant."""
        cp = cpfile.Checkpoint(recovery_offset=leo, segment_base=seg.base, position=seg.size,
                               log_start_offset=log_start_offset, max_timestamp=seg.max_ts,
                               max_timestamp_offset=seg.max_ts_offset, clean=clean)
        return cp, producers.to_bytes()

    def write(self, seg: Segment, state: Captured, strict: bool) -> None:
        """Write `state`. The data is durable already, so a failure only costs restart
        time: it is logged and kept in last_error, and raised (StorageError) only when
        `strict`."""
        try:
            self._persist(seg, state)
            self.last_error = None
        except OSError as exc:
            self.last_error = exc
            log.warning("%s: could not write the recovery checkpoint: %s", self.directory, exc)
            if strict:
                raise StorageError(f"checkpoint of {self.directory} failed: {exc}") from exc

    def _persist(self, seg: Segment, state: Captured) -> None:
        """Indexes, then the producer snapshot, then the checkpoint that vouches for both."""
        cp, snapshot = state
        seg.persist_indexes(sync=False)
        write_snapshot(self.fs, self.directory, cp.recovery_offset, snapshot)
        self.fs.write_atomic(self.directory / cpfile.FILE_NAME, cp.encode(), sync_dir=True)
        prune_snapshots(self.fs, self.directory)
        self.bytes_since = 0
        self._last = time.monotonic()
