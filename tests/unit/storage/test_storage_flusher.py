"""Group commit: concurrent waiters share fsyncs; failures reach every waiter."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from storage_helpers import append, batch

from semel.storage import GroupCommitFlusher, LogConfig, PartitionLog, StorageError
from semel.storage.flusher import FSYNC_JOBS, LOGS_PER_JOB
from semel.storage.fs import FaultyFileSystem

CFG = LogConfig(checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)


async def producer(plog: PartitionLog, flusher: GroupCommitFlusher, i: int) -> int:
    info = append(plog, batch(b"v%d" % i))
    await flusher.sync(plog, info.last_offset + 1)
    assert plog.flushed_offset > info.last_offset
    return info.last_offset


def test_many_waiters_share_few_fsyncs(p, fs):
    async def main():
        flusher = GroupCommitFlusher()
        done = await asyncio.gather(*(producer(p, flusher, i) for i in range(200)))
        return flusher, done
    fs.fsync_delay_s = 0.002          # a disk slow enough for waiters to pile up
    flusher, done = asyncio.run(main())
    assert sorted(done) == list(range(200))
    data_fsyncs = fs.count("fsync", ".log")
    assert 1 <= data_fsyncs <= 3, data_fsyncs
    assert flusher.rounds == data_fsyncs


def test_waves_of_waiters_each_need_at_most_one_more_round(p, fs):
    async def main():
        flusher = GroupCommitFlusher()
        for wave in range(5):
            await asyncio.gather(*(producer(p, flusher, wave * 50 + i) for i in range(50)))
        return flusher
    flusher = asyncio.run(main())
    assert fs.count("fsync", ".log") <= 2 * 5
    assert 5 <= flusher.rounds <= 2 * 5
    assert p.flushed_offset == p.log_end_offset == 250


def test_already_flushed_needs_no_fsync(p, fs):
    append(p, batch(b"a"))
    p.flush()
    n = fs.count("fsync")
    asyncio.run(GroupCommitFlusher().sync(p, 1))
    asyncio.run(GroupCommitFlusher().sync(p, 10**9))   # beyond the end: capped, no hang
    assert fs.count("fsync") == n


def test_fsync_failure_reaches_every_waiter_and_the_next_round_recovers(p, fs):
    async def main():
        flusher = GroupCommitFlusher()
        fs.fail_next_fsync(path_contains=".log")
        first = await asyncio.gather(*(producer(p, flusher, i) for i in range(20)), return_exceptions=True)
        second = await asyncio.gather(*(producer(p, flusher, 100 + i) for i in range(5)))
        return first, second
    fs.fsync_delay_s = 0.002
    first, second = asyncio.run(main())
    failed = [r for r in first if isinstance(r, StorageError)]
    assert failed and all(isinstance(r, (StorageError, int)) for r in first)
    # everyone who shared the failed fsync got the error; nobody was told "durable" for it
    assert len(second) == 5 and p.flushed_offset == p.log_end_offset


def test_a_cancelled_waiter_does_not_cancel_the_fsync(p, fs):
    async def main():
        flusher = GroupCommitFlusher()
        info = append(p, batch(b"a"))
        w1 = asyncio.ensure_future(flusher.sync(p, info.last_offset + 1))
        w2 = asyncio.ensure_future(flusher.sync(p, info.last_offset + 1))
        await asyncio.sleep(0)
        w1.cancel()
        await w2
        return w1
    fs.fsync_delay_s = 0.01
    w1 = asyncio.run(main())
    assert w1.cancelled() and p.flushed_offset == 1


def test_sync_each_runs_the_logs_rounds_together_and_reports_each_outcome(tmp_path, fs):
    """Several logs at once: every round starts before any is awaited, a log
    already on disk needs none, and a failed fsync is that log's outcome only."""
    logs = [PartitionLog.open(tmp_path / f"{'failing' if i == 1 else 'log'}-{i}", CFG, fs) for i in range(4)]
    targets = []
    for i, plog in enumerate(logs):
        info = append(plog, batch(b"x%d" % i))
        targets.append((plog, info.last_offset + 1))
    logs[3].flush()                              # on disk already: no round for it
    fs.fail_next_fsync(path_contains="failing-1")

    async def main():
        flusher = GroupCommitFlusher()
        waiter = asyncio.ensure_future(flusher.sync_each(targets))
        await asyncio.sleep(0)                   # its first step: up to the first wait
        started = len(flusher._inflight)         # every round under way before any is awaited
        return flusher, started, await waiter
    fs.fsync_delay_s = 0.01
    flusher, started, out = asyncio.run(main())
    assert started == 3
    assert [type(x) for x in out] == [type(None), StorageError, type(None), type(None)]
    assert flusher.rounds == 3
    assert [plog.flushed_offset for plog in logs] == [1, 0, 1, 1]
    # No later fsync vouches for the failed one's tail (storage/fsync_repair.py)...
    out = asyncio.run(GroupCommitFlusher().sync_each(targets))
    assert [type(x) for x in out] == [type(None), StorageError, type(None), type(None)]
    assert logs[1].flushed_offset == 0
    info = append(logs[1], batch(b"x1"))     # ...its next write cuts it back: the retry lands at 0
    assert info.first_offset == 0
    out = asyncio.run(GroupCommitFlusher().sync_each([(logs[1], 1)], stamps=[info.fsync_stamp]))
    assert out == [None] and logs[1].flushed_offset == 1
    for plog in logs:
        plog.close()


