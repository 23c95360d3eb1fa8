"""Property: whatever the interleaving of appends, waiters and fsyncs (some failing), a
group-commit waiter is told "durable" only when the first fsync of its log to start after
its append succeeded, before the answer.

That is the rule a power cut checks (tests/chaos/test_power_loss.py), taken to the
threads: each seed decides the appends, the waiters (a plain sync, or rounds begun at
once and awaited later, as a Produce does), how long each waits, which fsyncs fail and
how long each takes; the worker threads add their own orderings. The first fsync after
an append is the one that may drop its pages when it fails, so a waiter that trusted a
later, successful one (a retry, or a round queued behind a failed one) would be told a
lie. Every waiter's outcome and every fsync are stamped from one counter. The rule is
checked for the waiters that ask in their append's turn of the loop, as a Produce does
(semel.storage.flusher.start_each); those that ask later add load and orderings. Every
waiter hands back its append's fsync stamp, as a Produce and a coordinator do: after a
failed fsync the log cuts its tail back at the next append (storage/fsync_repair.py)
and writes new records at the same offsets, and the stamp, not the offset, tells the
flusher that a late asker's records were among those cut.
"""
from __future__ import annotations

import asyncio
import errno
import itertools
import random
import threading
import time

import pytest

from semel.protocol.records import build_batch, split_batches
from semel.storage import GroupCommitFlusher, LogConfig, PartitionLog, StorageError
from semel.storage.flusher import Begun
from semel.storage.fs import FaultyFileSystem

CFG = LogConfig(checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)
LOGS = 3
APPENDS = 150


class _StampingFs(FaultyFileSystem):
    """Stamps each data fsync's start; fails some, and slows all, as `rng` decides."""

    def __init__(self, rng: random.Random, fail_rate: float):
        super().__init__()
        self.rng, self.fail_rate = rng, fail_rate
        # Re-entrant: an append made under it may first cut an untrusted tail back,
        # fsyncing on the loop's thread (storage/fsync_repair.py).
        self.lock = threading.RLock()
        self.stamps = itertools.count()
        self.fsyncs: list[tuple[str, int, bool]] = []    # (log directory, start stamp, succeeded)

    def stamp(self) -> int:
        with self.lock:
            return next(self.stamps)

    def fsync(self, f):
        if not str(f.path).endswith(".log"):
            return super().fsync(f)
        with self.lock:
            start = next(self.stamps)
            fail = self.rng.random() < self.fail_rate
            delay = self.rng.random() * 0.002
        time.sleep(delay)
        if not fail:
            super().fsync(f)
        with self.lock:
            self.fsyncs.append((str(f.path).rsplit("/", 1)[0], start, not fail))
        if fail:
            raise OSError(errno.EIO, "injected fsync failure", f.path)


async def _waiter(flusher: GroupCommitFlusher, fs: _StampingFs, plog: PartitionLog, upto: int,
                  stamp: int | None, begun: Begun | None, pause_s: float) -> tuple[int, bool]:
    """One acks=all answer's wait: (answer stamp, told durable). `begun`: its rounds
    were asked for when it appended, as a Produce does; else it asks after the pause."""
    await asyncio.sleep(pause_s)
    targets = [(plog, upto)]
    if begun is None:
        try:
            await flusher.sync(plog, upto, stamp=stamp)
            ok = True
        except StorageError:
            ok = False
    else:
        ok = (await flusher.sync_each(targets, begun, [stamp])) == [None]
    if ok:
        assert plog.flushed_offset >= upto and not plog.fsync_repair.lost(stamp, upto)
    return fs.stamp(), ok


async def _run(seed: int, logs: list[PartitionLog], fs: _StampingFs) -> list[tuple[int, int, int, bool]]:
    """Appends and waiters as the seed says; per waiter (log index, stamp of its append
    when it asked for its rounds at once, else -1; stamp of its answer; told durable)."""
    rng = random.Random(seed)
    flusher = GroupCommitFlusher()
    waits = []

    async def one(i: int, upto: int, stamp: int | None, begun: Begun | None, appended: int, pause: float):
        answered, ok = await _waiter(flusher, fs, logs[i], upto, stamp, begun, pause)
        return i, appended, answered, ok

    for n in range(APPENDS):
        i = rng.randrange(LOGS)
        early = rng.random() < 0.5    # as a Produce does: rounds asked for in the append's turn
        with fs.lock:
            # The append and its stamp as one step for the fsyncs' stamps: an fsync stamped
            # later started after these bytes were written and counted in the log end.
            try:
                info = logs[i].append(*_payload(n))
            except StorageError:
                # The cut-back's own fsync failed: the log is offline, as promised.
                assert logs[i].failed_reason is not None
                continue
            appended = next(fs.stamps) if early else -1
        upto = info.last_offset + 1
        begun = flusher.start_each([(logs[i], upto)]) if early else None
        waits.append(asyncio.ensure_future(one(i, upto, info.fsync_stamp, begun, appended,
                                               rng.choice([0, 0, 0.0005, 0.002]))))
        if rng.random() < 0.4:
            await asyncio.sleep(rng.choice([0, 0.0002, 0.001]))
    return list(await asyncio.gather(*waits))


def _payload(n: int):
    data = build_batch([(None, b"v%d" % n)], timestamp_ms=1_000)
    return data, split_batches(data)[0]


@pytest.mark.parametrize("seed", range(12))
def test_a_waiter_is_told_durable_only_when_the_first_fsync_after_its_append_succeeded(tmp_path, seed):
    fs = _StampingFs(random.Random(seed * 7919), fail_rate=0.15)
    logs = [PartitionLog.open(tmp_path / f"log-{i}", CFG, fs) for i in range(LOGS)]
    outcomes = asyncio.run(_run(seed, logs, fs))
    by_log = {str(plog.directory): i for i, plog in enumerate(logs)}
    fsyncs = sorted((by_log[d], start, ok) for d, start, ok in fs.fsyncs)
    told = [o for o in outcomes if o[3]]
    assert told and len(told) < len(outcomes)        # both outcomes happened: the check has teeth
    checked = 0
    for i, appended, answered, _ in told:
        if appended < 0:
            continue              # asked late (see the module docstring)
        after = [(start, ok) for log_i, start, ok in fsyncs if log_i == i and appended < start < answered]
        if not after:
            continue              # covered by an fsync already under way (flushed_offset says so)
        checked += 1
        assert after[0][1], f"log {i}: told durable at {answered}, but the first fsync after its " \
                            f"append at {appended} (started {after[0][0]}) failed"
    assert checked
    fs.fail_rate = 0.0
    for plog in logs:
        if plog.failed_reason is not None:
            plog.close()
            continue
        info = plog.append(*_payload(APPENDS))     # an untrusted tail is cut back first
        asyncio.run(GroupCommitFlusher().sync(plog, plog.log_end_offset, stamp=info.fsync_stamp))
        assert plog.flushed_offset == plog.log_end_offset
        plog.close()
