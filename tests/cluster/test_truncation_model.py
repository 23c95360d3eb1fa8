"""Model test of follower truncation by leader epoch (KIP-101/KIP-279) on real logs:
three PartitionLogs, a leader appending with its epoch stamped, followers replicating
a few batches at a time through append_replicated, and elections at random moments
(each replica holds everything committed, as the ISR guarantees). Two ways to find
where to cut, as the fetcher has them: asking the leader's epoch cache first
(OffsetForLeaderEpoch, end_offset_for) round after round; or fetching with the last
fetched epoch, the leader answering a diverging epoch (`diverging_epoch`) instead of
records until the follower's log continues its own (KIP-320/KIP-595). Either way the
follower cuts where `truncation_point` says.

With `threaded`, followers write as the fetcher does a large fetch: the pwrite handed
to a worker (append_replicated_begin), the write pending across later steps. The
workers are a StepRunner, so the seed decides when each pwrite runs: at a random
later step (a thread got the CPU), when the fetcher awaits it before its next fetch,
while a write of an earlier role is being awaited, or only when a role change or a
restart waits for it (on_partition calls settle() first; close() settles too). Writes
of a previous role are awaited at random later moments, and a follower is restarted
(closed with its write pending, reopened) at random moments.

Invariants after every step:
- committed records (below the highest high watermark reached) are on every replica,
  unchanged;
- a follower that finished truncating holds a prefix of the leader's log, byte for byte;
- every replica's log end counts only written bytes: its files hold its records; with
  no write pending they hold nothing more (no write lands past a truncation point);
- the high watermark never passes any replica's written end;
- a role change or a restart leaves no write of the earlier role to run, and awaiting
  such a write later changes nothing (a current write landing meanwhile only adds
  bytes past the log end);
- in the end, once everyone caught up, the three logs are identical.
"""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from semel.cluster.replica_rules import diverging_epoch, truncation_point
from semel.protocol.records import build_batch, iter_batches, split_batches
from semel.storage import LogConfig, PartitionLog
from tests.support.memcluster import all_bytes
from tests.support.step_runner import StepRunner

CFG = LogConfig(segment_bytes=900, index_interval_bytes=64)


