"""What a follower's replica of a partition log does that a leader's never does.

It appends the leader's batches exactly as fetched (offsets, epochs, producer ids
kept), cuts its log back to where it agrees with the leader (truncate_to), or starts
over past the leader's log start (reset_to). Producer state, the aborted-transaction
index and the leader-epoch cache follow the data, so the replica can take over.
A ReplicaWrites works on one PartitionLog, given to it as a ReplicatedLog: the members
below are all it touches (the role the log is given, set_follower, set_leader_epoch
and set_high_watermark, stays in storage/log.py).
"""
from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from semel.protocol.errors import KafkaError
from semel.protocol.records import CONTROL_ABORT, BatchHeader, split_batches

from .errors import AppendError, StorageError
from .fs import FileSystem
from .leader_epoch import LeaderEpochCache
from .log_loader import index_abort, read_marker, replay_producers
from .producer_state import ProducerStateManager, prune_snapshots
from .segment import Segment
from .types import AppendInfo
from .write_offload import Payload, PendingWrite, Placed


class ReplicatedLog(Protocol):
    """What ReplicaWrites needs of its log (PartitionLog): its files, segments, offsets
    and producer state under the log's locks, and its write path with offsets kept."""
    directory: Path
    fs: FileSystem
    io_lock: threading.RLock
    state_lock: threading.Lock
    segments: list[Segment]
    bases: list[int]
    producers: ProducerStateManager
    epochs: LeaderEpochCache
    log_start_offset: int
    log_end_offset: int
    flushed_offset: int

    @property
    def replicated_hw(self) -> int | None: ...

    def set_high_watermark(self, hw: int | None) -> None: ...

    def settle(self) -> None: ...

    def check_writable(self) -> None: ...

    def size_bytes(self) -> int: ...

    def install_segments(self, segs: list[Segment]) -> None: ...

    def offline(self, reason: str) -> StorageError: ...

    def flush_locked(self, *, force_checkpoint: bool = False, clean: bool = False, strict: bool = False) -> int: ...

    def write_batches(self, data: Payload, batches: list[tuple[int, BatchHeader]],
                      on_success: Callable[[list[Placed]], None] | None = None, assign: bool = True) -> AppendInfo: ...

    def prepare_write(self, data: Payload, batches: list[tuple[int, BatchHeader]],
                      on_success: Callable[[list[Placed]], None] | None, assign: bool) -> PendingWrite: ...

    def write_in_thread(self, w: PendingWrite) -> Awaitable[AppendInfo]: ...


