"""append_async: a large append's pwrite, and the roll of a full segment
(its fsyncs), run in a worker thread while the event loop goes on. Seeded random
interleavings of idempotent producers (with retries of their last batch), transaction
markers written synchronously in the middle of a pending write or roll, group-commit
flushes, slow and failing writes, slow fsyncs, and readers; after every step:

- the log reads back as contiguous offsets up to its end, every byte below the end
  is a whole, CRC-correct batch, and nothing is readable at or past the end;
- offsets were assigned in call order: each append answered got offsets above
  every append answered before it was called, except those the log cut back after
  a failed fsync (their offsets are written again: storage/fsync_repair.py);
- every acknowledged batch (answered, then flushed) is in the log exactly once at
  the offsets it was given, and a retry of it got those same offsets;
- acknowledged == durable: when the flush returns, the batch lies wholly within the
  bytes of its segment file that an fsync covered;
- half the appends are write-through (sync=True: the worker thread fsyncs after its
  pwrite, and some of those fsyncs fail): after every step, every batch below the
  flushed offset lies within fsynced bytes, whichever path moved it;
- flushed offset <= log end; after close and reopen every acknowledged batch is still there.

Run twice per seed: with the real worker pool (thread timing decides), and with a
StepRunner in its place, where the seed alone decides when each pwrite, write-through
fsync, roll and background checkpoint runs (at a random step, or when a synchronous
mutator waits for it), so every run of a seed takes the same path.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
import threading

import pytest

from semel.protocol.records import CONTROL_COMMIT, crc_ok, iter_batches, split_batches
from semel.storage import FaultyFileSystem, LogConfig, PartitionLog
from semel.storage.errors import AppendError, StorageError
from semel.storage.flusher import GroupCommitFlusher
from semel.storage.write_offload import OFFLOOP_WRITE_BYTES

from storage_helpers import batch
from tests.support.step_runner import StepRunner

CFG = LogConfig(segment_bytes=600_000, index_interval_bytes=4096)


class SlowFaultyFS(FaultyFileSystem):
    """pwrites and fsyncs sleep a random while (in worker threads) so the loop
    interleaves; each fsync of a file records how many of its bytes it covered."""

    def __init__(self, rng: random.Random):
        super().__init__()
        self.rng = rng
        self.synced: dict[str, int] = {}

    def pwrite(self, f, data, offset):
        if len(data) >= OFFLOOP_WRITE_BYTES:
            time.sleep(self.rng.random() * 0.004)
        super().pwrite(f, data, offset)

    def fsync(self, f):
        size = os.fstat(f.fd).st_size
        time.sleep(self.rng.random() * 0.002)
        super().fsync(f)
        # max: two fsyncs of one file can overlap (a flusher round and a write-through
        # append) and end in either order; each covers what was written before it began.
        self.synced[str(f.path)] = max(size, self.synced.get(str(f.path), 0))


def durable(fs: SlowFaultyFS, plog: PartitionLog, first: int, last: int) -> bool:
    """Is the batch first..last wholly inside the fsynced bytes of its segment file?"""
    path = plog.segment_path(first)
    with open(path, "rb") as f:
        data = f.read(fs.synced.get(path, 0))
    return any(h.base_offset == first and h.last_offset == last for _, h in iter_batches(data))


def check_log(plog: PartitionLog) -> dict[int, tuple[int, bytes]]:
    """Walk the log; return {base offset: (last offset, value of the first record)}."""
    found, offset = {}, plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 22)
        assert data, f"nothing readable at {offset} below the log end {plog.log_end_offset}"
        for pos, hdr in iter_batches(data):
            assert hdr.base_offset == offset, (hdr.base_offset, offset)
            assert crc_ok(data, pos, hdr.size)
            found[hdr.base_offset] = (hdr.last_offset, bytes(data[pos + 61:pos + 61 + 16]))
            offset = hdr.last_offset + 1
    assert offset == plog.log_end_offset
    assert plog.read(plog.log_end_offset, 1 << 20) == b""
    assert plog.flushed_offset <= plog.log_end_offset
    return found


async def scenario(tmp_path, seed: int, stepped: bool = False) -> None:
    rng = random.Random(seed)
    fs = SlowFaultyFS(rng)
    runner = StepRunner() if stepped else None
    plog = PartitionLog.open(tmp_path / f"s{seed}", CFG, fs, runner=runner)
    flusher = GroupCommitFlusher()
    acked: dict[tuple[int, int], tuple[int, int]] = {}      # (pid, seq) -> (first, last offset)
    answered: list[tuple[int, int, int, int | None]] = []    # (call number, first, last, fsync stamp)
    calls = 0
    seqs = {pid: 0 for pid in (1, 2, 3)}
    last_sent: dict[int, tuple[bytes, int]] = {}
    txn_pid = 9
    txn_seq = 0

    async def produce(pid: int, retry: bool) -> None:
        nonlocal calls
        if retry and pid in last_sent:
            raw, seq = last_sent[pid]
        else:
            seq = seqs[pid]
            big = rng.random() < 0.6
            n = rng.randint(20, 90) if big else rng.randint(1, 3)
            raw = batch([b"p%d-s%06d-" % (pid, seq) + b"v" * 1000] * n, pid=pid, epoch=0, seq=seq)
            seqs[pid] = seq + n
            last_sent[pid] = raw, seq
        calls += 1
        me = calls
        called_after = [(first, last, stamp) for _, first, last, stamp in answered]
        if rng.random() < 0.1:
            fs.fail_next_write(1, ".log", partial=rng.random() < 0.5)
        if rng.random() < 0.08:
            fs.fail_next_fsync(1, ".log")
        batches, err = split_batches(raw)
        assert err == 0
        try:
            info = await plog.append_async(raw, batches, sync=rng.random() < 0.5)
        except AppendError:
            fs.clear_faults()
            seqs[pid] = min(seqs[pid], seq)   # nothing written: the producer resends from here
            last_sent.pop(pid, None)
            return
        if not info.duplicate:
            # Offsets in call order: above everything answered before this call.
            assert all(info.first_offset > last for _, last, stamp in called_after
                       if not plog.fsync_repair.lost(stamp, last + 1))
        answered.append((me, info.first_offset, info.last_offset, info.fsync_stamp))
        try:
            await flusher.sync(plog, info.last_offset + 1, stamp=info.fsync_stamp)
        except StorageError:
            fs.clear_faults()
            return                            # not acknowledged: the producer retries it later
        assert durable(fs, plog, info.first_offset, info.last_offset), "acknowledged before durable"
        key = (pid, seq)
        if key in acked:
            assert acked[key] == (info.first_offset, info.last_offset), "a retry got other offsets"
        acked[key] = (info.first_offset, info.last_offset)

    def marker() -> None:
        nonlocal txn_seq
        # A transactional batch then its commit marker, written synchronously while
        # an append may be waiting on its worker thread.
        raw = batch([b"t-%06d" % txn_seq], pid=txn_pid, epoch=0, seq=txn_seq, txn=True)
        batches, _ = split_batches(raw)
        try:
            plog.append(raw, batches)
            txn_seq += 1
            plog.append_control(CONTROL_COMMIT, txn_pid, 0, 0)
        except AppendError:
            fs.clear_faults()

    tasks: list[asyncio.Task] = []
    try:
        for _ in range(60):
            r = rng.random()
            if r < 0.6:
                tasks.append(asyncio.create_task(produce(rng.choice((1, 2, 3)), retry=rng.random() < 0.2)))
            elif r < 0.75:
                marker()
            elif runner is not None:
                runner.release_random(rng)      # a worker thread gets the CPU
            await asyncio.sleep(0 if stepped else rng.random() * 0.003)
            found = check_log(plog)
            for first, last in acked.values():
                assert found.get(first, (None,))[0] == last
            flushed = plog.flushed_offset
            for first, (last, _) in found.items():
                if last < flushed:
                    assert durable(fs, plog, first, last), f"flushed offset {flushed} covers unsynced {first}"
        while runner is not None and not all(t.done() for t in tasks):
            runner.release_random(rng)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        if runner is not None:
            runner.release_all()            # a background checkpoint still queued
        fs.clear_faults()
        found = check_log(plog)
        for first, last in acked.values():
            assert found[first][0] == last
        # Exactly once: no two acknowledged (pid, seq) share offsets, none appears twice.
        spans = sorted(acked.values())
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))
        plog.close()
        fs.clear_faults()
        again = PartitionLog.open(tmp_path / f"s{seed}", CFG, FaultyFileSystem())
        try:
            reopened = check_log(again)
            for first, last in acked.values():
                assert reopened[first][0] == last
        finally:
            again.close()
    finally:
        for t in tasks:
            t.cancel()
        if not plog.closed:
            plog.close()


@pytest.mark.parametrize("stepped", [False, True], ids=["pool", "stepped"])
@pytest.mark.parametrize("seed", range(12))
def test_random_interleavings_keep_offsets_ordered_and_acked_durable(tmp_path, seed, stepped):
    asyncio.run(scenario(tmp_path, seed, stepped))


def test_a_synchronous_append_waits_for_the_pending_write_and_lands_after_it(tmp_path):
    async def run():
        fs = SlowFaultyFS(random.Random(1))
        plog = PartitionLog.open(tmp_path / "t", CFG, fs)
        try:
            big = batch([b"b" * 1000] * 80)
            task = asyncio.create_task(plog.append_async(big, split_batches(big)[0]))
            await asyncio.sleep(0)          # the big write is now in a worker thread
            assert plog.write_pending and plog.log_end_offset == 0
            small = batch([b"s"])
            info = plog.append(small, split_batches(small)[0])
            assert info.first_offset == 80   # after the pending write, which settled first
            assert (await task).first_offset == 0
            assert sorted(check_log(plog)) == [0, 80]
        finally:
            plog.close()
    asyncio.run(run())


class GatedFS(FaultyFileSystem):
    """fsyncs of segment files wait on `gate` (in the worker thread doing a roll)."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def fsync(self, f):
        if str(f.path).endswith(".log") and not self.gate.is_set():
            self.entered.set()
            self.gate.wait(10)
        super().fsync(f)


