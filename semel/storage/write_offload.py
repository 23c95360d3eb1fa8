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
job under io_lock like any flush.
It also rolls a full segment in a worker thread (the old segment's fsync, its
indexes, the new files, the directory fsync, the checkpoint), under the same
append lock and settled the same way; the loop closes the old file afterwards,
since a fetch on the loop may be reading it.
A WriteOffload belongs to one PartitionLog (storage/log.py decides what it is handed)
and owns only the work in a worker's hands; docs/internals/file-work-in-threads.md
lists every such hand-off and its rule.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from semel.protocol.errors import KafkaError
from semel.protocol.records import BatchHeader

from .errors import AppendError, StorageError
from .fs import FileSystem
from .fsync_repair import FsyncRepair
from .segment import Segment
from .types import AppendInfo

# What an append writes (a writable view is patched in place), and each of its batches
# as placed: (position in the payload, base offset, header).
Payload = bytes | bytearray | memoryview
Placed = tuple[int, int, BatchHeader]

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


class OffloadedLog(Protocol):
    """What a WriteOffload needs of the log whose file work it hands to threads."""
    fs: FileSystem
    directory: Path
    io_lock: threading.RLock
    fsync_repair: FsyncRepair

    def finish_write(self, w: PendingWrite, failure: BaseException | None) -> AppendInfo: ...

    def roll(self, new_base: int, close_old: bool = True) -> Segment: ...

    def flush(self, *, checkpoint: bool = False) -> int: ...


class WriteOffload:
    """One log's file work in worker threads: the write or roll a worker holds (at most
    one of each), the background checkpoint, and the asyncio lock that serialises the
    log's append_async calls. `runner.submit(fn, *args)` runs the work."""

    def __init__(self, log: OffloadedLog, runner: Executor) -> None:
        self._log = log
        self._runner = runner
        self._append_lock: asyncio.Lock | None = None
        self.pending: PendingWrite | None = None
        self.pending_roll: Future[Segment] | None = None
        self.checkpoint_job: Future[None] | None = None

    @property
    def append_lock(self) -> asyncio.Lock:
        """Serialises append_async per log (FIFO); made on first use, inside the loop."""
        if self._append_lock is None:
            self._append_lock = asyncio.Lock()
        return self._append_lock

    @property
    def busy(self) -> bool:
        """A write or roll is in a worker's hands, not yet settled."""
        return self.pending is not None or self.pending_roll is not None

    def submit_write(self, w: PendingWrite, sync: bool = False) -> None:
        """Hand w to a worker thread: its pwrite, and with sync its fsync (_write_through)."""
        if sync:
            w.future = self._runner.submit(self._write_through, w)
        else:
            w.future = self._runner.submit(self._log.fs.pwrite, w.seg.log, w.buf, w.start)
        self.pending = w

    def _write_through(self, w: PendingWrite) -> None:
        """Worker thread: w's pwrite, then an fsync of its segment file. A failed fsync
        is not the write's failure: the data stays until the log cuts its untrusted
        tail back (fsync_repair), and the caller's acks=all wait reports it."""
        fs = self._log.fs
        fs.pwrite(w.seg.log, w.buf, w.start)
        # io_lock, as every fsync of the log: one that fails is noted before any other
        # fsync of the log can succeed and move flushed_offset past what it dropped.
        with self._log.io_lock:
            try:
                fs.fsync(w.seg.log)
            except OSError as exc:
                # Counted: the pages it may have dropped are not vouched for by a retry.
                self._log.fsync_repair.failed()
                log.warning("%s: fsync after an append failed: %s", self._log.directory, exc)
                return
        w.synced = True

    def checkpoint_soon(self) -> None:
        """A recovery checkpoint has come due after a write-through fsync or a group-
        commit round (PartitionLog.flush(checkpoint_later=True)): a worker thread writes
        it, off the answer's path. May be called from any thread: two calls at once at
        worst start two jobs, and the second finds nothing due (io_lock orders them)."""
        job = self.checkpoint_job
        if job is None or job.done():
            self.checkpoint_job = self._runner.submit(self._checkpoint_in_background)

    def _checkpoint_in_background(self) -> None:
        try:
            self._log.flush()
        except StorageError as exc:   # closed meanwhile, or an fsync failed: the next one retries
            log.info("%s: background checkpoint skipped: %s", self._log.directory, exc)

    async def write_in_thread(self, w: PendingWrite) -> AppendInfo:
        """Wait for w's write, handed to a worker thread by submit_write, and settle it
        (unless a synchronous mutator settled it meanwhile); its AppendInfo, or its
        StorageError. Cancelled while waiting, it settles the write before giving up: a
        stop or a role change never leaves a write behind."""
        assert w.future is not None
        try:
            await asyncio.shield(asyncio.wrap_future(w.future))
        except Exception:
            pass                    # the write's own error: settling reports it
        finally:
            if self.pending is w:   # else a synchronous mutator settled it already
                self.settle()
        if w.error is not None:
            raise w.error
        assert w.info is not None
        return w.info

    async def roll_in_thread(self, new_base: int) -> None:
        """The log's roll in a worker thread: its fsyncs no longer stall every connection.
        A synchronous mutator that comes meanwhile waits for the roll first (settle).
        Raises StorageError when the roll failed (nothing was appended)."""
        fut = self.pending_roll = self._runner.submit(self._log.roll, new_base, False)
        try:
            await asyncio.shield(asyncio.wrap_future(fut))
        except Exception:
            pass                        # the roll's own error: settling reports it
        finally:
            if self.pending_roll is fut:
                self._settle_roll()
        fut.result()

    def _settle_roll(self) -> None:
        """Wait for a roll running in a worker thread; close the segment it sealed."""
        fut, self.pending_roll = self.pending_roll, None
        assert fut is not None
        try:
            old = fut.result()
        except (StorageError, FutureCancelled):
            return                      # append_async raises it to its caller
        old.close()

    def settle(self) -> None:
        """Wait for the roll or write handed to a thread and apply its outcome."""
        if self.pending_roll is not None:
            self._settle_roll()
        w = self.pending
        if w is None:
            return
        self.pending = None
        assert w.future is not None
        failure: BaseException | None
        try:
            w.future.result()
            failure = None
        except (OSError, FutureCancelled) as exc:
            failure = exc
        try:
            w.info = self._log.finish_write(w, failure)
        except StorageError as exc:
            w.error = exc


def run_precheck(precheck: Callable[[], KafkaError] | None) -> None:
    """The caller's checks of append_async, as an AppendError."""
    if precheck is not None:
        err = precheck()
        if err:
            raise AppendError(err, err.name)


def check_layout(data: Payload, batches: list[tuple[int, BatchHeader]]) -> None:
    """A produce payload's batches, as split_batches gave them, tile it exactly and none
    is a control batch (those are written by append_control); AppendError otherwise."""
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


class PendingWrite:
    """One append between its pwrite and its effect on memory (see append_async)."""
    __slots__ = ("seg", "start", "buf", "placed", "first", "end", "on_success", "stamp", "future", "info", "error",
                 "synced")

    def __init__(self, seg: Segment, start: int, buf: Payload, placed: list[Placed], first: int, end: int,
                 on_success: Callable[[list[Placed]], None] | None, stamp: int | None = None) -> None:
        self.seg, self.start, self.buf, self.placed = seg, start, buf, placed
        self.first, self.end, self.on_success = first, end, on_success
        self.stamp = stamp            # AppendInfo.fsync_stamp
        self.future: Future[None] | None = None
        self.info: AppendInfo | None = None
        self.error: StorageError | None = None
        self.synced = False           # _write_through's fsync covered it
