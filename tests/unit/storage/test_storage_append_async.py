"""append_async (issue 11): a large append's pwrite runs in a worker thread while the
event loop goes on. Seeded random interleavings of idempotent producers (with
retries of their last batch), transaction markers written synchronously in the
middle of a pending write, group-commit flushes, slow and failing writes, and
readers; after every step:

- the log reads back as contiguous offsets up to its end, every byte below the end
  is a whole, CRC-correct batch, and nothing is readable at or past the end;
- offsets were assigned in call order: each append answered got offsets above
  every append answered before it was called;
- every acknowledged batch (answered, then flushed) is in the log exactly once at
  the offsets it was given, and a retry of it got those same offsets;
- flushed offset <= log end; after close and reopen every acknowledged batch is still there.
"""
from __future__ import annotations

import asyncio
import random
import time

import pytest

from semel.protocol.records import CONTROL_COMMIT, crc_ok, iter_batches, split_batches
from semel.storage import FaultyFileSystem, LogConfig, PartitionLog
from semel.storage.errors import AppendError
from semel.storage.flusher import GroupCommitFlusher
from semel.storage.log import OFFLOOP_WRITE_BYTES

from storage_helpers import batch

CFG = LogConfig(segment_bytes=600_000, index_interval_bytes=4096)


class SlowFaultyFS(FaultyFileSystem):
    """pwrites sleep a random while (in the worker thread) so the loop interleaves."""

    def __init__(self, rng: random.Random):
        super().__init__()
        self.rng = rng

    def pwrite(self, f, data, offset):
        if len(data) >= OFFLOOP_WRITE_BYTES:
            time.sleep(self.rng.random() * 0.004)
        super().pwrite(f, data, offset)


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


async def scenario(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    fs = SlowFaultyFS(rng)
    plog = PartitionLog.open(tmp_path / f"s{seed}", CFG, fs)
    flusher = GroupCommitFlusher()
    acked: dict[tuple[int, int], tuple[int, int]] = {}      # (pid, seq) -> (first, last offset)
    answered: list[tuple[int, int, int]] = []                # (call number, first, last)
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
        called_after = [(first, last) for _, first, last in answered]
        if rng.random() < 0.1:
            fs.fail_next_write(1, ".log", partial=rng.random() < 0.5)
        batches, err = split_batches(raw)
        assert err == 0
        try:
            info = await plog.append_async(raw, batches)
        except AppendError:
            fs.clear_faults()
            seqs[pid] = min(seqs[pid], seq)   # nothing written: the producer resends from here
            last_sent.pop(pid, None)
            return
        if not info.duplicate:
            # Offsets in call order: above everything answered before this call.
            assert all(info.first_offset > last for _, last in called_after)
        answered.append((me, info.first_offset, info.last_offset))
        await flusher.sync(plog, info.last_offset + 1)
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
            await asyncio.sleep(rng.random() * 0.003)
            found = check_log(plog)
            for first, last in acked.values():
                assert found.get(first, (None,))[0] == last
        await asyncio.gather(*tasks)
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


@pytest.mark.parametrize("seed", range(12))
def test_random_interleavings_keep_offsets_ordered_and_acked_durable(tmp_path, seed):
    asyncio.run(scenario(tmp_path, seed))


def test_a_synchronous_append_waits_for_the_pending_write_and_lands_after_it(tmp_path):
    async def run():
        fs = SlowFaultyFS(random.Random(1))
        plog = PartitionLog.open(tmp_path / "t", CFG, fs)
        try:
            big = batch([b"b" * 1000] * 80)
            task = asyncio.create_task(plog.append_async(big, split_batches(big)[0]))
            await asyncio.sleep(0)          # the big write is now in a worker thread
            assert plog._pending is not None and plog.log_end_offset == 0
            small = batch([b"s"])
            info = plog.append(small, split_batches(small)[0])
            assert info.first_offset == 80   # after the pending write, which settled first
            assert (await task).first_offset == 0
            assert sorted(check_log(plog)) == [0, 80]
        finally:
            plog.close()
    asyncio.run(run())
