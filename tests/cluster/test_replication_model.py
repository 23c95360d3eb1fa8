"""Model test of the leader's ISR and high-watermark decisions (semel.cluster.replica_rules:
FollowerProgress, high_watermark, isr_change; their hand-made cases are in
tests/unit/cluster/test_replica_rules.py) against the compare-and-set of a
MemoryClusterView, with seeded random interleavings: produces, follower fetches,
clock ticks, ISR changes in flight (alter_isr yields, so others run meanwhile) and
leader elections racing them.

Invariants checked after every step:
- the ISR is never empty;
- a leader's high watermark never decreases while it leads;
- the high watermark is at most the log end of every ISR member;
- every acknowledged acks=all record is on every ISR member, at its offset.
"""
from __future__ import annotations

import asyncio
import random

import pytest

from semel.cluster.replica_rules import FollowerProgress, high_watermark, isr_change
from semel.cluster.state import MemoryClusterView

NODES = (0, 1, 2)
LAG_MS = 300


class Replica:
    def __init__(self) -> None:
        self.log: list[tuple[int, int]] = []     # (leader epoch, record id) per offset
        self.hw = 0
        self.must_truncate = False


class Model:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.table = MemoryClusterView.table()
        self.views = {n: MemoryClusterView(self.table, n) for n in NODES}
        self.table.create_topic("m", [NODES])
        self.nodes = {n: Replica() for n in NODES}
        self.now = 0.0
        self.next_id = 0
        self.pending: list[int] = []              # offsets produced with acks=all, not yet acknowledged
        self.acked: dict[int, tuple[int, int]] = {}
        self._new_tenure(self.state)
        self.tasks: list[asyncio.Task] = []

    @property
    def state(self):
        return self.table.parts[("m", 0)]

    def _new_tenure(self, st) -> None:
        self.leader, self.epoch = st.leader, st.leader_epoch
        lead = self.nodes[self.leader]
        self.progress = {r: FollowerProgress(last_caught_up_ms=self.now) for r in NODES if r != self.leader}
        self.epoch_start = len(lead.log)
        self.pending_isr: tuple[int, ...] = ()
        self.tenure_hw = lead.hw
        for n in NODES:
            if n != self.leader:
                self.nodes[n].must_truncate = True

    # -- the leader's side, as ReplicaManager does it --------------------------------
    def advance_hw(self) -> None:
        lead = self.nodes[self.leader]
        isr = tuple(dict.fromkeys(self.state.isr + self.pending_isr))
        lead.hw = high_watermark(lead.hw, self.leader, len(lead.log), isr, self.progress)
        for off in [o for o in self.pending if o < lead.hw]:
            self.pending.remove(off)
            if len(self.state.isr) >= 2:          # min.insync.replicas = 2: otherwise not acknowledged
                self.acked[off] = lead.log[off]

    async def update_isr(self, leader: int, epoch: int) -> None:
        for _ in range(5):
            st = self.table.parts[("m", 0)]
            if st.leader != leader or st.leader_epoch != epoch or self.leader != leader:
                return
            lead = self.nodes[leader]
            new = isr_change(st, len(lead.log), lead.hw, self.progress, self.now, LAG_MS, self.epoch_start)
            if new is None:
                return
            self.pending_isr = new
            try:
                done = await self.views[leader].alter_isr(st, new)
            finally:
                if self.leader == leader and self.epoch == epoch:
                    self.pending_isr = ()
            if done is not None:
                if self.leader == leader and self.epoch == epoch:
                    self.advance_hw()
                return

    # -- actions ------------------------------------------------------------------------
    def produce(self) -> None:
        lead = self.nodes[self.leader]
        if len(self.state.isr) < 2:
            return                                 # NOT_ENOUGH_REPLICAS: nothing appended
        lead.log.append((self.epoch, self.next_id))
        self.next_id += 1
        self.pending.append(len(lead.log) - 1)
        self.advance_hw()

    def fetch(self, f: int) -> None:
        if f == self.leader:
            return
        lead, me = self.nodes[self.leader], self.nodes[f]
        if me.must_truncate:                       # what OffsetForLeaderEpoch achieves: the common prefix
            common = 0
            while common < min(len(me.log), len(lead.log)) and me.log[common] == lead.log[common]:
                common += 1
            del me.log[common:]
            me.hw = min(me.hw, len(me.log))
            me.must_truncate = False
        self.progress[f].on_fetch(len(me.log), len(lead.log), self.now)
        self.advance_hw()
        take = self.rng.randint(0, 3)
        me.log.extend(lead.log[len(me.log):len(me.log) + take])
        me.hw = min(lead.hw, len(me.log))

    def elect(self) -> None:
        """The controller: a clean election from the ISR (epoch + 1), racing ISR changes."""
        st = self.state
        choices = [r for r in st.isr if r != self.leader] or list(st.isr)
        new = self.table.set_leader("m", 0, self.rng.choice(choices))
        self.pending.clear()                      # those producers get NOT_LEADER_OR_FOLLOWER
        self._new_tenure(new)

    async def step(self) -> None:
        action = self.rng.choices(["produce", "fetch", "tick", "isr", "elect", "yield"],
                                  weights=[5, 8, 3, 3, 1, 3])[0]
        if action == "produce":
            self.produce()
        elif action == "fetch":
            self.fetch(self.rng.choice([n for n in NODES if n != self.leader and self.rng.random() < 0.8]
                                       or [self.leader]))
        elif action == "tick":
            self.now += self.rng.choice([10, 50, 200, 400])
        elif action == "isr":
            self.tasks.append(asyncio.create_task(self.update_isr(self.leader, self.epoch)))
        elif action == "elect":
            self.elect()
        for _ in range(self.rng.randint(0, 2)):   # let ISR changes in flight progress, or not
            await asyncio.sleep(0)

    def check(self) -> None:
        st = self.state
        lead = self.nodes[self.leader]
        assert st.isr, "ISR empty"
        assert lead.hw >= self.tenure_hw, f"leader {self.leader} high watermark went back"
        self.tenure_hw = lead.hw
        for r in st.isr:
            assert lead.hw <= len(self.nodes[r].log), f"HW {lead.hw} past ISR member {r}'s log end"
            for off, entry in self.acked.items():
                log = self.nodes[r].log
                assert off < len(log) and log[off] == entry, f"acknowledged offset {off} missing on {r}"


@pytest.mark.parametrize("seed", range(40))
def test_isr_and_high_watermark_hold_their_invariants(seed):
    async def run() -> Model:
        m = Model(seed)
        for _ in range(400):
            await m.step()
            m.check()
        await asyncio.gather(*m.tasks)
        m.check()
        return m
    m = asyncio.run(run())
    assert m.next_id > 0 and m.state.version > 0   # the run did produce and change the partition