class Cluster:
    def __init__(self, tmp_path, seed: int, via_fetch: bool = False, threaded: bool = False,
                 real_threads: bool = False):
        self.rng = random.Random(seed)
        self.via_fetch = via_fetch
        self.threaded = threaded
        # The workers: a StepRunner (the seed orders them), or with real_threads the
        # logs' own pool, where thread timing does (bench/truncation_stress.py runs both).
        self.runner = StepRunner() if threaded and not real_threads else None
        self.writing: dict[int, tuple] = {}     # follower -> (its write, the worker's job)
        self.stale: list = []                   # (replica, write, job) begun under an earlier role
        self.dirs = [tmp_path / f"r{i}" for i in range(3)]
        self.logs = [PartitionLog.open(d, CFG, runner=self.runner) for d in self.dirs]
        self.leader, self.epoch = 0, 0
        self.pending = {1, 2}              # followers that must truncate before fetching
        self.committed = b""               # bytes below the highest high watermark reached
        self.next_id = 0
        for p in self.logs[1:]:
            p.set_follower(True)
        self._lead()

    def _lead(self) -> None:
        lead = self.logs[self.leader]
        lead.epochs.assign(self.epoch, lead.log_end_offset)
        lead.set_leader_epoch(self.epoch)

    def append(self) -> None:
        lead = self.logs[self.leader]
        for _ in range(self.rng.randint(1, 3)):
            data = build_batch([(None, b"r%d" % self.next_id)], timestamp_ms=1000 + self.next_id)
            self.next_id += 1
            lead.append(data, split_batches(data)[0])

    def truncate(self, f: int) -> None:
        me, lead = self.logs[f], self.logs[self.leader]
        for _ in range(10):
            epoch, end = lead.epochs.end_offset_for(me.epochs.latest_epoch, lead.log_end_offset)
            target, done = truncation_point(me.epochs, me.log_end_offset, me.high_watermark, epoch, end)
            me.truncate_to(target)
            if done:
                self.pending.discard(f)
                return
        raise AssertionError(f"replica {f} never finished truncating")

    async def land(self, f: int) -> None:
        """The fetcher's await of its write (its thread ran by then); the follower's high
        watermark after it."""
        write, job = self.writing.pop(f, (None, None))
        if write is not None:
            if job is not None:
                self.runner.release(job)
            await write
            self._advance_hw()

    def run_a_thread(self) -> None:
        """A worker thread gets the CPU: one queued job runs."""
        if self.runner is not None:
            self.runner.release_random(self.rng)

    async def land_stale(self, meanwhile: bool | None = None) -> None:
        """A write of an earlier role, awaited late: the role change settled it already.
        With `meanwhile`, a queued job runs while the await yields to the loop."""
        if not self.stale:
            return
        i, write, _ = self.stale.pop(self.rng.randrange(len(self.stale)))
        me = self.logs[i]
        end, disk = me.log_end_offset, on_disk(me)
        ran = len(self.runner.ran) if self.runner else 0
        if self.rng.random() < 0.5 if meanwhile is None else meanwhile:
            asyncio.get_running_loop().call_soon(self.run_a_thread)
        await write
        assert me.log_end_offset == end, f"replica {i}: a write of an earlier role moved the log end"
        if self.runner is None:
            # Real threads: replica i's current write, if any, may land meanwhile.
            ours_ran = i in self.writing
        else:
            current = {id(job) for _, job in self.writing.values()}
            landed = self.runner.ran[ran:]
            assert all(id(job) in current for job in landed), "a job of an earlier role was still queued"
            ours_ran = any(job is self.writing.get(i, (None, None))[1] for job in landed)
        now = on_disk(me)
        if not ours_ran:
            assert now == disk, f"replica {i}: a write of an earlier role landed after the role changed"
        else:   # replica i's current write ran meanwhile: it may add bytes past the log end, nothing else
            assert now[:len(disk)] == disk, f"replica {i}: a write changed bytes it was not given"

    def restart(self, f: int) -> None:
        """A follower's broker stops with its write pending and comes back: close()
        waits for the write; the reopened log holds what the files hold."""
        if f == self.leader:
            return
        me = self.logs[f]
        hw = me.replicated_hw
        me.close()
        self._retire_write(f, me)
        again = self.logs[f] = PartitionLog.open(self.dirs[f], CFG, runner=self.runner)
        again.set_follower(True)
        again.set_high_watermark(None if hw is None else min(hw, again.log_end_offset))
        self.pending.add(f)

    def _retire_write(self, f: int, plog: PartitionLog) -> None:
        """Replica f's write now belongs to an earlier role: whatever stopped the role
        must have run it (waited for it) already."""
        assert not plog.write_pending, f"replica {f}: a write of an earlier role is still pending"
        write = self.writing.pop(f, None)
        if write is not None:
            assert write[1] is None or write[1].done(), f"replica {f}: a write of an earlier role is still to run"
            self.stale.append((f, *write))

    async def replicate(self, f: int) -> None:
        if f == self.leader:
            return
        await self.land(f)                    # the next fetch goes out once the write landed
        me, lead = self.logs[f], self.logs[self.leader]
        reported = me.log_end_offset          # the fetch offset the leader would record
        assert reported <= written_end(me), f"replica {f} reports {reported} past its written bytes"
        if self.via_fetch:
            diverged = diverging_epoch(lead.epochs, lead.log_start_offset, lead.log_end_offset,
                                       me.log_end_offset, me.epochs.latest_epoch)
            if diverged is not None:
                assert isinstance(diverged, tuple), diverged
                me.truncate_to(truncation_point(me.epochs, me.log_end_offset, me.high_watermark, *diverged)[0])
                return                        # no records with a diverging epoch: fetch again
            self.pending.discard(f)           # the leader accepted the fetch: a prefix of its log
        elif f in self.pending:
            self.truncate(f)
        if me.log_end_offset < lead.log_end_offset:
            data = lead.read(me.log_end_offset, self.rng.choice([60, 200, 1000]))
            if self.threaded:
                write = me.append_replicated_begin(data)
                self.writing[f] = (write, self.runner.queued[-1] if self.runner else None)
                return                        # pending: lands at a later step
            me.append_replicated(data)
        self._advance_hw()

    def _advance_hw(self) -> None:
        """High watermark: the longest prefix of the leader's log that every replica holds."""
        lead = all_bytes(self.logs[self.leader])
        common = min(len(self._shared(lead, all_bytes(p))) for p in self.logs)
        if common > len(self.committed):
            self.committed = lead[:common]
        for p in self.logs:
            p.set_high_watermark(max(p.replicated_hw or 0, _offset_at(lead, common)))

    @staticmethod
    def _shared(a: bytes, b: bytes) -> bytes:
        """The whole batches a and b share from the start."""
        n = 0
        for pos, hdr in iter_batches(b):
            end = pos + hdr.size
            if a[pos:end] != b[pos:end]:
                break
            n = end
        return b[:n]

    def elect(self, leader: int | None = None) -> None:
        for i, p in enumerate(self.logs):     # ReplicaManager.on_partition: settle, then change role
            p.settle()
        for f in list(self.writing):
            self._retire_write(f, self.logs[f])
        old = self.logs[self.leader]
        old.set_leader_epoch(None)
        old.set_follower(True)
        if leader is None:
            leader = self.rng.choice([i for i in range(3) if i != self.leader])
        self.leader = leader
        self.logs[leader].set_follower(False)
        self.epoch += 1
        self.pending = {i for i in range(3) if i != self.leader}
        self._lead()

    def check(self) -> None:
        lead = all_bytes(self.logs[self.leader])
        for i, p in enumerate(self.logs):
            data = all_bytes(p)
            assert data[:len(self.committed)] == self.committed, f"replica {i} lost committed records"
            if i != self.leader and i not in self.pending:
                assert lead[:len(data)] == data, f"replica {i} diverges from the leader after truncating"
            disk = on_disk(p)
            assert disk[:len(data)] == data, f"replica {i}'s log end counts bytes not written"
            if not p.write_pending:
                assert disk == data, f"replica {i} holds written bytes past its log end"
            elif self.runner is not None and i in self.writing and not self.writing[i][1].done():
                assert disk == data, f"replica {i}'s write landed before its thread ran"
            assert (p.replicated_hw or 0) <= written_end(self.logs[self.leader]), "HW past the leader's writes"
            assert _offset_at(lead, len(self.committed)) <= written_end(p), f"HW past replica {i}'s written end"