class _ThreadNotingFs(FaultyFileSystem):
    """Which thread fsyncs each log file."""

    def __init__(self):
        super().__init__()
        self.threads: dict[str, int] = {}

    def fsync(self, f):
        if f.path.endswith(".log"):
            self.threads[str(f.path)] = threading.get_ident()
        super().fsync(f)


class _CountingExecutor(ThreadPoolExecutor):
    jobs = 0

    def submit(self, *args, **kwargs):
        self.jobs += 1
        return super().submit(*args, **kwargs)


def _rounds_in_one_turn(tmp_path, n: int) -> tuple[list[int], int]:
    """Rounds for n logs asked for in one turn of the loop: the thread that fsynced each
    log, in the logs' order, and how many worker jobs ran."""
    fs = _ThreadNotingFs()
    logs = [PartitionLog.open(tmp_path / f"log-{i}", CFG, fs) for i in range(n)]
    targets = [(plog, append(plog, batch(b"x")).last_offset + 1) for plog in logs]
    executor = _CountingExecutor(4)

    async def main():
        asyncio.get_running_loop().set_default_executor(executor)
        flusher = GroupCommitFlusher()
        return await asyncio.gather(flusher.sync_each(targets[:-1]), flusher.sync(logs[-1], 1))
    asyncio.run(main())
    assert [plog.flushed_offset for plog in logs] == [1] * n
    threads = [next(t for path, t in fs.threads.items() if path.startswith(f"{plog.directory}/"))
               for plog in logs]
    for plog in logs:
        plog.close()
    return threads, executor.jobs


def test_a_few_rounds_asked_for_in_one_turn_run_in_parallel_jobs(tmp_path):
    """Up to FSYNC_JOBS rounds of one turn: a job each, so no answer waits for
    another log's fsync."""
    threads, jobs = _rounds_in_one_turn(tmp_path, 3)
    assert jobs == 3


def test_rounds_of_one_turn_are_dealt_over_fsync_jobs(tmp_path):
    """More rounds than FSYNC_JOBS share the jobs: each job's logs are fsynced by one
    thread, in turn (one hand-off per job, not per log)."""
    n = 2 * FSYNC_JOBS
    threads, jobs = _rounds_in_one_turn(tmp_path, n)
    assert jobs == FSYNC_JOBS
    for i in range(FSYNC_JOBS):
        assert len(set(threads[i::FSYNC_JOBS])) == 1


def test_many_rounds_in_one_turn_are_spread_over_jobs_of_a_few_logs(tmp_path):
    """A request naming many partitions waits for a few fsyncs in a row, not all of them:
    each job holds at most LOGS_PER_JOB logs, fsynced by one thread."""
    n = FSYNC_JOBS * LOGS_PER_JOB + 1
    threads, jobs = _rounds_in_one_turn(tmp_path, n)
    assert jobs == FSYNC_JOBS + 1
    for i in range(jobs):    # a job's logs in one thread, in turn
        assert len(threads[i::jobs]) <= LOGS_PER_JOB and len(set(threads[i::jobs])) == 1


def test_interval_flush_flushes_logs_with_unflushed_data(tmp_path, fs):
    logs = [PartitionLog.open(tmp_path / f"t-{i}", CFG.with_overrides(flush_mode=mode), fs)
            for i, mode in enumerate(["interval", "never", "always"])]
    for plog in logs:
        append(plog, batch(b"x"))

    async def main():
        flusher = GroupCommitFlusher()
        task = asyncio.ensure_future(flusher.run_interval_flush(lambda: logs, 1))
        for _ in range(10_000):   # bounded: a broken flusher fails here instead of hanging
            if logs[0].flushed_offset >= 1 and logs[2].flushed_offset >= 1:
                break
            await asyncio.sleep(0.001)
        task.cancel()
    asyncio.run(main())
    assert [plog.flushed_offset for plog in logs] == [1, 0, 1]
    for plog in logs:
        plog.close()



class _Trusted:
    """A log's FsyncRepair where no fsync ever failed."""
    trusted = True

    def lost(self, stamp, upto):
        return False