class ReplicaWrites:
    """A follower's writes to its log."""

    def __init__(self, log: ReplicatedLog) -> None:
        self._log = log

    def append_replicated(self, data: Payload) -> AppendInfo:
        """Follower: append batches fetched from the leader exactly as given (offsets,
        leader epochs, producer ids and sequences kept; control batches included).

        Producer state, the aborted-transaction index and the leader-epoch cache are
        built as on the leader, so this replica can take over: deduplicate a retry,
        keep the LSO and answer read_committed fetches. The first batch must start at
        the log end and offsets must be contiguous (AppendError otherwise).
        """
        batches = self._admit_replicated(data)
        return self._log.write_batches(data, batches, on_success=lambda placed: self._apply_replicated(data, placed),
                           assign=False)

    def append_replicated_begin(self, data: Payload) -> Awaitable[AppendInfo]:
        """append_replicated with its pwrite in a worker thread (a large fetch: the
        follower's event loop stays free). Everything up to the pwrite happens in this
        call, before it returns, so a caller that checked its role just before knows
        the write belongs to that role. Returns an awaitable of the AppendInfo.

        The log end, producer state and indexes move only when the write has finished
        (as append_async), so the log end a follower reports in its next fetch counts
        only written bytes; a truncation, reset, close or role change meanwhile first
        waits for the write and applies it (settle), so no write lands past a
        truncation point. Raises AppendError / StorageError like append_replicated."""
        batches = self._admit_replicated(data)      # settles an earlier pending write first
        w = self._log.prepare_write(data, batches, lambda placed: self._apply_replicated(data, placed), assign=False)
        return self._log.write_in_thread(w)

    def _admit_replicated(self, data: Payload) -> list[tuple[int, BatchHeader]]:
        """append_replicated's checks, and the leader epochs of its batches recorded."""
        self._log.check_writable()
        batches, err = split_batches(data)
        if err is not KafkaError.NONE:
            raise AppendError(err, f"replicated batches for {self._log.directory} do not parse: {err.name}")
        first = batches[0][1]
        if first.base_offset < self._log.log_end_offset <= first.last_offset and self._log.size_bytes() == 0:
            self._rebase_empty(first.base_offset)    # after reset_to: the leader's first batch straddles its start
        expect = self._log.log_end_offset
        for _, hdr in batches:
            if hdr.base_offset != expect:
                raise AppendError(KafkaError.OFFSET_OUT_OF_RANGE,
                                  f"{self._log.directory}: replicated batch at {hdr.base_offset}, log end {expect}")
            expect = hdr.next_offset
        try:
            for _, hdr in batches:   # before the data: a cache entry past the log end is cut at open
                self._log.epochs.assign(hdr.leader_epoch, hdr.base_offset)
        except OSError as exc:
            raise StorageError(f"{self._log.directory}: cannot write the leader-epoch cache: {exc}") from exc
        return batches

    def reset_to(self, offset: int) -> None:
        """Follower: the leader's log now starts past this replica's end (retention or
        DeleteRecords while it was away), so nothing here can be continued: drop every
        record and start empty at `offset`. Producer state and epochs go too (the
        leader's batches from `offset` on rebuild what is still relevant)."""
        self._log.settle()   # first: a roll in a worker thread waits for io_lock
        with self._log.io_lock:
            self._log.check_writable()
            if offset <= self._log.log_end_offset:
                raise ValueError(f"reset_to({offset}) on a log ending at {self._log.log_end_offset}")
            new = Segment(self._log.fs, self._log.directory, offset)
            try:
                # New segment first: a crash before the old ones are gone leaves a gap that
                # the next open cuts at, which drops the new segment, not the old data.
                new.create_files()
                self._log.fs.fsync_dir(self._log.directory)
                with self._log.state_lock:
                    doomed = self._log.segments
                    self._log.install_segments([new])
                    self._log.log_start_offset = self._log.flushed_offset = offset
                    self._log.producers = ProducerStateManager()
                for seg in doomed:
                    seg.delete_files()
                prune_snapshots(self._log.fs, self._log.directory, keep=0)
                self._log.epochs.truncate_from_end(0)
                self._log.flush_locked(force_checkpoint=True, strict=True)
            except OSError as exc:
                raise self._log.offline(f"reset to {offset} failed: {exc}") from exc
            if self._log.replicated_hw is not None:
                self._log.set_high_watermark(offset)

    def _rebase_empty(self, base: int) -> None:
        """An empty log (just reset) starts its segment at `base` instead, below its log
        start, so the leader's batch holding the log start can be stored whole; reads
        below the log start stay refused, as on the leader."""
        self._log.settle()   # first: a roll in a worker thread waits for io_lock
        with self._log.io_lock:
            new = Segment(self._log.fs, self._log.directory, base)
            try:
                new.create_files()
                with self._log.state_lock:
                    old = self._log.segments
                    self._log.install_segments([new])
                for seg in old:
                    seg.delete_files()
                self._log.fs.fsync_dir(self._log.directory)
            except OSError as exc:
                raise StorageError(f"{self._log.directory}: cannot start the log at {base}: {exc}") from exc

    def _apply_replicated(self, data: Payload, placed: list[Placed]) -> None:
        for pos, base, hdr in placed:
            if not hdr.is_control:
                self._log.producers.update(hdr, AppendInfo(base, base + hdr.last_offset_delta))
                continue
            kind, coordinator_epoch = read_marker(bytes(data[pos:pos + hdr.size]))
            first = self._log.producers.complete_txn(hdr.producer_id, hdr.producer_epoch, coordinator_epoch,
                                                hdr.max_timestamp)
            if kind == CONTROL_ABORT and first is not None:
                index_abort(self._log.producers, self._log.segments[-1], hdr.producer_id, first, base)

    def truncate_to(self, offset: int) -> int:
        """Follower: cut the log back to `offset` (KIP-101 truncation) and return the new
        log end (the start of the batch holding `offset`, as replicas share batch
        boundaries). Producer state, the aborted-transaction index and the leader-epoch
        cache go back with it. Crash-safe: a crash midway leaves a checkpoint that no
        longer matches the segments, so the next open checks the whole log."""
        self._log.settle()   # first: a roll in a worker thread waits for io_lock
        with self._log.io_lock:
            self._log.check_writable()
            if offset >= self._log.log_end_offset:
                # No record to cut, but an epoch may begin right at the log end (a leader
                # that wrote nothing in it): it is history the new leader does not share.
                try:
                    self._log.epochs.truncate_from_end(offset)
                except OSError as exc:
                    raise StorageError(f"{self._log.directory}: cannot write the leader-epoch cache: {exc}") from exc
                return self._log.log_end_offset
            offset = max(offset, self._log.log_start_offset)
            i = max(0, bisect_right(self._log.bases, offset) - 1)
            try:
                with self._log.state_lock:
                    doomed = self._log.segments[i + 1:]
                    del self._log.segments[i + 1:]
                    del self._log.bases[i + 1:]
                    seg = self._log.segments[i]
                    seg.truncate_to(offset)
                    self._log.log_end_offset = seg.next_offset
                    self._log.log_start_offset = min(self._log.log_start_offset, self._log.log_end_offset)
                    self._log.flushed_offset = min(self._log.flushed_offset, self._log.log_end_offset)
                for old in doomed:
                    old.delete_files()
                self._log.fs.fsync(seg.log)
                self._log.flushed_offset = self._log.log_end_offset
                self._log.epochs.truncate_from_end(self._log.log_end_offset)
                with self._log.state_lock:
                    self._log.producers = replay_producers(self._log.fs, self._log.directory, self._log.segments,
                                                           self._log.log_end_offset)
                self._log.flush_locked(force_checkpoint=True, strict=True)
            except OSError as exc:
                raise self._log.offline(f"truncation to {offset} failed: {exc}") from exc
            hw = self._log.replicated_hw
            if hw is not None:
                self._log.set_high_watermark(min(hw, self._log.log_end_offset))
            return self._log.log_end_offset
