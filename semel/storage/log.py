"""A partition log: an ordered list of segments with append, read, flush, recovery, retention.

Promises (each has a test under tests/unit/storage):
- append is all-or-nothing. On any disk error the active segment is cut back to
  its previous size, memory is left untouched and StorageError is raised.
- flushed_offset only moves after an fsync succeeded; everything below it
  survives a crash.
- open() trusts what the recovery-point checkpoint says is on disk and checks only
  the bytes after it (structure, offset continuity, CRC-32C), cutting the log at
  the first torn or corrupt batch. A clean close leaves nothing to check.
- Idempotence and transactions: every batch with a producer id is checked before
  anything is written (ProducerStateError on a sequence/epoch violation; a retry
  gets the original offsets back). Markers end transactions, aborts go to the
  segment's aborted-transaction index, and the LSO is the start of the earliest
  open transaction. A checkpoint also saves a producer-state snapshot, and open()
  replays batch headers from it, so retries are still recognised after a restart.

Threads: all mutating calls (append, roll, retention, close) come from one thread
(the broker's event loop). flush() may run in a worker thread at the same time
(group commit). Two locks make that safe: `_io_lock` serialises everything that
fsyncs or writes index/checkpoint files, `_lock` makes the flusher see the end of
the log, the active segment and the index arrays as one consistent picture.
Lock order is always _io_lock, then _lock.
append_async hands a large append's pwrite to a worker thread; memory follows only
when the write is done, and every synchronous mutator settles such a write first:
each path that moves the file position or the log end (an append, truncation, reset,
retention, a role change's settle(), close) waits for the write or roll a worker
holds, even one whose thread has not started, before it touches anything, so no
write of an earlier role or past a truncation point can land later. All this work
goes through the log's `runner` (a test can order it step by step).
With sync=True that thread also fsyncs the segment after its pwrite (write-through:
one hand-off per acks=all request instead of two); settling then moves
flushed_offset, and a recovery checkpoint that came due is written by a background
job under _io_lock like any flush.
It also rolls a full segment in a worker thread (the old segment's fsync, its
indexes, the new files, the directory fsync, the checkpoint), under the same
append lock and settled the same way; the loop closes the old file afterwards,
since a fetch on the loop may be reading it.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import ThreadPoolExecutor
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from pathlib import Path

from semel.protocol.errors import KafkaError
from semel.protocol.records import (
    CONTROL_ABORT, CONTROL_COMMIT, BatchHeader, build_control_batch, iter_batches, iter_records, set_base_offset,
    set_leader_epoch, split_batches, verified_prefix,
)

from . import checkpoint as cpfile
from .errors import AppendError, CorruptLogError, OffsetOutOfRange, ProducerStateError, StorageError
from .fs import FileSystem
from .leader_epoch import LeaderEpochCache
from .producer_state import ProducerStateManager, load_latest_snapshot, prune_snapshots, write_snapshot
from .segment import (
    INDEX_SUFFIX, INDEX_SUFFIXES, LOG_SUFFIX, MAX_RELATIVE_OFFSET, TIMEINDEX_SUFFIX, Segment, parse_segment_file,
    scan_valid, segment_name,
)
from .txn_index import AbortedTxn
from .types import AppendInfo

__all__ = ["LogConfig", "PartitionLog", "AppendInfo", "RecoveryInfo", "StorageError", "OffsetOutOfRange",
           "AppendError", "ProducerStateError"]

log = logging.getLogger("semel.storage")

FLUSH_MODES = ("always", "interval", "never")
# append_async writes payloads of at least this size in a worker thread: a pwrite can
# wait for an fsync of the same file (ext4 stable pages; 1 MiB writes beside an fsync
# loop measured p99 9 ms, max 23 ms here), and on the event loop that stalls every
# connection. Smaller ones cost less to write than to hand to a thread.
OFFLOOP_WRITE_BYTES = 64 * 1024
# Every piece of file work a log hands to a thread goes through its `runner` (this
# pool unless open() is given another): the seam through which tests order a worker's
# write, roll or checkpoint against the loop's steps.
_WRITERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="semel-pwrite")
_DAY_MS = 24 * 3600 * 1000


@dataclass
class LogConfig:
    segment_bytes: int = 128 * 1024 * 1024
    index_interval_bytes: int = 4096
    retention_bytes: int = -1                  # -1 = unlimited, per partition
    retention_ms: int = 7 * _DAY_MS            # -1 = unlimited
    flush_mode: str = "always"                 # "always": acks=all waits for fsync; "interval"; "never"
    flush_interval_ms: int = 1000
    # The recovery checkpoint costs fsyncs, so a flush writes it only this often; a
    # restart re-checks at most about this much data (plus what was never flushed).
    # Each one writes the indexes, a producer snapshot and the checkpoint file with
    # three fsyncs: at 16 MiB that was 0.3 s of broker CPU per GB produced here (issue
    # 11); 64 MiB re-checks in well under a second at CRC-32C speed.
    checkpoint_interval_bytes: int = 64 * 1024 * 1024
    checkpoint_interval_ms: int = 10_000
    producer_id_expiration_ms: int = 7 * _DAY_MS

    def validate(self) -> "LogConfig":
        """Raise ValueError naming the first bad field; return self."""
        checks = [
            ("segment_bytes", 61 <= self.segment_bytes <= 2**31 - 1, "must be in [61, 2^31-1]"),
            ("index_interval_bytes", self.index_interval_bytes >= 0, "must be >= 0"),
            ("retention_bytes", self.retention_bytes >= -1, "must be >= -1"),
            ("retention_ms", self.retention_ms >= -1, "must be >= -1"),
            ("flush_mode", self.flush_mode in FLUSH_MODES, f"must be one of {FLUSH_MODES}"),
            ("flush_interval_ms", self.flush_interval_ms >= 1, "must be >= 1"),
            ("checkpoint_interval_bytes", self.checkpoint_interval_bytes >= 0, "must be >= 0"),
            ("checkpoint_interval_ms", self.checkpoint_interval_ms >= 0, "must be >= 0"),
            ("producer_id_expiration_ms", self.producer_id_expiration_ms >= 1, "must be >= 1"),
        ]
        for name, ok, why in checks:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, str if name == "flush_mode" else int):
                raise ValueError(f"LogConfig.{name}: wrong type {type(value).__name__}")
            if not ok:
                raise ValueError(f"LogConfig.{name}={value!r}: {why}")
        return self

    def with_overrides(self, **changes) -> "LogConfig":
        return replace(self, **changes).validate()


@dataclass
class RecoveryInfo:
    """What open() had to do; tests and benchmarks read it."""
    used_checkpoint: bool = False
    clean: bool = False
    scanned_bytes: int = 0            # bytes whose batches were walked
    crc_checked_bytes: int = 0        # of which CRC-checked (after the recovery point)
    truncated_bytes: int = 0          # torn/corrupt tail removed
    segments_removed: list[int] = field(default_factory=list)
    seconds: float = 0.0


class PartitionLog:
    """Use PartitionLog.open(); see the module docstring for the threading rules."""

    def __init__(self, directory: Path, config: LogConfig, fs: FileSystem, runner=None):
        self.directory = Path(directory)
        self.config = config
        self.fs = fs
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._reported_damage: set[tuple[str, int]] = set()   # (file, offset) already logged
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.flushed_offset = 0
        self.recovery = RecoveryInfo()
        self.producers = ProducerStateManager()
        self._lock = threading.Lock()
        self._io_lock = threading.RLock()
        self._closed = False
        self._failed: str | None = None
        self._bytes_since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self.last_checkpoint_error: OSError | None = None
        # Replication (issue 13); both stay None on a single-node broker, where batches
        # keep the leader epoch their producer wrote and the high watermark is the log end.
        self.epochs: LeaderEpochCache | None = None   # loaded by open()
        self.leader_epoch: int | None = None   # set while this broker leads the partition
        self.replicated_hw: int | None = None  # set by the replica manager
        # A follower's log takes only what append_replicated brings from the leader:
        # a local write (a coordinator's marker, a stray produce) would fork it.
        self.is_follower = False
        # append_async: one write at a time in a worker thread; memory follows in settle.
        self._append_lock: asyncio.Lock | None = None
        self._pending: _PendingWrite | None = None
        self._pending_roll = None    # concurrent.futures.Future of a roll in a worker thread
        self._checkpoint_job = None   # concurrent.futures.Future of a background checkpoint (_note_synced)
        # Runs the work above in a worker thread: submit(fn, *args) -> concurrent.futures.Future.
        self._runner = runner or _WRITERS

    # ================================================================ opening & recovery
    @classmethod
    def open(cls, directory: Path, config: LogConfig, fs: FileSystem | None = None, runner=None
             ) -> "PartitionLog":
        """Open the log in directory, creating it or recovering it as needed. `runner`
        (an Executor) runs the file work this log hands to threads; a shared pool if None."""
        config.validate()
        plog = cls(directory, config, fs or FileSystem(), runner)
        started = time.perf_counter()
        try:
            plog._load()
            plog.epochs = LeaderEpochCache.load(plog.fs, plog.directory)
            plog.epochs.truncate_from_end(plog.log_end_offset)   # epochs of a tail recovery cut
        except OSError as exc:
            plog._release_files()
            raise StorageError(f"cannot open log {directory}: {exc}") from exc
        plog.recovery.seconds = time.perf_counter() - started
        return plog

    def _load(self) -> None:
        fs, d = self.fs, self.directory
        fs.makedirs(d)
        names = fs.listdir(d)
        bases = sorted(b for n in names if (b := parse_segment_file(n, LOG_SUFFIX)) is not None)
        self._remove_debris(names, set(bases))
        cp = self._read_checkpoint()
        if not bases:
            self._create_first_segment(cp.log_start_offset if cp else 0)
            return
        segs = [Segment(fs, d, b) for b in bases]
        rec_i, rec_pos, rec_off, from_cp = self._recovery_start(cp, segs)
        r = self.recovery
        r.used_checkpoint = from_cp
        kept = self._scan_segments(segs, rec_i, rec_pos, rec_off, cp if from_cp else None)
        self._install(kept)
        start = cp.log_start_offset if cp else 0
        self.log_start_offset = min(max(start, kept[0].base), self.log_end_offset)
        r.clean = bool(from_cp and cp.clean and r.crc_checked_bytes == 0 and r.truncated_bytes == 0
                       and cp.recovery_offset == self.log_end_offset)
        self._after_recovery(rec_off if from_cp else kept[0].base)
        if r.clean:
            self.flushed_offset = self.log_end_offset
        else:
            self._sync_recovered(kept[min(rec_i, len(kept) - 1):])
        for seg in self._segments[:-1]:
            seg.close()  # reopened on first read; keeps descriptors few

    def _remove_debris(self, names: list[str], bases: set[int]) -> None:
        """Temp files of interrupted atomic writes, and index files whose log is gone
        (a segment deletion that crashed midway)."""
        for n in names:
            if n.endswith(".tmp") or n.endswith(".deleted"):
                self.fs.unlink(self.directory / n)
                continue
            for suffix in INDEX_SUFFIXES:
                b = parse_segment_file(n, suffix)
                if b is not None and b not in bases:
                    self.fs.unlink(self.directory / n)

    def _read_checkpoint(self) -> cpfile.Checkpoint | None:
        path = self.directory / cpfile.FILE_NAME
        try:
            data = self.fs.read_file(path)
        except FileNotFoundError:
            return None
        cp = cpfile.decode(data)
        if cp is None:
            log.warning("%s: recovery checkpoint is damaged; checking the whole log", self.directory)
        return cp

    def _create_first_segment(self, base: int) -> None:
        seg = Segment(self.fs, self.directory, base)
        seg.create_files()
        self.fs.fsync_dir(self.directory)
        self._install([seg])
        self.log_start_offset = base
        self.flushed_offset = base
        self.recovery.clean = True

    def _recovery_start(self, cp: cpfile.Checkpoint | None, segs: list[Segment]
                        ) -> tuple[int, int, int, bool]:
        """(segment index, byte position, offset, from checkpoint?) where CRC checks start."""
        if cp is not None:
            for i, seg in enumerate(segs):
                if seg.base == cp.segment_base:
                    if cp.position <= self.fs.file_size(seg.path(LOG_SUFFIX)):
                        return i, cp.position, cp.recovery_offset, True
                    break
            log.warning("%s: checkpoint does not match the segments; checking the whole log", self.directory)
        return 0, 0, segs[0].base, False

    def _scan_segments(self, segs: list[Segment], rec_i: int, rec_pos: int, rec_off: int,
                       cp: cpfile.Checkpoint | None) -> list[Segment]:
        """Walk each segment from its last trusted index entry; CRC-check from the recovery
        point on; cut the log at the first bad batch. Returns the segments kept."""
        interval = self.config.index_interval_bytes
        for i, seg in enumerate(segs):
            seg.size = self.fs.size(seg.log)
            if i < rec_i:
                seg.load_indexes(limit_pos=seg.size, limit_offset=2**63 - 1)
                crc_from = seg.size
            elif i == rec_i:
                seg.load_indexes(limit_pos=rec_pos, limit_offset=rec_off)
                if cp is not None and cp.segment_base == seg.base and cp.max_timestamp > seg.max_ts:
                    seg.max_ts, seg.max_ts_offset = cp.max_timestamp, cp.max_timestamp_offset
                crc_from = rec_pos
            else:
                seg.reset_indexes()
                crc_from = 0
            if i > 0 and seg.base != segs[i - 1].next_offset:
                log.warning("%s: segment %d does not continue offset %d; dropping it and later ones",
                            self.directory, seg.base, segs[i - 1].next_offset)
                return self._drop_from(segs, i)
            valid_end, file_end = self._scan_one(seg, crc_from, interval)
            if valid_end < file_end:
                log.warning("%s: cutting torn/corrupt tail of segment %d at byte %d (%d bytes)",
                            self.directory, seg.base, valid_end, file_end - valid_end)
                self.fs.truncate(seg.log, valid_end)
                self.fs.fsync(seg.log)
                self.recovery.truncated_bytes += file_end - valid_end
                return self._drop_from(segs, i + 1)
        return segs

    def _scan_one(self, seg: Segment, crc_from: int, interval: int) -> tuple[int, int]:
        start = seg.idx_pos[-1] if seg.idx_pos else 0
        seg.size = start
        seg.next_offset = seg.base + seg.idx_rel[-1] if seg.idx_pos else seg.base
        file_end = self.fs.size(seg.log)
        if file_end <= start:
            return start, file_end
        mm = self.fs.map_readonly(seg.log, file_end)
        try:
            for pos, hdr in scan_valid(mm, start, file_end, seg.next_offset, crc_from):
                seg.note_batch(pos, hdr.base_offset, hdr, interval)
        finally:
            mm.close()
        self.recovery.scanned_bytes += seg.size - start
        self.recovery.crc_checked_bytes += max(0, seg.size - max(crc_from, start))
        return seg.size, file_end

    def _after_recovery(self, recovery_offset: int) -> None:
        """Rebuild producer state and the aborted-txn index of the recovered tail.

        Start from the newest snapshot at or below the recovery point and replay batch
        headers from there to the end (control batches: their one record gives the
        marker type). Aborts at or after the recovery point get their index entries
        again; earlier ones were made durable before that checkpoint was written.
        """
        leo = self.log_end_offset
        prune_snapshots(self.fs, self.directory, keep=1 << 30, above=leo)   # past a cut tail
        first_base = self._segments[0].base
        found = load_latest_snapshot(self.fs, self.directory, min(recovery_offset, leo))
        if found is not None:
            start, self.producers = found
        else:
            start, self.producers = first_base, ProducerStateManager()
        # With no snapshot reaching back to the data, transactions may have begun in
        # deleted segments: an abort from a producer never seen is indexed from here.
        cold = start < first_base or (found is None and first_base > 0)
        start = max(start, first_base)
        for seg in self._segments:
            if seg.next_offset <= start:
                continue
            for pos, hdr in seg.iter_headers(seg.lookup(start) if start > seg.base else 0):
                if hdr.last_offset < start:
                    continue
                if hdr.is_control:
                    self._replay_marker(seg, pos, hdr, recovery_offset, start if cold else None)
                elif hdr.producer_id >= 0:
                    self.producers.update(hdr, AppendInfo(hdr.base_offset, hdr.last_offset))
        for seg in self._segments:
            seg.txn.truncate_to(leo)

    def _replay_marker(self, seg: Segment, pos: int, hdr: BatchHeader, recovery_offset: int,
                       cold_start: int | None) -> None:
        kind, coordinator_epoch = _read_marker(self.fs.pread(seg.log, hdr.size, pos))
        if kind is None:
            log.warning("%s: control batch at %d has no readable marker; ignored", self.directory, hdr.base_offset)
            return
        known = self.producers.entry(hdr.producer_id) is not None
        first = self.producers.complete_txn(hdr.producer_id, hdr.producer_epoch, coordinator_epoch,
                                            hdr.max_timestamp)
        if kind != CONTROL_ABORT or hdr.base_offset < recovery_offset:
            return
        if first is None and cold_start is not None and not known and cold_start < hdr.base_offset:
            first = cold_start
        if first is not None:
            self._index_abort(seg, hdr.producer_id, first, hdr.base_offset)

    def _index_abort(self, seg: Segment, producer_id: int, first: int, marker: int) -> None:
        lso = self.producers.first_unstable_offset()
        seg.txn.append(AbortedTxn(producer_id, first, marker, marker + 1 if lso is None else lso))

    def _drop_from(self, segs: list[Segment], i: int) -> list[Segment]:
        for seg in segs[i:]:
            self.recovery.segments_removed.append(seg.base)
            self.recovery.truncated_bytes += self.fs.file_size(seg.path(LOG_SUFFIX))
            seg.delete_files()
        return segs[:i]

    def _install(self, segs: list[Segment]) -> None:
        self._segments = segs
        self._bases = [s.base for s in segs]
        self.log_end_offset = segs[-1].next_offset

    def _sync_recovered(self, segs: list[Segment]) -> None:
        """Make the recovered tail durable and record it, so the next open starts from here."""
        for seg in segs:
            self.fs.fsync(seg.log)
            if seg is not self._segments[-1]:
                seg.seal_time_index()
            seg.persist_indexes(sync=seg is not self._segments[-1])
        self.fs.fsync_dir(self.directory)
        self.flushed_offset = self.log_end_offset
        self._flush_locked(force_checkpoint=True, strict=True)

    # ================================================================ appending
    def append(self, data: bytes | bytearray | memoryview, batches: list[tuple[int, BatchHeader]]) -> AppendInfo:
        """Append a produce payload already validated by split_batches (positions + headers).

        Offsets are assigned here. Raises AppendError (bad layout), StorageError (disk).
        A writable memoryview is taken over: its batches' offsets are patched in place.
        """
        duplicate = self._admit(data, batches)
        if duplicate is not None:
            return duplicate          # a retry of batches already stored: nothing is written
        return self._write(data, batches, on_success=self._apply_data)

    def _admit(self, data, batches: list[tuple[int, BatchHeader]]) -> AppendInfo | None:
        """The checks before a produce payload is written; the original offsets when it
        is a retry of batches already stored. Raises AppendError."""
        self._check_writable()
        self._check_leading()
        self._check_layout(data, batches)
        err, duplicate = self.producers.check_batches([h for _, h in batches])
        if err is not KafkaError.NONE:
            raise ProducerStateError(err, f"{err.name} for {self.directory}")
        return duplicate

    async def append_async(self, data: bytes | bytearray | memoryview, batches: list[tuple[int, BatchHeader]],
                           precheck=None, sync: bool = False, on_loop: bool = False) -> AppendInfo:
        """append() for the event loop, with a large payload's pwrite in a worker thread.

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
        per-log rounds). Memory (log
        end, indexes, producer state) moves when the write has finished, so readers
        and the flusher never see bytes that are not in the file; a synchronous
        mutator that comes meanwhile (a marker, retention, close) first waits for the
        write and settles it (_check_writable), so log order is call order.
        """
        lock = self._append_lock
        if lock is None:
            lock = self._append_lock = asyncio.Lock()
        if ((on_loop or len(data) < OFFLOOP_WRITE_BYTES) and not lock.locked()
                and not self._roll_due(len(data), batches)):
            _run_precheck(precheck)
            return self.append(data, batches)
        async with lock:
            if self._roll_due(len(data), batches):
                await self._roll_off_loop()
            # Every check from here to the write runs without an await in between.
            _run_precheck(precheck)
            duplicate = self._admit(data, batches)
            if duplicate is not None:
                return duplicate
            w = self._prepare_write(data, batches, self._apply_data, assign=True)
            self._submit_write(w, sync)
            return await self._write_in_thread(w)

    def _submit_write(self, w: "_PendingWrite", sync: bool = False) -> None:
        """Hand w to a worker thread: its pwrite, and with sync its fsync (_write_through)."""
        if sync:
            w.future = self._runner.submit(self._write_through, w)
        else:
            w.future = self._runner.submit(self.fs.pwrite, w.seg.log, w.buf, w.start)
        self._pending = w

    def _write_through(self, w: "_PendingWrite") -> None:
        """Worker thread: w's pwrite, then an fsync of its segment file. A failed fsync
        is not the write's failure: the data stays (as when a flusher round fails) and
        the caller's acks=all wait goes through the flusher, which reports it."""
        self.fs.pwrite(w.seg.log, w.buf, w.start)
        try:
            self.fs.fsync(w.seg.log)
        except OSError as exc:
            log.warning("%s: fsync after an append failed (the flusher retries it): %s", self.directory, exc)
            return
        w.synced = True

    def _note_synced(self, end: int) -> None:
        """A write-through fsync covered the active segment up to `end`: every earlier
        write to it went before (appends are serialised) and older segments were
        fsynced at their roll. A recovery checkpoint that has come due is written by a
        worker thread, off the answer's path (the flusher wrote it at its rounds)."""
        if end > self.flushed_offset:
            self.flushed_offset = end
        job = self._checkpoint_job
        if self._checkpoint_due() and (job is None or job.done()):
            self._checkpoint_job = self._runner.submit(self._checkpoint_in_background)

    def _checkpoint_in_background(self) -> None:
        try:
            self.flush()
        except StorageError as exc:   # closed meanwhile, or an fsync failed: the next one retries
            log.info("%s: background checkpoint skipped: %s", self.directory, exc)

    async def _write_in_thread(self, w: "_PendingWrite") -> AppendInfo:
        """Wait for w's write, handed to a worker thread by _submit_write, and settle it
        (unless a synchronous mutator settled it meanwhile); its AppendInfo, or its
        StorageError. Cancelled while waiting, it settles the write before giving up: a
        stop or a role change never leaves a write behind."""
        try:
            await asyncio.shield(asyncio.wrap_future(w.future))
        except Exception:
            pass                    # the write's own error: settling reports it
        finally:
            if self._pending is w:  # else a synchronous mutator settled it already
                self._settle_pending()
        if w.error is not None:
            raise w.error
        return w.info

    @property
    def write_pending(self) -> bool:
        """A write handed to a worker thread has not been applied to memory yet."""
        return self._pending is not None

    def settle(self) -> None:
        """Wait for a write handed to a worker thread and apply it to memory. A role
        change calls this first: the log end it starts from must count that write."""
        self._settle_pending()

    async def _roll_off_loop(self) -> None:
        """_roll in a worker thread: its fsyncs no longer stall every connection. The
        new segment starts at the log end as it is when the roll runs; a synchronous
        mutator that comes meanwhile waits for the roll first (_settle_pending).
        Raises StorageError when the roll failed (nothing was appended)."""
        self._check_writable()
        self._check_leading()
        fut = self._pending_roll = self._runner.submit(self._roll, self.log_end_offset, False)
        try:
            await asyncio.shield(asyncio.wrap_future(fut))
        except Exception:
            pass                        # the roll's own error: settling reports it
        finally:
            if self._pending_roll is fut:
                self._settle_roll()
        fut.result()

    def _settle_roll(self) -> None:
        """Wait for a roll running in a worker thread; close the segment it sealed."""
        fut, self._pending_roll = self._pending_roll, None
        try:
            old = fut.result()
        except (StorageError, FutureCancelled):
            return                      # append_async raises it to its caller
        old.close()

    def _settle_pending(self) -> None:
        """Wait for the roll or write append_async handed to a thread and apply its outcome."""
        if self._pending_roll is not None:
            self._settle_roll()
        w = self._pending
        if w is None:
            return
        self._pending = None
        try:
            w.future.result()
            failure = None
        except (OSError, FutureCancelled) as exc:
            failure = exc
        try:
            w.info = self._finish_write(w, failure)
        except StorageError as exc:
            w.error = exc

    def _apply_data(self, placed) -> None:
        for _, base, hdr in placed:
            self.producers.update(hdr, AppendInfo(base, base + hdr.last_offset_delta))

    def append_replicated(self, data: bytes | bytearray | memoryview) -> AppendInfo:
        """Follower: append batches fetched from the leader exactly as given (offsets,
        leader epochs, producer ids and sequences kept; control batches included).

        Producer state, the aborted-transaction index and the leader-epoch cache are
        built as on the leader, so this replica can take over: deduplicate a retry,
        keep the LSO and answer read_committed fetches. The first batch must start at
        the log end and offsets must be contiguous (AppendError otherwise).
        """
        batches = self._admit_replicated(data)
        return self._write(data, batches, on_success=lambda placed: self._apply_replicated(data, placed),
                           assign=False)

    def append_replicated_begin(self, data: bytes | bytearray | memoryview):
        """append_replicated with its pwrite in a worker thread (a large fetch: the
        follower's event loop stays free). Everything up to the pwrite happens in this
        call, before it returns, so a caller that checked its role just before knows
        the write belongs to that role. Returns an awaitable of the AppendInfo.

        The log end, producer state and indexes move only when the write has finished
        (as append_async), so the log end a follower reports in its next fetch counts
        only written bytes; a truncation, reset, close or role change meanwhile first
        waits for the write and applies it (_settle_pending), so no write lands past a
        truncation point. Raises AppendError / StorageError like append_replicated."""
        batches = self._admit_replicated(data)      # settles an earlier pending write first
        w = self._prepare_write(data, batches, lambda placed: self._apply_replicated(data, placed), assign=False)
        self._submit_write(w)
        return self._write_in_thread(w)

    def _admit_replicated(self, data) -> list[tuple[int, BatchHeader]]:
        """append_replicated's checks, and the leader epochs of its batches recorded."""
        self._check_writable()
        batches, err = split_batches(data)
        if err is not KafkaError.NONE:
            raise AppendError(err, f"replicated batches for {self.directory} do not parse: {err.name}")
        first = batches[0][1]
        if first.base_offset < self.log_end_offset <= first.last_offset and self.size_bytes() == 0:
            self._rebase_empty(first.base_offset)    # after reset_to: the leader's first batch straddles its start
        expect = self.log_end_offset
        for _, hdr in batches:
            if hdr.base_offset != expect:
                raise AppendError(KafkaError.OFFSET_OUT_OF_RANGE,
                                  f"{self.directory}: replicated batch at {hdr.base_offset}, log end {expect}")
            expect = hdr.next_offset
        try:
            for _, hdr in batches:   # before the data: a cache entry past the log end is cut at open
                self.epochs.assign(hdr.leader_epoch, hdr.base_offset)
        except OSError as exc:
            raise StorageError(f"{self.directory}: cannot write the leader-epoch cache: {exc}") from exc
        return batches

    def reset_to(self, offset: int) -> None:
        """Follower: the leader's log now starts past this replica's end (retention or
        DeleteRecords while it was away), so nothing here can be continued: drop every
        record and start empty at `offset`. Producer state and epochs go too (the
        leader's batches from `offset` on rebuild what is still relevant)."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            if offset <= self.log_end_offset:
                raise ValueError(f"reset_to({offset}) on a log ending at {self.log_end_offset}")
            new = Segment(self.fs, self.directory, offset)
            try:
                # New segment first: a crash before the old ones are gone leaves a gap that
                # the next open cuts at, which drops the new segment, not the old data.
                new.create_files()
                self.fs.fsync_dir(self.directory)
                with self._lock:
                    doomed = self._segments
                    self._install([new])
                    self.log_start_offset = self.flushed_offset = offset
                    self.producers = ProducerStateManager()
                for seg in doomed:
                    seg.delete_files()
                prune_snapshots(self.fs, self.directory, keep=0)
                self.epochs.truncate_from_end(0)
                self._flush_locked(force_checkpoint=True, strict=True)
            except OSError as exc:
                self._failed = f"reset to {offset} failed: {exc}"
                raise StorageError(f"{self.directory}: {self._failed}") from exc
            if self.replicated_hw is not None:
                self.replicated_hw = offset

    def _rebase_empty(self, base: int) -> None:
        """An empty log (just reset) starts its segment at `base` instead, below its log
        start, so the leader's batch holding the log start can be stored whole; reads
        below the log start stay refused, as on the leader."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            new = Segment(self.fs, self.directory, base)
            try:
                new.create_files()
                with self._lock:
                    old = self._segments
                    self._install([new])
                for seg in old:
                    seg.delete_files()
                self.fs.fsync_dir(self.directory)
            except OSError as exc:
                raise StorageError(f"{self.directory}: cannot start the log at {base}: {exc}") from exc

    def _apply_replicated(self, data, placed) -> None:
        for pos, base, hdr in placed:
            if not hdr.is_control:
                self.producers.update(hdr, AppendInfo(base, base + hdr.last_offset_delta))
                continue
            kind, coordinator_epoch = _read_marker(bytes(data[pos:pos + hdr.size]))
            first = self.producers.complete_txn(hdr.producer_id, hdr.producer_epoch, coordinator_epoch,
                                                hdr.max_timestamp)
            if kind == CONTROL_ABORT and first is not None:
                self._index_abort(self._segments[-1], hdr.producer_id, first, base)

    def truncate_to(self, offset: int) -> int:
        """Follower: cut the log back to `offset` (KIP-101 truncation) and return the new
        log end (the start of the batch holding `offset`, as replicas share batch
        boundaries). Producer state, the aborted-transaction index and the leader-epoch
        cache go back with it. Crash-safe: a crash midway leaves a checkpoint that no
        longer matches the segments, so the next open checks the whole log."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            if offset >= self.log_end_offset:
                # No record to cut, but an epoch may begin right at the log end (a leader
                # that wrote nothing in it): it is history the new leader does not share.
                try:
                    self.epochs.truncate_from_end(offset)
                except OSError as exc:
                    raise StorageError(f"{self.directory}: cannot write the leader-epoch cache: {exc}") from exc
                return self.log_end_offset
            offset = max(offset, self.log_start_offset)
            i = max(0, bisect_right(self._bases, offset) - 1)
            try:
                with self._lock:
                    doomed = self._segments[i + 1:]
                    del self._segments[i + 1:]
                    del self._bases[i + 1:]
                    seg = self._segments[i]
                    seg.truncate_to(offset)
                    self.log_end_offset = seg.next_offset
                    self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
                    self.flushed_offset = min(self.flushed_offset, self.log_end_offset)
                for old in doomed:
                    old.delete_files()
                self.fs.fsync(seg.log)
                self.flushed_offset = self.log_end_offset
                self.epochs.truncate_from_end(self.log_end_offset)
                with self._lock:
                    self._after_recovery(self.log_end_offset)
                self._flush_locked(force_checkpoint=True, strict=True)
            except OSError as exc:
                self._failed = f"truncation to {offset} failed: {exc}"
                raise StorageError(f"{self.directory}: {self._failed}") from exc
            if self.replicated_hw is not None:
                self.replicated_hw = min(self.replicated_hw, self.log_end_offset)
            return self.log_end_offset

    def append_control(self, kind: int, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                       *, timestamp_ms: int | None = None) -> AppendInfo:
        """Write a COMMIT (1) or ABORT (0) marker for producer_id and end its transaction here.

        Fenced like data: an epoch below the producer's current one raises
        ProducerStateError(INVALID_PRODUCER_EPOCH); so does an older coordinator epoch
        (TRANSACTION_COORDINATOR_FENCED).
        """
        if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
            raise ValueError(f"control kind must be 0 (abort) or 1 (commit), not {kind!r}")
        if producer_id < 0:
            raise ValueError("a transaction marker needs a producer id")
        self._check_writable()
        self._check_leading()
        err = self.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
        if err is not KafkaError.NONE:
            raise ProducerStateError(err, f"{err.name}: marker for producer {producer_id} refused")
        ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
        data = build_control_batch(kind, producer_id=producer_id, producer_epoch=producer_epoch,
                                   coordinator_epoch=coordinator_epoch, timestamp_ms=ts)
        batches, _ = split_batches(data)

        def apply(placed) -> None:
            marker = placed[0][1]
            first = self.producers.complete_txn(producer_id, producer_epoch, coordinator_epoch, ts)
            if kind == CONTROL_ABORT and first is not None:
                self._index_abort(self._segments[-1], producer_id, first, marker)
        return self._write(data, batches, on_success=apply)

    def _check_layout(self, data, batches: list[tuple[int, BatchHeader]]) -> None:
        if not batches:
            raise AppendError(KafkaError.CORRUPT_MESSAGE, "no record batches to append")
        expect = 0
        for pos, hdr in batches:
            if pos != expect or hdr.batch_length < 49:
                raise AppendError(KafkaError.CORRUPT_MESSAGE, "batch positions do not tile the payload")
            if hdr.is_control:
                raise AppendError(KafkaError.INVALID_RECORD, "control batches are written by append_control")
            expect = pos + hdr.size
        if expect != len(data):
            raise AppendError(KafkaError.CORRUPT_MESSAGE, "payload has bytes after its last batch")

    def _write(self, data, batches: list[tuple[int, BatchHeader]], on_success=None, assign: bool = True
               ) -> AppendInfo:
        """Assign offsets (unless replicating: assign=False keeps them), stamp the leader
        epoch when leading, roll if needed, write with one pwrite, then update memory."""
        w = self._prepare_write(data, batches, on_success, assign)
        try:
            self.fs.pwrite(w.seg.log, w.buf, w.start)
        except OSError as exc:
            return self._finish_write(w, exc)
        return self._finish_write(w, None)

    def _prepare_write(self, data, batches: list[tuple[int, BatchHeader]], on_success, assign: bool
                       ) -> "_PendingWrite":
        """Everything before the pwrite: offsets, leader epoch, roll, the patched bytes."""
        if self._pending is not None or self._pending_roll is not None:
            # Placed from a log end that does not count the pending work, this write would
            # land over it, and the pending slot (what every mutator waits for) would lose it.
            raise RuntimeError(f"{self.directory}: a write prepared while a worker's write or roll is pending")
        first = self.log_end_offset
        epoch = self.leader_epoch if assign else None
        if epoch is not None:
            try:   # before the data: a cache entry past the log end is cut at open
                self.epochs.assign(epoch, first)
            except OSError as exc:
                raise StorageError(f"{self.directory}: cannot write the leader-epoch cache: {exc}") from exc
        if self._roll_due(len(data), batches):
            self._roll(first)
        seg = self._segments[-1]
        # A follower writes the leader's bytes untouched. A leader patches offsets (and
        # epochs) in a writable view in place: the produce path hands over views of
        # the request frame it owns (protocol.produce_request); anything else is copied.
        buf = data if not assign or _writable_view(data) else bytearray(data)
        placed = []
        offset = first
        for pos, hdr in batches:
            if assign:
                set_base_offset(buf, pos, offset)
            if epoch is not None:
                set_leader_epoch(buf, pos, epoch)
            placed.append((pos, offset, hdr))
            offset += hdr.last_offset_delta + 1
        return _PendingWrite(seg, seg.size, buf, placed, first, offset, on_success)

    def _roll_due(self, size: int, batches: list[tuple[int, BatchHeader]]) -> bool:
        """Would `size` bytes of these batches overflow the active segment (bytes, or
        offsets relative to its base)?"""
        seg = self._segments[-1]
        if seg.size == 0:
            return False
        count = sum(h.last_offset_delta + 1 for _, h in batches)
        return (seg.size + size > self.config.segment_bytes
                or self.log_end_offset + count - 1 - seg.base > MAX_RELATIVE_OFFSET)

    def _finish_write(self, w: "_PendingWrite", failure: BaseException | None) -> AppendInfo:
        """After the pwrite: cut a failed one back, else account for the batches."""
        seg = w.seg
        if failure is not None:
            self._undo_write(seg, w.start)
            raise StorageError(f"write to {seg.path(LOG_SUFFIX)} failed: {failure}") from failure
        interval = self.config.index_interval_bytes
        with self._lock:
            for pos, base, hdr in w.placed:
                seg.note_batch(w.start + pos, base, hdr, interval)
            self.log_end_offset = w.end
            self._bytes_since_checkpoint += len(w.buf)
            if w.on_success is not None:
                w.on_success(w.placed)
        if w.synced:
            self._note_synced(w.end)
        return AppendInfo(w.first, w.end - 1, -1)

    def _undo_write(self, seg: Segment, size: int) -> None:
        try:
            self.fs.truncate(seg.log, size)
        except OSError as exc:
            # The file may now hold part of a request that was refused. Take the log
            # offline: recovery at the next open cuts whatever does not check out.
            self._failed = f"could not undo a failed write ({exc}); reopen the log to recover"
            log.error("%s: %s", self.directory, self._failed)

    def _roll(self, new_base: int, close_old: bool = True) -> Segment:
        """Start a new active segment at new_base; the old one is fsynced with its indexes.
        Returns the old segment (closed unless close_old is False: see _roll_off_loop)."""
        with self._io_lock:
            old = self._segments[-1]
            new = Segment(self.fs, self.directory, new_base)
            try:
                self.fs.fsync(old.log)
                old.seal_time_index()
                old.persist_indexes(sync=True)
                new.create_files()
                self.fs.fsync_dir(self.directory)
            except OSError as exc:
                try:
                    new.delete_files()
                except OSError:
                    pass
                raise StorageError(f"cannot roll {self.directory} at offset {new_base}: {exc}") from exc
            with self._lock:
                self._segments.append(new)
                self._bases.append(new_base)
            self.flushed_offset = max(self.flushed_offset, new_base)
            if close_old:
                old.close()
            # checkpoint + producer snapshot at the new base (failure only costs restart time)
            self._flush_locked(force_checkpoint=True)
            return old

    # ================================================================ reading
    @property
    def high_watermark(self) -> int:
        """The log end on a single node; in a cluster what the ISR holds (never past the log end)."""
        hw = self.replicated_hw
        return self.log_end_offset if hw is None else min(hw, self.log_end_offset)

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> bytes:
        """Whole batches from the one holding offset: at least one if one lies wholly below
        upper_bound (even if bigger than max_bytes), never one whose last offset >= upper_bound."""
        self._check_readable()
        start, leo = self.log_start_offset, self.log_end_offset
        if offset < start or offset > leo:
            raise OffsetOutOfRange(offset, start, leo)
        bound = leo if upper_bound is None else min(upper_bound, leo)
        if offset >= bound:
            return b""
        segs = self._segments
        i = max(0, bisect_right(self._bases, offset) - 1)
        try:
            while i < len(segs):
                out = segs[i].read(offset, max_bytes, bound)
                if out is not None:
                    return out
                i += 1
        except OSError as exc:
            raise StorageError(f"read of {self.directory} failed: {exc}") from exc
        return b""

    def read_checked(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> bytes:
        """read(), verified batch by batch (structure, offset order, CRC-32C): the good
        batches before any damage, or CorruptLogError naming the segment file when
        the first batch itself is damaged. Readers that hand bytes to clients or
        replay coordinator state use this, never the unverified read()."""
        data = self.read(offset, max_bytes, upper_bound)
        good, bad_at = verified_prefix(data, offset)
        if not data:
            # Offsets end on batch boundaries (high watermark, LSO, log end), so nothing
            # below the bound means the header there claims offsets it does not hold: a
            # reader would wait at this offset for ever, a replay would stop short.
            bound = self.log_end_offset if upper_bound is None else min(upper_bound, self.log_end_offset)
            bad_at = offset if self.log_start_offset <= offset < bound else None
        if bad_at is None:
            return data
        path = self.segment_path(bad_at)
        first = (path, bad_at) not in self._reported_damage
        if first and len(self._reported_damage) < 1000:
            self._reported_damage.add((path, bad_at))
            log.error("%s: damaged batch at offset %d (CRC or structure); it is not served", path, bad_at)
        if good:
            return good
        raise CorruptLogError(f"{path}: damaged batch at offset {bad_at}", path, bad_at, first)

    def segment_path(self, offset: int) -> str:
        """The segment data file holding `offset` (for messages)."""
        i = max(bisect_right(self._bases, offset) - 1, 0)
        return str(self.directory / f"{segment_name(self._bases[i] if self._bases else 0)}{LOG_SUFFIX}")

    def offset_for_timestamp(self, ts_ms: int) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with timestamp >= ts_ms, or None."""
        self._check_readable()
        segs = self._segments
        try:
            for k, seg in enumerate(segs):
                if k < len(segs) - 1 and seg.max_ts < ts_ms:
                    continue  # a sealed segment knows its max exactly
                hit = seg.find_timestamp(ts_ms, self.log_start_offset)
                if hit is not None:
                    return hit
        except OSError as exc:
            raise StorageError(f"timestamp lookup in {self.directory} failed: {exc}") from exc
        return None

    @property
    def last_stable_offset(self) -> int:
        """First offset of the earliest open transaction, else the high watermark."""
        first = self.producers.first_unstable_offset()
        return self.high_watermark if first is None else min(first, self.high_watermark)

    def aborted_transactions(self, start_offset: int, end_offset: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of aborted transactions overlapping [start, end),
        for Fetch responses to read_committed consumers."""
        out: list[tuple[int, int]] = []
        segs = self._segments
        i = max(0, bisect_right(self._bases, start_offset) - 1)
        for seg in segs[i:]:
            if seg.txn.collect(start_offset, end_offset, out):
                break
        return out

    def expire_producers(self, now_ms: int) -> int:
        """Forget producers idle longer than producer_id_expiration_ms; returns how many."""
        with self._lock:
            return self.producers.expire(now_ms, self.config.producer_id_expiration_ms)

    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_bases(self) -> list[int]:
        return list(self._bases)

    # ================================================================ flushing
    def flush(self, *, checkpoint: bool = False) -> int:
        """fsync everything appended so far (blocking); returns flushed_offset.

        Also persists the recovery checkpoint when one is due (or checkpoint=True).
        May run in a worker thread while the owner thread keeps appending.
        """
        with self._io_lock:
            self._check_readable()
            return self._flush_locked(force_checkpoint=checkpoint)

    def _checkpoint_due(self) -> bool:
        cfg = self.config
        return (self._bytes_since_checkpoint >= cfg.checkpoint_interval_bytes
                or (time.monotonic() - self._last_checkpoint) * 1000 >= cfg.checkpoint_interval_ms)

    def _flush_locked(self, *, force_checkpoint: bool = False, clean: bool = False, strict: bool = False) -> int:
        due = force_checkpoint or self._checkpoint_due()
        with self._lock:
            seg = self._segments[-1]
            leo = self.log_end_offset
            state = self._capture(seg, leo, clean) if due else None
        if leo > self.flushed_offset:
            try:
                self.fs.fsync(seg.log)
            except OSError as exc:
                raise StorageError(f"fsync of {seg.path(LOG_SUFFIX)} failed: {exc}") from exc
            # max: a write-through append may have moved it past this round's leo meanwhile
            self.flushed_offset = max(self.flushed_offset, leo)
        if state is not None:
            try:
                self._persist(seg, state)
                self.last_checkpoint_error = None
            except OSError as exc:
                # The data is durable; only restart speed suffers. Keep going.
                self.last_checkpoint_error = exc
                log.warning("%s: could not write the recovery checkpoint: %s", self.directory, exc)
                if strict:
                    raise StorageError(f"checkpoint of {self.directory} failed: {exc}") from exc
        return self.flushed_offset

    def _capture(self, seg: Segment, leo: int, clean: bool) -> tuple[cpfile.Checkpoint, bytes]:
        """Everything a checkpoint at leo needs, taken under _lock so it is one instant."""
        cp = cpfile.Checkpoint(recovery_offset=leo, segment_base=seg.base, position=seg.size,
                               log_start_offset=self.log_start_offset, max_timestamp=seg.max_ts,
                               max_timestamp_offset=seg.max_ts_offset, clean=clean)
        return cp, self.producers.to_bytes()

    def _persist(self, seg: Segment, state: tuple[cpfile.Checkpoint, bytes]) -> None:
        """Indexes, then the producer snapshot, then the checkpoint that vouches for both."""
        cp, snapshot = state
        seg.persist_indexes(sync=False)
        write_snapshot(self.fs, self.directory, cp.recovery_offset, snapshot)
        self.fs.write_atomic(self.directory / cpfile.FILE_NAME, cp.encode(), sync_dir=True)
        prune_snapshots(self.fs, self.directory)
        self._bytes_since_checkpoint = 0
        self._last_checkpoint = time.monotonic()

    # ================================================================ retention
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

    # ================================================================ compaction support
    def cleanable_end(self) -> int:
        """Where a compaction may stop: the active segment and anything at or above the
        LSO (open transactions) are never cleaned."""
        return min(self._segments[-1].base, self.last_stable_offset)

    def closed_segments_below(self, offset: int) -> list[int]:
        """Bases of the non-active segments that end at or below `offset`."""
        return [seg.base for seg in self._segments[:-1] if seg.next_offset <= offset]

    def _segment(self, base: int) -> Segment:
        i = bisect_right(self._bases, base) - 1
        if i < 0 or self._bases[i] != base:
            raise StorageError(f"{self.directory}: no segment at {base}")
        return self._segments[i]

    def segment_bytes(self, base: int) -> bytes:
        seg = self._segment(base)
        try:
            return self.fs.pread(seg.log, seg.size, 0)
        except OSError as exc:
            raise StorageError(f"read of {seg.path(LOG_SUFFIX)} failed: {exc}") from exc

    def bytes_after(self, base: int) -> bytes:
        """Every batch of the segments after the one at `base` (for walking headers)."""
        i = self._bases.index(base) + 1
        return b"".join(self.fs.pread(seg.log, seg.size, 0) for seg in self._segments[i:])

    def replace_segment(self, base: int, data: bytes) -> None:
        """Swap a closed segment's contents for `data` (same offsets, fewer records).
        Crash-safe: the offset/time index files are emptied first (an empty sparse
        index is valid for either content), then the log file is replaced atomically,
        then the indexes are rebuilt. The aborted-transaction index is kept."""
        self._settle_pending()   # first: a roll in a worker thread waits for _io_lock
        with self._io_lock:
            self._check_writable()
            seg = self._segment(base)
            if seg is self._segments[-1]:
                raise StorageError(f"{self.directory}: the active segment is never rewritten")
            try:
                for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                    self.fs.write_atomic(seg.path(suffix), b"", sync_dir=False)
                with self._lock:
                    seg.close()
                    self.fs.write_atomic(seg.path(LOG_SUFFIX), data, sync_dir=True)
                    seg.idx_rel, seg.idx_pos, seg.idx_persisted = array("I"), array("I"), 0
                    seg.tidx_ts, seg.tidx_rel, seg.tidx_persisted = array("q"), array("q"), 0
                    seg.max_ts, seg.max_ts_offset = -1, -1
                    for pos, hdr in iter_batches(data):
                        seg.note_batch(pos, hdr.base_offset, hdr, self.config.index_interval_bytes)
                    seg.seal_time_index()
                seg.persist_indexes(sync=True)
            except OSError as exc:
                self._failed = f"rewriting segment {base} failed: {exc}"
                raise StorageError(f"{self.directory}: {self._failed}") from exc

    # ================================================================ lifecycle
    def close(self) -> None:
        """Flush, write a clean checkpoint, release files. Idempotent."""
        self._settle_pending()      # never release a file a worker thread is writing
        with self._io_lock:
            if self._closed:
                return
            try:
                if self._failed is None:
                    self._segments[-1].seal_time_index()
                    self._flush_locked(force_checkpoint=True, clean=True, strict=True)
            finally:
                self._release_files()
                self._closed = True

    def abandon(self) -> None:
        """Release the files without writing anything, as if the process had died
        (for crash tests and benchmarks)."""
        self._settle_pending()      # never release a file a worker thread is writing
        with self._io_lock:
            self._release_files()
            self._closed = True

    def delete(self) -> None:
        """Remove the log and its directory."""
        self._settle_pending()      # never release a file a worker thread is writing
        with self._io_lock:
            self._release_files()
            self._closed = True
            try:
                if self.fs.exists(self.directory):
                    self.fs.rmtree(self.directory)
            except OSError as exc:
                raise StorageError(f"cannot delete {self.directory}: {exc}") from exc

    def _release_files(self) -> None:
        for seg in self._segments:
            try:
                seg.close()
            except OSError:
                pass

    def _check_readable(self) -> None:
        if self._closed:
            raise StorageError(f"log {self.directory} is closed")

    def _check_leading(self) -> None:
        if self.is_follower:
            raise AppendError(KafkaError.NOT_LEADER_OR_FOLLOWER, f"{self.directory} is a follower's replica")

    def _check_writable(self) -> None:
        self._settle_pending()      # a write in a worker thread lands first: log order = call order
        self._check_readable()
        if self._failed is not None:
            raise StorageError(f"log {self.directory} is offline: {self._failed}")

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return (f"PartitionLog({str(self.directory)!r}, start={self.log_start_offset}, "
                f"end={self.log_end_offset}, flushed={self.flushed_offset}, segments={len(self._segments)})")


def _read_marker(batch: bytes) -> tuple[int | None, int]:
    """(kind, coordinator epoch) of a control batch; (None, -1) when unreadable."""
    try:
        rec = next(iter_records(batch), None)
    except ValueError:
        return None, -1
    if rec is None or rec.key is None or len(rec.key) < 4:
        return None, -1
    kind = int.from_bytes(rec.key[2:4], "big", signed=True)
    epoch = int.from_bytes(rec.value[2:6], "big", signed=True) if rec.value and len(rec.value) >= 6 else -1
    return kind, epoch


def _writable_view(data) -> bool:
    return isinstance(data, memoryview) and not data.readonly


def _run_precheck(precheck) -> None:
    if precheck is not None:
        err = precheck()
        if err:
            raise AppendError(err, err.name)


class _PendingWrite:
    """One append between its pwrite and its effect on memory (see append_async)."""
    __slots__ = ("seg", "start", "buf", "placed", "first", "end", "on_success", "future", "info", "error", "synced")

    def __init__(self, seg: Segment, start: int, buf, placed: list, first: int, end: int, on_success):
        self.seg, self.start, self.buf, self.placed = seg, start, buf, placed
        self.first, self.end, self.on_success = first, end, on_success
        self.future = None
        self.info: AppendInfo | None = None
        self.error: StorageError | None = None
        self.synced = False           # _write_through's fsync covered it