def _fill(plog: PartitionLog, next_size: int) -> None:
    """Appends until an append of next_size bytes rolls the segment."""
    while plog.segments[-1].size + next_size <= CFG.segment_bytes:
        left = CFG.segment_bytes - plog.segments[-1].size - next_size
        raw = batch([b"f" * 1000] * max(1, min(60, left // 1100)))
        plog.append(raw, split_batches(raw)[0])


@pytest.mark.parametrize("records", [90, 1])
def test_a_roll_runs_off_the_loop_and_a_marker_meanwhile_lands_after_it(tmp_path, records):
    """While a roll's fsync is held in its worker thread the loop keeps running; a
    marker written meanwhile waits for the roll, lands first in the new segment, and
    the append that rolled comes after it. A small append that rolls goes the same way."""
    async def run():
        fs = GatedFS()
        plog = PartitionLog.open(tmp_path / "r", CFG, fs)
        try:
            big = batch([b"b" * 1000] * records)
            _fill(plog, len(big))
            end = plog.log_end_offset
            fs.gate.clear()
            task = asyncio.create_task(plog.append_async(big, split_batches(big)[0]))
            while not fs.entered.is_set():
                await asyncio.sleep(0.001)    # the loop runs while the roll's fsync waits
            assert plog._offload.pending_roll is not None and not task.done()
            txn = batch([b"t"], pid=9, epoch=0, seq=0, txn=True)
            # A thread opens the gate: the append below blocks the loop until the roll ends.
            release = threading.Timer(0.05, fs.gate.set)
            release.start()
            plog.append(txn, split_batches(txn)[0])      # waits for the roll, then lands
            marker = plog.append_control(CONTROL_COMMIT, 9, 0, 0)
            release.join()
            assert plog.segment_bases[-1] == end                 # the new segment starts at the old end
            assert marker.first_offset == end + 1
            info = await task
            assert info.first_offset == end + 2 and plog.flushed_offset >= end
            check_log(plog)
        finally:
            fs.gate.set()
            plog.close()
    asyncio.run(run())


def on_fresh_log(tmp_path, body) -> None:
    """asyncio.run(body(plog, fs)) on a new log over a FaultyFileSystem; closed after."""
    async def run():
        fs = FaultyFileSystem()
        plog = PartitionLog.open(tmp_path / "f", CFG, fs)
        try:
            await body(plog, fs)
        finally:
            plog.close()
    asyncio.run(run())


def test_a_failed_roll_fails_the_append_and_writes_nothing(tmp_path):
    async def body(plog, fs):
        big = batch([b"b" * 1000] * 90)
        _fill(plog, len(big))
        plog.flush()   # durable first: a failed fsync cuts back an unflushed tail (fsync_repair)
        end, bases = plog.log_end_offset, plog.segment_bases
        fs.fail_next_fsync(1, ".log")
        with pytest.raises(AppendError):
            await plog.append_async(big, split_batches(big)[0])
        assert plog.log_end_offset == end and plog.segment_bases == bases
        info = await plog.append_async(big, split_batches(big)[0])    # the next one rolls
        assert info.first_offset == end and plog.segment_bases == bases + [end]
        check_log(plog)
    on_fresh_log(tmp_path, body)


def test_a_write_through_append_is_flushed_when_answered_and_checkpoints_off_the_answer(tmp_path):
    """sync=True: one fsync in the write's own worker thread, no flusher round; the
    recovery checkpoint that comes due is written by a background job, so a crash
    right after re-checks only what came after it."""
    from dataclasses import replace

    from semel.storage import checkpoint as cpfile

    async def run():
        fs = FaultyFileSystem()
        plog = PartitionLog.open(tmp_path / "w", replace(CFG, checkpoint_interval_bytes=100_000), fs)
        big = batch([b"b" * 1000] * 80)           # over OFFLOOP_WRITE_BYTES: a worker thread writes it
        assert len(big) >= OFFLOOP_WRITE_BYTES
        fsyncs = fs.count("fsync", ".log")
        info = await plog.append_async(big, split_batches(big)[0], sync=True)
        assert plog.flushed_offset == info.last_offset + 1 == 80
        assert fs.count("fsync", ".log") == fsyncs + 1
        assert plog._offload.checkpoint_job is None        # 80 KB since the last one: not due yet
        again = batch([b"c" * 1000] * 80)
        info = await plog.append_async(again, split_batches(again)[0], sync=True)
        assert plog.flushed_offset == 160
        plog._offload.checkpoint_job.result(10)
        with open(tmp_path / "w" / cpfile.FILE_NAME, "rb") as f:
            assert cpfile.decode(f.read()).recovery_offset == 160
        small = batch([b"s"])                      # on the loop: left to the flusher
        info = await plog.append_async(small, split_batches(small)[0], sync=True)
        assert plog.flushed_offset == 160 and plog.log_end_offset == 161
        plog.abandon()                             # as if killed here
        reopened = PartitionLog.open(tmp_path / "w", CFG, FaultyFileSystem())
        try:
            assert reopened.recovery.used_checkpoint and reopened.log_end_offset >= 160
            assert reopened.recovery.crc_checked_bytes == len(small)   # only what came after it
        finally:
            reopened.close()
    asyncio.run(run())


def test_a_failed_write_through_fsync_fails_the_wait_and_the_retry_is_written_again(tmp_path):
    """The write stays in memory until the next write cuts it back: no later fsync
    vouches for the pages the failed one may have dropped (storage/fsync_repair.py)."""
    async def body(plog, fs):
        big = batch([b"b" * 1000] * 80)
        fs.fail_next_fsync(1, ".log")
        info = await plog.append_async(big, split_batches(big)[0], sync=True)
        assert (info.first_offset, plog.log_end_offset, plog.flushed_offset) == (0, 80, 0)
        with pytest.raises(StorageError):
            await GroupCommitFlusher().sync(plog, 80, stamp=info.fsync_stamp)
        assert plog.flushed_offset == 0
        info = await plog.append_async(big, split_batches(big)[0], sync=True)   # the retry
        assert (info.first_offset, plog.log_end_offset, plog.flushed_offset) == (0, 80, 80)
        await GroupCommitFlusher().sync(plog, 80, stamp=info.fsync_stamp)
    on_fresh_log(tmp_path, body)
