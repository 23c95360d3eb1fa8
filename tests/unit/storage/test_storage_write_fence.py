"""No write handed to a worker can land after the log moved on: every path that
moves a log's file position or log end (role change, truncation, reset, the next
write, retention, DeleteRecords, close, abandon, delete) first waits for the write or
roll a worker holds, even one whose thread has not started yet. The workers are a
StepRunner, so a job runs only when a path waits for it: a path that did not wait
leaves it queued, and the test sees that.
"""
from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from semel.protocol.records import split_batches
from semel.storage import LogConfig, PartitionLog
from semel.storage.errors import AppendError, StorageError
from semel.storage.write_offload import OFFLOOP_WRITE_BYTES

from storage_helpers import batch, dump, fill
from tests.support.step_runner import StepRunner

CFG = LogConfig(segment_bytes=4096, index_interval_bytes=128)


def files_match_memory(plog: PartitionLog) -> None:
    """The segment files hold exactly the bytes the log counts, and read back whole."""
    on_disk = sum(Path(plog.segment_path(b)).stat().st_size for b in plog.segment_bases)
    assert on_disk == plog.size_bytes(), "a segment file holds bytes the log does not count"
    dump(plog)      # every offset up to the log end reads back


def ran_when_waited(runner: StepRunner, job) -> None:
    assert job.done(), "a write handed to a worker is still to run after the log moved on"
    assert job.waited, "the job ran, but not because the path waited for it"
    assert job not in runner.queued


def follower_with_a_write_pending(tmp_path):
    """A leader with 12 records; a follower holding the first 6 with a fetch of the rest
    handed to a worker that has not started."""
    leader = PartitionLog.open(tmp_path / "leader", CFG)
    fill(leader, 12)
    runner = StepRunner()
    f = PartitionLog.open(tmp_path / "follower", CFG, runner=runner)
    f.set_follower(True)
    f.append_replicated(leader.read(0, 1 << 20, upper_bound=6))
    write = f.append_replicated_begin(leader.read(6, 1 << 20))
    assert runner.queued and f.write_pending
    return leader, f, runner, runner.queued[0], write


FOLLOWER_PATHS = {
    "role change": lambda f, leader: f.settle(),
    "truncation below the write": lambda f, leader: f.truncate_to(3),
    "truncation at the write's end": lambda f, leader: f.truncate_to(12),
    "reset": lambda f, leader: f.reset_to(1000),
    "next fetch": lambda f, leader: f.append_replicated(_more(leader, f)),
    "next fetch in a worker": lambda f, leader: f.append_replicated_begin(_more(leader, f)),
    "retention": lambda f, leader: f.enforce_retention(10**13),
    "DeleteRecords": lambda f, leader: f.delete_records_before(1),
    "compaction's segment deletion": lambda f, leader: f.delete_segments_before(1),
    "a marker refused on a follower": lambda f, leader: _refused(f),
    "close": lambda f, leader: f.close(),
    "abandon": lambda f, leader: f.abandon(),
    "delete": lambda f, leader: f.delete(),
}


def _more(leader: PartitionLog, f: PartitionLog) -> bytes:
    """The next fetch: from where the pending write ends (12)."""
    fill(leader, 2)
    return leader.read(12, 1 << 20)


def _refused(f: PartitionLog) -> None:
    with pytest.raises(AppendError):
        f.append_control(1, 5, 0, 0)


@pytest.mark.parametrize("path", FOLLOWER_PATHS)
def test_every_path_waits_for_a_follower_write_whose_thread_has_not_started(tmp_path, path):
    async def run() -> None:
        leader, f, runner, job, write = follower_with_a_write_pending(tmp_path)
        try:
            then = FOLLOWER_PATHS[path](f, leader)
            ran_when_waited(runner, job)
            runner.release_all()
            info = await write          # settled by the path: awaiting it changes nothing
            if asyncio.iscoroutine(then):
                await then              # the path's own write in a worker
            assert info.last_offset == 11
            if not f.closed:
                files_match_memory(f)
                assert f.log_end_offset >= (3 if "truncation below" in path else 12)
        finally:
            runner.release_all()
            for plog in (leader, f):
                if not plog.closed:
                    plog.close()
    asyncio.run(run())


def big(n: int, pid: int = -1, seq: int = -1) -> bytes:
    raw = batch([b"v" * 1000] * n, pid=pid, epoch=0 if pid >= 0 else -1, seq=seq)
    assert len(raw) >= OFFLOOP_WRITE_BYTES
    return raw


LEADER_PATHS = {
    "an append on the loop": lambda p: p.append(raw := batch(b"small"), split_batches(raw)[0]),
    "a marker": lambda p: p.append_control(1, 7, 0, 0),
    "retention": lambda p: p.enforce_retention(10**13),
    "role change": lambda p: p.settle(),
    "close": lambda p: p.close(),
}


@pytest.mark.parametrize("sync", [False, True], ids=["pwrite", "write-through"])
@pytest.mark.parametrize("path", LEADER_PATHS)
def test_every_path_waits_for_a_leader_write_or_roll_in_a_worker(tmp_path, path, sync):
    async def run() -> None:
        runner = StepRunner()
        cfg = LogConfig(segment_bytes=100_000, index_interval_bytes=4096)
        p = PartitionLog.open(tmp_path / "leader", cfg, runner=runner)
        try:
            p.append(raw := batch(b"t", pid=7, epoch=0, seq=0, txn=True), split_batches(raw)[0])
            for n, expect in ((70, "_write_through" if sync else "pwrite"), (70, "roll")):
                raw = big(n)
                task = asyncio.create_task(p.append_async(raw, split_batches(raw)[0], sync=sync))
                while not runner.queued:
                    await asyncio.sleep(0)
                job = runner.queued[0]
                assert getattr(job.fn, "__name__", "") == expect
                LEADER_PATHS[path](p)
                ran_when_waited(runner, job)
                while not task.done():      # the rest of the append: its own write after a roll
                    runner.release_all()
                    await asyncio.sleep(0)
                if p.closed:     # the write was settled by close, or refused after the roll
                    with contextlib.suppress(StorageError):
                        task.result()
                    return
                task.result()
                files_match_memory(p)
        finally:
            runner.release_all()
            if not p.closed:
                p.close()
    asyncio.run(run())
