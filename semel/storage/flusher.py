"""Group commit: many acks=all producers waiting on one log share one fsync.

The fsync runs in a worker thread (the loop's default executor; the rounds started
in one turn of the loop are dealt over a few jobs, see _start_rounds) so the event
loop keeps accepting and appending while the disk works. A round answers its waiters
after its fsync; a recovery checkpoint that came due is written by a background job. A waiter whose data arrived after
the running fsync took its snapshot waits for that fsync to end and then joins
the next one, so at most one fsync round per log is in flight and every fsync covers
everyone who arrived while the previous one ran. (A large acks=all append fsyncs
in its own write thread instead: PartitionLog.append_async(sync=True); a flusher
round that finds the log already flushed returns at once.)
"""
from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Callable, Iterable

from .errors import StorageError
from .log import PartitionLog

log = logging.getLogger("semel.storage")

# The round each target of a sync_each waits for (None: it needed none).
Rounds = list["asyncio.Future[Any] | None"]

# The rounds of one loop turn go to at least this many worker jobs in parallel (fewer
# when there are fewer rounds), and no job fsyncs more than LOGS_PER_JOB logs in a row
# (see _start_rounds). The loop's default executor has min(32, CPUs + 4) threads.
FSYNC_JOBS = 4
LOGS_PER_JOB = 8


class GroupCommitFlusher:
    def __init__(self) -> None:
        self._inflight: dict[PartitionLog, asyncio.Future[Any]] = {}
        self._starting: list[tuple[PartitionLog, asyncio.Future[Any]]] = []   # rounds to start this turn
        self.rounds = 0   # fsync rounds started (for metrics and tests)

    async def sync(self, plog: PartitionLog, upto_offset: int) -> None:
        """Return once plog.flushed_offset >= upto_offset (capped at the log end).

        Raises StorageError (to every waiter of the failed round) when the fsync fails.
        Cancelling a waiter does not cancel the shared fsync.
        """
        while plog.flushed_offset < min(upto_offset, plog.log_end_offset):
            await asyncio.shield(self._round(plog))

    def start_each(self, targets: list[tuple[PartitionLog, int]]) -> Rounds:
        """The fsync round each target needs (None: already flushed), asked for now so
        that they start at the end of this turn of the loop; give them to sync_each.
        A Produce asks at once, not when its answer's turn to be written comes: a
        connection's answers go out in request order, and a round asked for only then
        would wait for every earlier answer of the connection, fsync after fsync."""
        return [self._round(plog) if plog.flushed_offset < min(upto, plog.log_end_offset) else None
                for plog, upto in targets]

    async def sync_each(self, targets: list[tuple[PartitionLog, int]],
                        rounds: Rounds | None = None) -> list[StorageError | None]:
        """sync() for several logs: every round they need starts first (in one
        worker job, _start_rounds; or `rounds`, from start_each), then each is awaited
        in turn. One waiter instead of a task per log: a Produce naming many
        partitions pays for its fsyncs, not for a task each. The outcome per target,
        in order: None, or the StorageError of its round."""
        # Each round started for a target is awaited itself, not left to sync(): one that
        # failed and was already cleared from _inflight would otherwise be followed by
        # a new round whose success hid the failure (a retried fsync proves nothing).
        if rounds is None:
            rounds = self.start_each(targets)
        out: list[StorageError | None] = []
        for (plog, upto), fut in zip(targets, rounds):
            try:
                if fut is not None:
                    await asyncio.shield(fut)
                await self.sync(plog, upto)
                out.append(None)
            except StorageError as exc:
                out.append(exc)
        return out

    def _round(self, plog: PartitionLog) -> asyncio.Future[Any]:
        """The log's fsync round in flight, or a new one."""
        fut = self._inflight.get(plog)
        # A finished round stays in _inflight until its done-callback runs on
        # the next loop iteration, and awaiting a finished future does not yield:
        # reusing it here would spin forever without letting the loop run.
        if fut is None or fut.done():
            self.rounds += 1
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            if not self._starting:
                loop.call_soon(self._start_rounds)
            self._starting.append((plog, fut))
            self._inflight[plog] = fut
            fut.add_done_callback(functools.partial(self._round_done, plog))
        return fut

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
        loop = asyncio.get_running_loop()
        jobs = min(len(batch), max(FSYNC_JOBS, -(-len(batch) // LOGS_PER_JOB)))
        for part in (batch[i::jobs] for i in range(jobs)):
            job = loop.run_in_executor(None, _flush_each, [plog for plog, _ in part])
            job.add_done_callback(functools.partial(_settle_rounds_of, part))

    def _round_done(self, plog: PartitionLog, fut: asyncio.Future[Any]) -> None:
        if self._inflight.get(plog) is fut:
            del self._inflight[plog]
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


def _settle_rounds_of(batch: list[tuple[PartitionLog, asyncio.Future[Any]]], job: asyncio.Future[Any]) -> None:
    """Each round's outcome from the worker's job (a cancelled job cancels them all)."""
    outcomes = None if job.cancelled() else (job.exception() or job.result())
    for i, (_, fut) in enumerate(batch):
        if fut.done():
            continue
        if outcomes is None:
            fut.cancel()
        elif isinstance(outcomes, BaseException):
            fut.set_exception(outcomes)
        elif outcomes[i] is not None:
            fut.set_exception(outcomes[i])
        else:
            fut.set_result(None)


async def run_interval_flush(logs_provider: Callable[[], Iterable[PartitionLog]], interval_ms: int,
                             flusher: GroupCommitFlusher | None = None) -> None:
    """Task body for flush_mode "interval"; share the broker's flusher to group with acks=all."""
    await (flusher or GroupCommitFlusher()).run_interval_flush(logs_provider, interval_ms)
