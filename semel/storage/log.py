"""A partition log: an ordered list of segments with append, read, flush and compaction support.

PartitionLog is the public face of the storage layer. It owns the segments, the
offsets, the producer state and the two locks, and composes parts named after their
jobs, each given what it works on when it is made:
- log_loader.LogLoader: open-time recovery (checkpoint, CRC scan, producer replay),
  given the files and settings; it returns the recovered segments and producer state;
- write_offload.WriteOffload: the file work handed to threads (the write or roll a
  worker holds, the background checkpoint), given this log as an OffloadedLog;
- replica_writes.ReplicaWrites: a follower's appends, truncation and reset;
  retention.Retention: deleting old segments (retention, DeleteRecords);
  log_reader.LogReader: reads by offset and timestamp, aborted transactions;
  log_markers.MarkerAppends: transaction markers; segment_rolls.SegmentRolls: when
  and how the active segment rolls; segment_rewrites.SegmentRewrites (`rewrites`):
  what compaction reads and rewrites; each given this log through the narrow
  Protocol it declares;
- log_checkpoints.RecoveryCheckpoints (`checkpoints`): when a recovery checkpoint is
  due and writing one, given the files and settings;
- fsync_repair.FsyncRepair (`fsync_repair`): what a failed fsync leaves trusted;
- log_config.LogConfig: the settings.
This module keeps the rest: appending (on the loop, or append_async), flushing, the
role in a cluster (set_leader_epoch, set_follower, set_high_watermark: the replica
manager's only way in), close. Its members without a leading underscore that layers above
have no use for (segments, bases, the locks, flush_locked...) are what the parts' Protocols name.

Promises (each has a test under tests/unit/storage):
- append is all-or-nothing. On any disk error the active segment is cut back to
  its previous size, memory is left untouched and StorageError is raised.
- flushed_offset only moves after an fsync succeeded, never past a failed one;
  everything below it survives a crash. On a single node under flush_mode "always"
  the tail past it is cut back before the next write after a failed fsync (fsync_repair).
- open() recovers what a crash left (see log_loader).
- Idempotence and transactions: every batch with a producer id is checked before
  anything is written (ProducerStateError on a sequence/epoch violation; a retry
  gets the original offsets back). Markers end transactions, aborts go to the
  segment's aborted-transaction index, and the LSO is the start of the earliest
  open transaction. A checkpoint also saves a producer-state snapshot, and open()
  replays batch headers from it, so retries are still recognised after a restart.

Threads: all mutating calls (append, roll, retention, close) come from one thread
(the broker's event loop). flush() may run in a worker thread at the same time
(group commit). Two locks make that safe: `io_lock` serialises everything that
fsyncs or writes index/checkpoint files, `state_lock` makes the flusher see the end of
the log, the active segment and the index arrays as one consistent picture.
Lock order is always io_lock, then state_lock. Writes and rolls handed to worker
threads, and the settling every mutator does first, are in write_offload.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from pathlib import Path

from semel.protocol.errors import KafkaError
from semel.protocol.records import (
    BatchHeader, set_base_offset,
    set_leader_epoch,
)

from .errors import AppendError, OffsetOutOfRange, ProducerStateError, StorageError
from .fs import FileSystem
from .fsync_repair import FsyncRepair
from .leader_epoch import LeaderEpochCache
from .log_config import LogConfig
from .log_checkpoints import RecoveryCheckpoints
from .log_markers import MarkerAppends
from .log_reader import LogReader
from .log_loader import LogLoader, RecoveryInfo
from .producer_state import ProducerStateManager
from .replica_writes import ReplicaWrites
from .retention import Retention
from .segment import LOG_SUFFIX, Segment
from .segment_rolls import SegmentRolls
from .segment_rewrites import SegmentRewrites
from .types import AppendInfo
from .write_offload import (
    OFFLOOP_WRITE_BYTES, WRITERS, Payload, PendingWrite, Placed, WriteOffload, check_layout, run_precheck,
)

__all__ = ["LogConfig", "PartitionLog", "AppendInfo", "RecoveryInfo", "StorageError", "OffsetOutOfRange",
           "AppendError", "ProducerStateError", "OFFLOOP_WRITE_BYTES"]

log = logging.getLogger("semel.storage")


Batches = list[tuple[int, BatchHeader]]   # (position in the payload, header), as split_batches gives


class PartitionLog:
    """Use PartitionLog.open(); see the module docstring for the threading rules."""

    def __init__(self, directory: Path, config: LogConfig, fs: FileSystem, runner: Executor | None = None):
        self.directory = Path(directory)
        self.config = config
        self.fs = fs
        self.segments: list[Segment] = []      # the last one is active
        self.bases: list[int] = []             # their base offsets, for bisect
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.flushed_offset = 0
        # Under flush_mode "always" a broker counts only fsynced records as its own
        # (`durable_end`), alone or in an ISR: a record read before its fsync could be
        # gone after a power cut, and a reader that committed an offset past it would
        # find that offset past the log end.
        self.reads_wait_for_fsync = False
        self.recovery = RecoveryInfo()
        self.producers = ProducerStateManager()
        self.state_lock = threading.Lock()
        self.io_lock = threading.RLock()
        self._closed = False
        self._failed: str | None = None
        # Writes and fsyncs of this log that failed (any thread): what a cluster member
        # watches to stop serving a partition its disk cannot keep (semel.cluster.offline).
        self.storage_failures = 0
        self.fsync_failures = 0   # of these, the fsyncs: what the flusher's waiters count
        self.fsync_repair = FsyncRepair(self)
        self.checkpoints = RecoveryCheckpoints(self.fs, self.directory, config)
        # The role in a cluster, changed only through the "role" methods below. Leader
        # epoch and high watermark stay None on a single-node broker, where batches keep
        # the leader epoch their producer wrote and the high watermark is the log end.
        self.epochs: LeaderEpochCache   # loaded by open()
        self._leader_epoch: int | None = None
        self._replicated_hw: int | None = None
        self._is_follower = False
        # append_async: one write at a time in a worker thread; memory follows in settle.
        self._offload = WriteOffload(self, runner or WRITERS)
        self._replica = ReplicaWrites(self)
        self._retention = Retention(self)
        # What compaction reads and rewrites (storage.compaction).
        self.rewrites = SegmentRewrites(self)
        self._reader = LogReader(self)
        self._markers = MarkerAppends(self)
        self._rolls = SegmentRolls(self)

    def offline(self, reason: str) -> StorageError:
        """Take this log offline (a write it could not undo, a failed truncation or
        rewrite): every later write is refused until it is reopened. Returns the error
        to raise."""
        self._failed = reason
        return StorageError(f"{self.directory}: {reason}")

    @property
    def failed_reason(self) -> str | None:
        """Why this log took itself offline (a write it could not undo, a failed
        truncation or rewrite), None while it is usable."""
        return self._failed

    # ================================================================ opening & recovery
    @classmethod
    def open(cls, directory: Path, config: LogConfig, fs: FileSystem | None = None,
             runner: Executor | None = None) -> "PartitionLog":
        """Open the log in directory, creating it or recovering it as needed. `runner`
        (an Executor) runs the file work this log hands to threads; a shared pool if None."""
        config.validate()
        plog = cls(directory, config, fs or FileSystem(), runner)
        started = time.perf_counter()
        loader = LogLoader(plog.fs, plog.directory, config)
        plog.recovery = loader.recovery
        try:
            loaded = loader.load()
            plog.install_segments(loaded.segments)
            plog.log_start_offset = loaded.log_start_offset
            plog.producers = loaded.producers
            plog.flushed_offset = plog.log_end_offset
            if not loaded.clean:   # the checkpoint that vouches for the checked tail
                plog.flush_locked(force_checkpoint=True, strict=True)
            plog.epochs = LeaderEpochCache.load(plog.fs, plog.directory)
            plog.epochs.truncate_from_end(plog.log_end_offset)   # epochs of a tail recovery cut
        except OSError as exc:
            plog._release_files()
            raise StorageError(f"cannot open log {directory}: {exc}") from exc
        plog.recovery.seconds = time.perf_counter() - started
        return plog

    def install_segments(self, segs: list[Segment]) -> None:
        """Make `segs` the log (the last one active); the log end is where it ends."""
        self.segments = segs
        self.bases = [s.base for s in segs]
        self.log_end_offset = segs[-1].next_offset

    # ================================================================ appending
    def append(self, data: Payload, batches: Batches) -> AppendInfo:
        """Append a produce payload already validated by split_batches (positions + headers).

        Offsets are assigned here. Raises AppendError (bad layout), StorageError (disk).
        A writable memoryview is taken over: its batches' offsets are patched in place.
        """
        duplicate = self._admit(data, batches)
        if duplicate is not None:
            return duplicate          # a retry of batches already stored: nothing is written
        return self.write_batches(data, batches, on_success=self._apply_data)

    async def append_async(self, data: Payload, batches: Batches, precheck: Callable[[], KafkaError] | None = None,
                           sync: bool = False, on_loop: bool = False) -> AppendInfo:
        """append() for the event loop, with a large payload's pwrite in a worker thread
        (see write_offload).

        Appends through here are serialised per log (an asyncio lock, FIFO), and every
        check runs after the lock is taken and before anything is written, with
        nothing awaited in between: `precheck()` (returns a KafkaError; the caller's
        checks of state that can change while it waits, e.g. the transaction), the
        producer-state checks, the offsets. Only the pwrite is awaited.
        sync=True (acks=all under flush_mode "always"): a write that goes to a worker
        thread is fsynced by the same thread right after its pwrite (write-through),
        so flushed_offset covers it when this returns and the caller needs no group-
        commit round: one thread hand-off per request instead of two. A small write
        on the loop, or a failed fsync, leaves it to the flusher as before.
        on_loop=True: write on the loop whatever the size (the caller bounds how much:
        a Produce naming several partitions, whose fsyncs then go to the flusher's
        per-log rounds). Memory (log end, indexes, producer state) moves when the write
        has finished, so readers and the flusher never see bytes that are not in the
        file; a synchronous mutator that comes meanwhile (a marker, retention, close)
        first waits for the write and settles it (check_writable), so log order is
        call order.
        """
        offload = self._offload
        lock = offload.append_lock
        if ((on_loop or len(data) < OFFLOOP_WRITE_BYTES) and not lock.locked()
                and not self._rolls.due(len(data), batches)):
            run_precheck(precheck)
            return self.append(data, batches)
        async with lock:
            if self._rolls.due(len(data), batches):
                self.check_writable()
                self.check_leading()
                await offload.roll_in_thread(self.log_end_offset)
            # Every check from here to the write runs without an await in between.
            run_precheck(precheck)
            duplicate = self._admit(data, batches)
            if duplicate is not None:
                return duplicate
            w = self.prepare_write(data, batches, self._apply_data, assign=True)
            return await self.write_in_thread(w, sync)

    def write_in_thread(self, w: PendingWrite, sync: bool = False) -> Awaitable[AppendInfo]:
        """Hand w's pwrite (with sync its fsync too) to a worker thread now; the awaitable
        settles it (WriteOffload)."""
        self._offload.submit_write(w, sync)
        return self._offload.write_in_thread(w)

    @property
    def write_pending(self) -> bool:
        """A write handed to a worker thread has not been applied to memory yet."""
        return self._offload.pending is not None

    def settle(self) -> None:
        """Wait for a write or roll handed to a worker thread and apply it to memory.
        Every mutator calls this first, and so does a role change: the log end it starts
        from must count that write."""
        self._offload.settle()

    def _admit(self, data: Payload, batches: Batches) -> AppendInfo | None:
        """The checks before a produce payload is written; the original offsets when it
        is a retry of batches already stored. Raises AppendError."""
        self.check_writable()
        self.check_leading()
        check_layout(data, batches)
        err, duplicate = self.producers.check_batches([h for _, h in batches])
        if err is not KafkaError.NONE:
            raise ProducerStateError(err, f"{err.name} for {self.directory}")
        if duplicate is not None:
            duplicate.fsync_stamp = self.fsync_repair.stamp()
        return duplicate

    def _apply_data(self, placed: list[Placed]) -> None:
        for _, base, hdr in placed:
            self.producers.update(hdr, AppendInfo(base, base + hdr.last_offset_delta))

    def append_control(self, kind: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                       *, timestamp_ms: int | None = None) -> AppendInfo:
        """Write a COMMIT (1) or ABORT (0) marker for producer_id and end its transaction
        here (MarkerAppends.append_controls of one producer)."""
        return self._markers.append_controls(kind, [(producer_id, producer_epoch)], coordinator_epoch,
                                             timestamp_ms=timestamp_ms)

    def append_controls(self, kind: int, producers: list[tuple[int, int]], coordinator_epoch: int,
                        *, timestamp_ms: int | None = None) -> AppendInfo:
        return self._markers.append_controls(kind, producers, coordinator_epoch, timestamp_ms=timestamp_ms)

    append_controls.__doc__ = MarkerAppends.append_controls.__doc__

    def write_batches(self, data: Payload, batches: Batches,
                      on_success: Callable[[list[Placed]], None] | None = None, assign: bool = True) -> AppendInfo:
        """Assign offsets (unless replicating: assign=False keeps them), stamp the leader
        epoch when leading, roll if needed, write with one pwrite, then update memory."""
        w = self.prepare_write(data, batches, on_success, assign)
        try:
            self.fs.pwrite(w.seg.log, w.buf, w.start)
        except OSError as exc:
            return self.finish_write(w, exc)
        return self.finish_write(w, None)

    def prepare_write(self, data: Payload, batches: Batches, on_success: Callable[[list[Placed]], None] | None,
                      assign: bool) -> PendingWrite:
        """Everything before the pwrite: offsets, leader epoch, roll, the patched bytes."""
        if self._offload.busy:
            # Placed from a log end that does not count the pending work, this write would
            # land over it, and the pending slot (what every mutator waits for) would lose it.
            raise RuntimeError(f"{self.directory}: a write prepared while a worker's write or roll is pending")
        first = self.log_end_offset
        epoch = self._leader_epoch if assign else None
        if epoch is not None:
            try:   # before the data: a cache entry past the log end is cut at open
                self.epochs.assign(epoch, first)
            except OSError as exc:
                raise StorageError(f"{self.directory}: cannot write the leader-epoch cache: {exc}") from exc
        if self._rolls.due(len(data), batches):
            self.roll(first)
        seg = self.segments[-1]
        # A follower writes the leader's bytes untouched. A leader patches offsets (and
        # epochs) in a writable view in place: the produce path hands over views of
        # the request frame it owns (protocol.produce_request); anything else is copied.
        placed: list[Placed] = []
        offset = first
        for pos, hdr in batches:
            placed.append((pos, offset, hdr))
            offset += hdr.last_offset_delta + 1
        buf: Payload = data
        if assign:
            patched = data if isinstance(data, memoryview) and not data.readonly else bytearray(data)
            for pos, base, _ in placed:
                set_base_offset(patched, pos, base)
                if epoch is not None:
                    set_leader_epoch(patched, pos, epoch)
            buf = patched
        return PendingWrite(seg, seg.size, buf, placed, first, offset, on_success, self.fsync_repair.stamp())

    def finish_write(self, w: PendingWrite, failure: BaseException | None) -> AppendInfo:
        """After the pwrite: cut a failed one back, else account for the batches."""
        seg = w.seg
        if failure is not None:
            self.storage_failures += 1
            self._undo_write(seg, w.start)
            raise StorageError(f"write to {seg.path(LOG_SUFFIX)} failed: {failure}") from failure
        interval = self.config.index_interval_bytes
        with self.state_lock:
            for pos, base, hdr in w.placed:
                seg.note_batch(w.start + pos, base, hdr, interval)
            self.log_end_offset = w.end
            self.checkpoints.note_appended(len(w.buf))
            if w.on_success is not None:
                w.on_success(w.placed)
        if w.synced:
            self._note_synced(w.end)
        return AppendInfo(w.first, w.end - 1, -1, fsync_stamp=w.stamp)

    def _note_synced(self, end: int) -> None:
        """A write-through fsync covered the active segment up to `end`: every earlier
        write to it went before (appends are serialised) and older segments were
        fsynced at their roll. A recovery checkpoint that has come due is written by a
        worker thread."""
        self.fsync_repair.advance(end)
        if self.checkpoints.due():
            self._offload.checkpoint_soon()

    def _undo_write(self, seg: Segment, size: int) -> None:
        try:
            self.fs.truncate(seg.log, size)
        except OSError as exc:
            # The file may now hold part of a request that was refused. Take the log
            # offline: recovery at the next open cuts whatever does not check out.
            self._failed = f"could not undo a failed write ({exc}); reopen the log to recover"
            log.error("%s: %s", self.directory, self._failed)

    def roll(self, new_base: int, close_old: bool = True) -> Segment:
        return self._rolls.roll(new_base, close_old)

    roll.__doc__ = SegmentRolls.roll.__doc__

    # ================================================================ role (set by the replica manager)
    @property
    def leader_epoch(self) -> int | None:
        """The epoch stamped on appended batches while this broker leads; None otherwise."""
        return self._leader_epoch

    def set_leader_epoch(self, epoch: int | None) -> None:
        self._leader_epoch = epoch

    def set_follower(self, follower: bool) -> None:
        """A follower's log takes only append_replicated (others: AppendError
        NOT_LEADER_OR_FOLLOWER): a local write, a coordinator's marker or a stray produce,
        would fork it from its leader's."""
        self._is_follower = follower

    @property
    def replicated_hw(self) -> int | None:
        """The high watermark the replica manager keeps; None: the log end is."""
        return self._replicated_hw

    def set_high_watermark(self, hw: int | None) -> None:
        """What the ISR holds, kept by the replica manager (None: alone, the log end).
        Never read past the log end: high_watermark caps it."""
        self._replicated_hw = hw

    # ================================================================ a follower's writes (replica_writes)
    def append_replicated(self, data: Payload) -> AppendInfo:
        return self._replica.append_replicated(data)

    def append_replicated_begin(self, data: Payload) -> Awaitable[AppendInfo]:
        return self._replica.append_replicated_begin(data)

    def truncate_to(self, offset: int) -> int:
        return self._replica.truncate_to(offset)

    def reset_to(self, offset: int) -> None:
        self._replica.reset_to(offset)

    append_replicated.__doc__ = ReplicaWrites.append_replicated.__doc__
    append_replicated_begin.__doc__ = ReplicaWrites.append_replicated_begin.__doc__
    truncate_to.__doc__ = ReplicaWrites.truncate_to.__doc__
    reset_to.__doc__ = ReplicaWrites.reset_to.__doc__

    # ================================================================ deleting old data (retention)
    def enforce_retention(self, now_ms: int) -> int:
        return self._retention.enforce_retention(now_ms)

    def delete_segments_before(self, offset: int) -> int:
        return self._retention.delete_segments_before(offset)

    def delete_records_before(self, offset: int) -> int:
        return self._retention.delete_records_before(offset)

    enforce_retention.__doc__ = Retention.enforce_retention.__doc__
    delete_segments_before.__doc__ = Retention.delete_segments_before.__doc__
    delete_records_before.__doc__ = Retention.delete_records_before.__doc__

    # ================================================================ reading
    @property
    def durable_end(self) -> int:
        """This replica's own end as a high watermark counts it: its fsynced end when
        reads_wait_for_fsync, else its log end."""
        if self.reads_wait_for_fsync:
            return min(self.flushed_offset, self.log_end_offset)
        return self.log_end_offset

    @property
    def high_watermark(self) -> int:
        """What the ISR holds (never past the log end); alone in it, as on a single node,
        its own `durable_end`."""
        hw = self._replicated_hw
        if hw is not None:
            return min(hw, self.log_end_offset)
        return self.durable_end

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> bytes | memoryview:
        return self._reader.read(offset, max_bytes, upper_bound)

    def read_checked(self, offset: int, max_bytes: int, upper_bound: int | None = None,
                     crc: bool = True) -> bytes | memoryview:
        return self._reader.read_checked(offset, max_bytes, upper_bound, crc)

    def segment_path(self, offset: int) -> str:
        return self._reader.segment_path(offset)

    def offset_for_timestamp(self, ts_ms: int) -> tuple[int, int] | None:
        return self._reader.offset_for_timestamp(ts_ms)

    @property
    def last_stable_offset(self) -> int:
        """First offset of the earliest open transaction, else the high watermark."""
        first = self.producers.first_unstable_offset()
        return self.high_watermark if first is None else min(first, self.high_watermark)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        return self._reader.aborted_transactions(start_offset, end_offset)

    read.__doc__ = LogReader.read.__doc__
    read_checked.__doc__ = LogReader.read_checked.__doc__
    segment_path.__doc__ = LogReader.segment_path.__doc__
    offset_for_timestamp.__doc__ = LogReader.offset_for_timestamp.__doc__
    aborted_transactions.__doc__ = LogReader.aborted_transactions.__doc__

    def expire_producers(self, now_ms: int) -> int:
        """Forget producers idle longer than producer_id_expiration_ms; returns how many."""
        with self.state_lock:
            return self.producers.expire(now_ms, self.config.producer_id_expiration_ms)

    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def segment_bases(self) -> list[int]:
        return list(self.bases)

    # ================================================================ flushing
    def flush(self, *, checkpoint: bool = False, checkpoint_later: bool = False) -> int:
        """fsync everything appended so far (blocking); returns flushed_offset.

        Also persists the recovery checkpoint when one is due (or checkpoint=True);
        with checkpoint_later a due one is left to a background job instead
        (WriteOffload.checkpoint_soon): a group-commit round answers its waiters after
        its fsync, not after the three more fsyncs a checkpoint costs.
        May run in a worker thread while the owner thread keeps appending.
        """
        with self.io_lock:
            self.check_readable()
            flushed = self.flush_locked(force_checkpoint=checkpoint, due=not checkpoint_later)
        if checkpoint_later and self.checkpoints.due():
            self._offload.checkpoint_soon()
        return flushed

    def flush_locked(self, *, force_checkpoint: bool = False, clean: bool = False, strict: bool = False,
                     due: bool = True) -> int:
        """flush() under io_lock; `due`: also write a checkpoint that has come due. An
        untrusted tail (fsync_repair) is neither fsynced nor checkpointed: StorageError."""
        if not self.fsync_repair.trusted:
            raise StorageError(f"{self.directory}: an fsync failed; the tail is cut back at the next write")
        due = force_checkpoint or (due and self.checkpoints.due())
        with self.state_lock:
            seg = self.segments[-1]
            leo = self.log_end_offset
            state = self.checkpoints.capture(seg, leo, clean, self.log_start_offset, self.producers) if due else None
        if leo > self.flushed_offset:
            try:
                self.fs.fsync(seg.log)
            except OSError as exc:
                self.storage_failures += 1
                self.fsync_repair.failed()
                raise StorageError(f"fsync of {seg.path(LOG_SUFFIX)} failed: {exc}") from exc
            self.fsync_repair.advance(leo)   # a write-through append may have moved it past leo
        if state is not None:
            self.checkpoints.write(seg, state, strict)
        return self.flushed_offset

    # ================================================================ lifecycle
    def close(self) -> None:
        """Flush, write a clean checkpoint, release files. Idempotent."""
        self.settle()      # never release a file a worker thread is writing
        with self.io_lock:
            if self._closed:
                return
            try:
                if self._failed is None:
                    self.fsync_repair.run()   # an untrusted tail is cut, not vouched for
                    self.segments[-1].seal_time_index()
                    self.flush_locked(force_checkpoint=True, clean=True, strict=True)
            finally:
                self._release_files()
                self._closed = True

    def abandon(self) -> None:
        """Release the files without writing anything, as if the process had died
        (for crash tests and benchmarks)."""
        self.settle()      # never release a file a worker thread is writing
        with self.io_lock:
            self._release_files()
            self._closed = True

    def delete(self) -> None:
        """Remove the log and its directory."""
        self.settle()      # never release a file a worker thread is writing
        with self.io_lock:
            self._release_files()
            self._closed = True
            try:
                if self.fs.exists(self.directory):
                    self.fs.rmtree(self.directory)
            except OSError as exc:
                raise StorageError(f"cannot delete {self.directory}: {exc}") from exc

    def _release_files(self) -> None:
        for seg in self.segments:
            try:
                seg.close()
            except OSError:
                pass

    def check_readable(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.directory} is closed")

    def check_leading(self) -> None:
        if self._is_follower:
            raise AppendError(KafkaError.NOT_LEADER_OR_FOLLOWER, f"{self.directory} is a follower's replica")

    def check_writable(self) -> None:
        self.settle()      # a write in a worker thread lands first: log order = call order
        self.check_readable()
        if self._failed is not None:
            raise StorageError(f"log {self.directory} is offline: {self._failed}")
        self.fsync_repair.run()

    @property
    def standalone(self) -> bool:
        """No role in a cluster (a single node): no leader epoch, high watermark or follower."""
        return self._leader_epoch is None and self._replicated_hw is None and not self._is_follower

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (f"PartitionLog({str(self.directory)!r}, start={self.log_start_offset}, "
                f"end={self.log_end_offset}, flushed={self.flushed_offset}, segments={len(self.segments)})")