def on_disk(plog) -> bytes:
    """The replica's segment files, read straight from disk (not through its memory)."""
    return b"".join(Path(plog.segment_path(base)).read_bytes() for base in plog.segment_bases)


def written_end(plog) -> int:
    """One past the last whole batch in the replica's files: what it has written."""
    data = on_disk(plog)
    batches = list(iter_batches(data))
    return batches[-1][1].next_offset if batches else plog.log_start_offset


def _offset_at(data: bytes, length: int) -> int:
    """Offset of the first batch at or after byte `length` of a log's bytes."""
    for pos, hdr in iter_batches(data):
        if pos >= length:
            return hdr.base_offset
    return list(iter_batches(data))[-1][1].next_offset if data else 0


async def run_model(tmp_path, seed: int, via_fetch: bool, threaded: bool, real_threads: bool = False,
                    steps: int = 120) -> Cluster:
    """One run of the model: `steps` random steps, then everyone catches up with the
    last leader; every invariant checked after every step. Returns the cluster."""
    c = Cluster(tmp_path, seed, via_fetch, threaded, real_threads)
    try:
        t = 1 if threaded else 0
        for _ in range(steps):
            action = c.rng.choices(["append", "replicate", "elect", "land", "stale", "thread", "restart"],
                                   weights=[4, 6, 1, 2 * t, 1 * t, 2 * t, 0.3 * t])[0]
            if action == "append":
                c.append()
            elif action == "replicate":
                await c.replicate(c.rng.randrange(3))
            elif action == "land":
                await c.land(c.rng.randrange(3))
            elif action == "stale":
                await c.land_stale()
            elif action == "thread":
                c.run_a_thread()
            elif action == "restart":
                c.restart(c.rng.randrange(3))
            else:
                c.elect()
            c.check()
        for _ in range(200):              # let everyone catch up with the last leader
            for f in range(3):
                await c.replicate(f)
        for f in range(3):
            await c.land(f)
        while c.stale:
            await c.land_stale()
        c.check()
        logs = [all_bytes(p) for p in c.logs]
        assert logs[0] == logs[1] == logs[2]
        return c
    finally:
        for p in c.logs:
            p.close()


@pytest.mark.parametrize("threaded", [False, True], ids=["write-on-loop", "write-in-thread"])
@pytest.mark.parametrize("via_fetch", [False, True], ids=["offset-for-leader-epoch", "diverging-epoch"])
@pytest.mark.parametrize("seed", range(12))
def test_followers_truncate_to_the_leader_and_never_lose_committed_records(tmp_path, seed, via_fetch, threaded):
    c = asyncio.run(run_model(tmp_path, seed, via_fetch, threaded))
    assert c.epoch > 0 and len(c.committed) > 0


def test_a_current_write_landing_while_an_earlier_roles_write_is_awaited_is_told_apart(tmp_path):
    """Replica 1's fetch of the new leader's records lands in its thread while replica
    1's write of the previous role is awaited. The current write adds bytes past the log
    end (it is pending until awaited); the earlier role's write, which the role change
    settled, changes nothing, and the model's check must tell the two apart."""
    async def run() -> None:
        c = Cluster(tmp_path, 0, via_fetch=True, threaded=True)
        try:
            c.append()
            await c.replicate(1)
            earlier = c.writing[1][1]
            c.elect(leader=2)
            assert earlier.done() and earlier.waited       # the role change ran it
            c.append()
            for _ in range(3):                             # the first fetch may truncate first
                if 1 not in c.writing:
                    await c.replicate(1)
            current = c.writing[1][1]
            assert not current.done()
            size = len(on_disk(c.logs[1]))
            await c.land_stale(meanwhile=True)
            assert c.runner.ran[-1] is current and len(on_disk(c.logs[1])) > size
            c.check()
            await c.land(1)
            c.check()
        finally:
            for p in c.logs:
                p.close()
    asyncio.run(run())
