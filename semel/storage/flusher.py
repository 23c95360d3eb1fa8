"""Group commit: many acks=all producers waiting on one log share one fsync.

The fsync runs in a worker thread (the loop's default executor; the rounds started
in one turn of the loop are dealt over a few jobs, see _start_rounds) so the event
loop keeps accepting and appending while the disk works. A round answers its waiters
after its fsync; a recovery checkpoint that came due is written by a background job.
A waiter whose data arrived after the running fsync took its snapshot gets the next
round, started at once and queued behind the running one (at most two per log in
flight); every round covers everyone who asked before it started. A waiter is told
durable only if no fsync of its log failed while it waited. (A large acks=all
append fsyncs in its own write thread instead: PartitionLog.append_async(sync=True);
a flusher round that finds the log already flushed returns at once.)
docs/internals/latency.md says where an answer's time goes.
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Callable, Iterable

from .errors import StorageError
from .log import PartitionLog

log = logging.getLogger("semel.storage")

# What start_each began for each target of a sync_each: the round it waits for (None:
# it needed none) and the log's fsync_failures when it asked.
Begun = list[tuple["asyncio.Future[Any] | None", int]]
# Each target's AppendInfo.fsync_stamp, where its caller kept them (None: none given).
Stamps = list["int | None"] | None

# The rounds of one loop turn go to at least this many worker jobs in parallel (fewer
# when there are fewer rounds), and no job fsyncs more than LOGS_PER_JOB logs in a row
# (see _start_rounds). The loop's default executor has min(32, CPUs + 4) threads.
FSYNC_JOBS = 4
LOGS_PER_JOB = 8

# The outcome of every round of a cancelled job.
_CANCELLED = asyncio.CancelledError()


class GroupCommitFlusher:
    def __init__(self) -> None:
        self._inflight: dict[PartitionLog, asyncio.Future[Any]] = {}
        self._starting: list[tuple[PartitionLog, asyncio.Future[Any]]] = []   # rounds to start this turn
        self._unstarted: set[asyncio.Future[Any]] = set()    # the rounds of _starting
        # A round queued behind its log's running round: the round ahead of it.
        self._ahead: dict[asyncio.Future[Any], asyncio.Future[Any]] = {}
        self.rounds = 0   # fsync rounds started (for metrics and tests)

    async def sync(self, plog: PartitionLog, upto_offset: int, failures: int | None = None,
                   stamp: int | None = None) -> None:
        """Return once plog.flushed_offset >= upto_offset (capped at the log end).

        Raises StorageError (to every waiter of the failed round) when the fsync fails,
        and when any fsync of the log failed (plog.fsync_failures moved past
        `failures`, by default its count now) before the records were on disk: a failed
        fsync may have dropped their pages, whoever's round it was, and a later fsync
        that succeeds proves nothing about them. A failed write is cut back and drops
        no other record's pages: it does not count.
        With `stamp`, the AppendInfo.fsync_stamp of the append (a log that cuts back the
        tail a failed fsync left untrusted, storage.fsync_repair), the answer is exact:
        StorageError exactly when the records are lost or bound to be cut back, whenever
        the failure came, even before this call (no count to compare then).
        Cancelling a waiter does not cancel the shared fsync.
        """
        if failures is None:
            failures = plog.fsync_failures
        repair = plog.fsync_repair
        # An untrusted tail is fsynced by no round until it is cut back: nothing to wait for.
        try:
            while plog.flushed_offset < min(upto_offset, plog.log_end_offset) and repair.trusted:
                await asyncio.shield(self._round(plog))
        finally:
            if not repair.trusted:
                _cut_back(plog)
        if stamp is not None:
            if repair.lost(stamp, upto_offset) or plog.flushed_offset < upto_offset:
                raise StorageError(f"{plog.directory}: an fsync of the log failed before records up to "
                                   f"{upto_offset} were on disk; they are cut back and must be written again")
        elif plog.fsync_failures != failures or plog.flushed_offset < min(upto_offset, plog.log_end_offset):
            raise StorageError(f"{plog.directory}: an fsync of the log failed while records up to "
                               f"{upto_offset} waited for their fsync; they may not be on disk")

    def start_each(self, targets: list[tuple[PartitionLog, int]]) -> Begun:
        """For each target, the fsync round it needs (None: already flushed), asked for
        now so that it starts at the end of this turn of the loop, and the log's failure
        count now; give them to sync_each. A Produce asks at once, not when its answer's
        turn to be written comes: a connection's answers go out in request order, and a
        round asked for only then would wait for every earlier answer of the connection,
        fsync after fsync."""
        return [(self._round(plog) if plog.flushed_offset < min(upto, plog.log_end_offset) else None,
                 plog.fsync_failures) for plog, upto in targets]

    async def sync_each(self, targets: list[tuple[PartitionLog, int]],
                        begun: Begun | None = None, stamps: Stamps = None) -> list[StorageError | None]:
        """sync() for several logs: every round they need starts first (in one
        turn of the loop, _start_rounds; or `begun`, from start_each), then each is
        awaited in turn (with its `stamps` entry, as sync's `stamp`). One waiter instead of a task per log: a Produce naming many
        partitions pays for its fsyncs, not for a task each. The outcome per target,
        in order: None, or the StorageError of its round."""
        # Each round started for a target is awaited itself, not left to sync(): one that
        # failed and was already cleared from _inflight would otherwise be followed by
        # a new round whose success hid the failure (a retried fsync proves nothing).
        if begun is None:
            begun = self.start_each(targets)
        out: list[StorageError | None] = []
        for i, ((plog, upto), (fut, failures)) in enumerate(zip(targets, begun)):
            try:
                if fut is not None:
                    await asyncio.shield(fut)
                await self.sync(plog, upto, failures, None if stamps is None else stamps[i])
                out.append(None)
            except StorageError as exc:
                out.append(exc)
        return out

    def _round(self, plog: PartitionLog) -> asyncio.Future[Any]:
        """The round that covers what plog holds now: its round not handed to a worker
        yet, or a new one. A log has at most two rounds in flight: when its round is
        already running, whose snapshot of the log end may predate the caller's append,
        the next round starts now, queued behind it (its worker waits for the log's
        io_lock), rather than after the loop hears that the running one ended: that is
        two hand-offs between threads less for about 1% of acks=all requests at 10k
        records/s. A caller that comes while two are in flight joins the second, and
        sync() asks again if it did not cover it."""
        fut = self._inflight.get(plog)
        # A finished round stays in _inflight until its done-callback runs on
        # the next loop iteration, and awaiting a finished future does not yield:
        # reusing it here would spin forever without letting the loop run.
        if fut is not None and not fut.done():
            ahead = self._ahead.get(fut)
            if fut in self._unstarted or (ahead is not None and not ahead.done()):
                return fut
        else:
            fut = None
        self.rounds += 1
        loop = asyncio.get_running_loop()
        new = loop.create_future()
        if not self._starting:
            loop.call_soon(self._start_rounds)
        self._starting.append((plog, new))
        self._unstarted.add(new)
        self._inflight[plog] = new
        if fut is not None:
            self._ahead[new] = fut
        new.add_done_callback(functools.partial(self._round_done, plog))
        return new

    def _start_rounds(self) -> None:
        """The rounds asked for during one turn of the loop go to worker threads, dealt
        over up to FSYNC_JOBS jobs (more when there are more than FSYNC_JOBS x
        LOGS_PER_JOB logs), each job fsyncing its logs one after another. A job is one
        hand-off to a thread and one wake-up of the loop, whatever its number of logs
        (each hand-off costs the broker more CPU than the fsync's own work on a small
        append); but a round is answered only when its whole job ends, so a few small
        jobs in parallel answer sooner than one long one: on 2 cores, 5 logs in one
        job put a p99 of 11.6 ms on the job where 4 jobs took 6.6 ms. While a job
        runs, the next appends to its logs gather for the next round."""
        batch, self._starting = self._starting, []
        self._unstarted.clear()
        loop = asyncio.get_running_loop()
        jobs = min(len(batch), max(FSYNC_JOBS, -(-len(batch) // LOGS_PER_JOB)))
        for part in (batch[i::jobs] for i in range(jobs)):
            job = loop.run_in_executor(None, _flush_each, [plog for plog, _ in part])
            job.add_done_callback(functools.partial(self._settle_job, part))

    def _settle_job(self, batch: list[tuple[PartitionLog, asyncio.Future[Any]]], job: asyncio.Future[Any]) -> None:
        """Each round's outcome from the worker's job (a cancelled job cancels them all)."""
        outcomes = _CANCELLED if job.cancelled() else (job.exception() or job.result())
        for i, (_, fut) in enumerate(batch):
            self._settle(fut, outcomes if isinstance(outcomes, BaseException) else outcomes[i])

    @staticmethod
    def _settle(fut: asyncio.Future[Any], outcome: BaseException | None) -> None:
        """Settle a round: None, its fsync succeeded; _CANCELLED, cancel it; else its
        error. A round queued behind a failed one may succeed: its waiters still fail,
        by the log's failure count (sync)."""
        if fut.done():
            return
        if outcome is _CANCELLED:
            fut.cancel()
        elif outcome is None:
            fut.set_result(None)
        else:
            fut.set_exception(outcome)

    def _round_done(self, plog: PartitionLog, fut: asyncio.Future[Any]) -> None:
        if self._inflight.get(plog) is fut:
            del self._inflight[plog]
        self._ahead.pop(fut, None)
        if not fut.cancelled():
            fut.exception()  # mark retrieved: waiters (if any are left) got it already

    async def run_interval_flush(self, logs_provider: Callable[[], Iterable[PartitionLog]],
                                 interval_ms: int) -> None:
        """Forever: every interval_ms, flush each log that has unflushed data
        (logs in flush_mode "never" are left to the OS). Errors are logged, not raised."""
        while True:
            await asyncio.sleep(interval_ms / 1000.0)
            await self.flush_all(logs_provider())

    async def flush_all(self, logs: Iterable[PartitionLog]) -> None:
        for plog in list(logs):
            if plog.closed or plog.config.flush_mode == "never":
                continue
            if plog.flushed_offset < plog.log_end_offset:
                try:
                    await self.sync(plog, plog.log_end_offset)
                except StorageError as exc:
                    log.warning("interval flush of %s failed: %s", plog.directory, exc)


def _cut_back(plog: PartitionLog) -> None:
    """The loop learned that an fsync of plog failed: cut the tail it left untrusted back
    now (what the next write would do first, storage.fsync_repair), so that a
    coordinator, which fails such a write and leaves its memory as it was, finds its log
    saying the same at once. A cut-back that fails takes the log offline, which its
    next write reports."""
    if plog.closed:
        return
    try:
        plog.check_writable()
    except StorageError as exc:
        log.error("%s: %s", plog.directory, exc)


def _flush_each(logs: list[PartitionLog]) -> list[BaseException | None]:
    """Worker thread: flush every log in turn; each one's failure, or None."""
    out: list[BaseException | None] = []
    for plog in logs:
        try:
            plog.flush(checkpoint_later=True)
            out.append(None)
        except Exception as exc:   # that log's round fails; the others' go on
            out.append(exc)
    return out


async def run_interval_flush(logs_provider: Callable[[], Iterable[PartitionLog]], interval_ms: int,
                             flusher: GroupCommitFlusher | None = None) -> None:
    """Task body for flush_mode "interval"; share the broker's flusher to group with acks=all."""
    await (flusher or GroupCommitFlusher()).run_interval_flush(logs_provider, interval_ms)
