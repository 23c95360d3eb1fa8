"""Model test of follower truncation by leader epoch (KIP-101/KIP-279) on real logs:
three PartitionLogs, a leader appending with its epoch stamped, followers replicating
a few batches at a time through append_replicated, and elections at random moments
(each replica holds everything committed, as the ISR guarantees). Two ways to find
where to cut, as the fetcher has them: asking the leader's epoch cache first
(OffsetForLeaderEpoch, end_offset_for) round after round; or fetching with the last
fetched epoch, the leader answering a diverging epoch (`diverging_epoch`) instead of
records until the follower's log continues its own (KIP-320/KIP-595). Either way the
follower cuts where `truncation_point` says.

Invariants after every step:
- committed records (below the highest high watermark reached) are on every replica,
  unchanged;
- a follower that finished truncating holds a prefix of the leader's log, byte for byte;
- in the end, once everyone caught up, the three logs are identical.
"""
from __future__ import annotations

import random

import pytest

from semel.cluster.replica import diverging_epoch, truncation_point
from semel.protocol.records import build_batch, iter_batches, split_batches
from semel.storage import LogConfig, PartitionLog
from tests.support.memcluster import all_bytes

CFG = LogConfig(segment_bytes=900, index_interval_bytes=64)


class Cluster:
    def __init__(self, tmp_path, seed: int, via_fetch: bool = False):
        self.rng = random.Random(seed)
        self.via_fetch = via_fetch
        self.logs = [PartitionLog.open(tmp_path / f"r{i}", CFG) for i in range(3)]
        self.leader, self.epoch = 0, 0
        self.pending = {1, 2}              # followers that must truncate before fetching
        self.committed = b""               # bytes below the highest high watermark reached
        self.next_id = 0
        self._lead()

    def _lead(self) -> None:
        lead = self.logs[self.leader]
        lead.epochs.assign(self.epoch, lead.log_end_offset)
        lead.leader_epoch = self.epoch

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

    def replicate(self, f: int) -> None:
        if f == self.leader:
            return
        me, lead = self.logs[f], self.logs[self.leader]
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
            me.append_replicated(lead.read(me.log_end_offset, self.rng.choice([60, 200, 1000])))
        self._advance_hw()

    def _advance_hw(self) -> None:
        """High watermark: the longest prefix of the leader's log that every replica holds."""
        lead = all_bytes(self.logs[self.leader])
        common = min(len(self._shared(lead, all_bytes(p))) for p in self.logs)
        if common > len(self.committed):
            self.committed = lead[:common]
        for p in self.logs:
            p.replicated_hw = max(p.replicated_hw or 0, _offset_at(lead, common))

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

    def elect(self) -> None:
        old = self.logs[self.leader]
        old.leader_epoch = None
        self.leader = self.rng.choice([i for i in range(3) if i != self.leader])
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


def _offset_at(data: bytes, length: int) -> int:
    """Offset of the first batch at or after byte `length` of a log's bytes."""
    for pos, hdr in iter_batches(data):
        if pos >= length:
            return hdr.base_offset
    return list(iter_batches(data))[-1][1].next_offset if data else 0


@pytest.mark.parametrize("via_fetch", [False, True], ids=["offset-for-leader-epoch", "diverging-epoch"])
@pytest.mark.parametrize("seed", range(12))
def test_followers_truncate_to_the_leader_and_never_lose_committed_records(tmp_path, seed, via_fetch):
    c = Cluster(tmp_path, seed, via_fetch)
    try:
        for _ in range(120):
            action = c.rng.choices(["append", "replicate", "elect"], weights=[4, 6, 1])[0]
            if action == "append":
                c.append()
            elif action == "replicate":
                c.replicate(c.rng.randrange(3))
            else:
                c.elect()
            c.check()
        for _ in range(200):                  # let everyone catch up with the last leader
            for f in range(3):
                c.replicate(f)
        logs = [all_bytes(p) for p in c.logs]
        assert logs[0] == logs[1] == logs[2]
        assert c.epoch > 0 and len(c.committed) > 0
    finally:
        for p in c.logs:
            p.close()