class _CountingLog:
    def __init__(self):
        self.flushed_offset = 0
        self.log_end_offset = 5
        self.flushes = 0
        self.storage_failures = 0
        self.fsync_failures = 0
        self.fsync_repair = _Trusted()

    def flush(self, checkpoint_later=False):
        self.flushes += 1
        self.flushed_offset = self.log_end_offset
        return self.flushed_offset


@pytest.mark.timeout(20)
def test_sync_in_the_window_before_a_finished_round_is_cleared_starts_a_new_round():
    """Regression: between a flush round finishing and its done-callback running,
    the finished task is still listed in-flight. A sync() called in that window
    (another request's callback ran first) awaited it — which never yields — and
    spun forever, freezing the broker's event loop."""
    plog = _CountingLog()

    async def main():
        flusher = GroupCommitFlusher()
        finished = asyncio.get_running_loop().create_future()
        finished.set_result(0)                 # a round that already ran, flushing nothing new
        flusher._inflight[plog] = finished     # ...and whose callback has not run yet
        await asyncio.wait_for(flusher.sync(plog, 5), 5)

    asyncio.run(main())
    assert plog.flushes == 1 and plog.flushed_offset == 5


def test_a_round_begun_early_reports_its_failure_after_it_was_cleared(p, fs):
    """start_each asks for the round when the request is handled; its answer awaits it
    later, when the round may have failed and left the flusher. The failure still
    reaches that answer: a fresh round that succeeded would not prove the data safe."""
    async def main():
        flusher = GroupCommitFlusher()
        info = append(p, batch(b"a"))
        targets = [(p, info.last_offset + 1)]
        begun = flusher.start_each(targets)
        assert begun[0][0] is not None and p in flusher._inflight
        for _ in range(1000):              # the round fails and its done-callback clears it
            if not flusher._inflight:
                break
            await asyncio.sleep(0.001)
        assert not flusher._inflight and begun[0][0].done()
        failed = await flusher.sync_each(targets, begun)
        again = await flusher.sync_each(targets)        # not begun early: no round vouches for it
        retry = append(p, batch(b"a"))                   # cut back first, then written again
        return failed, again, retry, await flusher.sync_each([(p, 1)], stamps=[retry.fsync_stamp])
    fs.fail_next_fsync(path_contains=".log")
    failed, again, retry, last = asyncio.run(main())
    assert isinstance(failed[0], StorageError) and isinstance(again[0], StorageError)
    assert retry.first_offset == 0 and last == [None] and p.flushed_offset == 1


def test_start_each_begins_only_the_rounds_still_needed(tmp_path, fs):
    """A log already flushed up to its target needs no round; the others are under way
    before anything is awaited, and sync_each with them starts no more."""
    logs = [PartitionLog.open(tmp_path / f"log-{i}", CFG, fs) for i in range(3)]
    targets = [(plog, append(plog, batch(b"x")).last_offset + 1) for plog in logs]
    logs[0].flush()

    async def main():
        flusher = GroupCommitFlusher()
        begun = flusher.start_each(targets)
        assert begun[0][0] is None and all(f is not None and not f.done() for f, _ in begun[1:])
        out = await flusher.sync_each(targets, begun)
        return flusher, out
    flusher, out = asyncio.run(main())
    assert out == [None] * 3 and flusher.rounds == 2
    assert [plog.flushed_offset for plog in logs] == [1, 1, 1]
    for plog in logs:
        plog.close()


class _HeldCheckpointFs(FaultyFileSystem):
    """Holds every recovery-checkpoint write until `release` is set."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()
        self.checkpoints = 0

    def write_atomic(self, path, data, *, sync_dir=True):
        if str(path).endswith("recovery.checkpoint"):
            assert self.release.wait(10)
            self.checkpoints += 1
        super().write_atomic(path, data, sync_dir=sync_dir)


def test_a_due_checkpoint_is_written_after_the_round_answers(tmp_path):
    """A round answers its waiters after its fsync; a recovery checkpoint that has come
    due (three more fsyncs) is written by the log's background job, not on the answer's
    path, and it is written."""
    fs = _HeldCheckpointFs()
    plog = PartitionLog.open(tmp_path / "t-0", CFG.with_overrides(checkpoint_interval_bytes=1), fs)
    fs.checkpoints = 0                 # whatever open() wrote

    async def main():
        flusher = GroupCommitFlusher()
        info = append(plog, batch(b"a"))
        await asyncio.wait_for(flusher.sync(plog, info.last_offset + 1), 5)
    asyncio.run(main())
    assert plog.flushed_offset == 1 and fs.checkpoints == 0    # answered, checkpoint still held
    fs.release.set()
    for _ in range(1000):
        if fs.checkpoints:
            break
        threading.Event().wait(0.005)
    assert fs.checkpoints == 1
    plog.close()
