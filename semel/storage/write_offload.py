"""Appends whose file work runs in a worker thread, so the event loop never waits on the disk.

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
WriteOffload is one of PartitionLog's parts (storage/log.py holds the state it works
on); docs/internals/file-work-in-threads.md lists every such hand-off and its rule.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import ThreadPoolExecutor

from semel.protocol.records import BatchHeader

from .errors import AppendError, StorageError
from .segment import Segment
from .types import AppendInfo

log = logging.getLogger("semel.storage")

# append_async writes payloads of at least this size in a worker thread: a pwrite can
# wait for an fsync of the same file (ext4 stable pages; 1 MiB writes beside an fsync
# loop measured p99 9 ms, max 23 ms here), and on the event loop that stalls every
# connection. Smaller ones cost less to write than to hand to a thread.
OFFLOOP_WRITE_BYTES = 64 * 1024
# Every piece of file work a log hands to a thread goes through its `runner` (this
# pool unless open() is given another): the seam through which tests order a worker's
# write, roll or checkpoint against the loop's steps.
WRITERS = ThreadPoolExecutor(max_workers=8, thread_name_prefix="semel-pwrite")


class WriteOffload:
    """PartitionLog's appends in a worker thread and the settling every mutator does first."""

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

    def _submit_write(self, w: "PendingWrite", sync: bool = False) -> None:
        """Hand w to a worker thread: its pwrite, and with sync its fsync (_write_through)."""
        if sync:
            w.future = self._runner.submit(self._write_through, w)
        else:
            w.future = self._runner.submit(self.fs.pwrite, w.seg.log, w.buf, w.start)
        self._pending = w

    def _write_through(self, w: "PendingWrite") -> None:
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

    async def _write_in_thread(self, w: "PendingWrite") -> AppendInfo:
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


def _run_precheck(precheck) -> None:
    if precheck is not None:
        err = precheck()
        if err:
            raise AppendError(err, err.name)


class PendingWrite:
    """One append between its pwrite and its effect on memory (see append_async)."""
    __slots__ = ("seg", "start", "buf", "placed", "first", "end", "on_success", "future", "info", "error", "synced")

    def __init__(self, seg: Segment, start: int, buf, placed: list, first: int, end: int, on_success):
        self.seg, self.start, self.buf, self.placed = seg, start, buf, placed
        self.first, self.end, self.on_success = first, end, on_success
        self.future = None
        self.info: AppendInfo | None = None
        self.error: StorageError | None = None
        self.synced = False           # _write_through's fsync covered it
