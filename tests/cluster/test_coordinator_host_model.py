"""Model test of SeatedCoordinator (semel.cluster.coordinator_host): the seat's decisions
carried out while partition states arrive during a load's wait for the high watermark.

The load awaits (the high watermark, a retry pause) between deciding to load and
replaying; partition states keep arriving meanwhile. Seeded random runs interleave:
states of the internal partition (this broker leading at a newer epoch, another broker
leading, no leader, a late delivery of an older version), follower appends to the log
while this broker does not lead, the high watermark moving, and event-loop turns.

Invariants after every step:
- the coordinator serves only while the seat is loaded, at the seat's epoch, and the
  newest state delivered has this broker leading at that epoch;
- every replay it did read a log whose high watermark had reached its end (nothing
  uncommitted replayed);
- it holds state only while the seat is loading or loaded at the epoch it loaded at
  (every change of seat dropped memory first).
Settled (leading, high watermark at the end): it serves at the last leader epoch.
"""
from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from semel.cluster import coordinator_host
from semel.cluster.coordinator_host import SeatedCoordinator
from semel.cluster.coordinator_seat import Seat
from semel.cluster.state import PartitionState
from semel.protocol.errors import KafkaError

ME, TOPIC = 1, "__transaction_state"


class FakeLog:
    def __init__(self):
        self.log_end_offset = 0
        self.high_watermark = 0


class FakeReplicas:
    """wait_for_hw as the leader's: done once the high watermark reaches `upto`."""

    def __init__(self, plog: FakeLog):
        self.plog = plog
        self.moved = asyncio.Event()

    async def wait_for_hw(self, topic, partition, upto, timeout_s):
        while self.plog.high_watermark < upto:
            self.moved.clear()
            try:
                await asyncio.wait_for(self.moved.wait(), timeout_s)
            except asyncio.TimeoutError:
                return KafkaError.REQUEST_TIMED_OUT
        return KafkaError.NONE


class FakeView:
    def __init__(self):
        self.listeners = []
        self.state = None

    def add_listener(self, fn):
        self.listeners.append(fn)

    def partition(self, topic, partition):
        return self.state

    def deliver(self, st):
        if self.state is None or st.version >= self.state.version:
            self.state = st
        for fn in self.listeners:
            fn(st)


class FakeCoordinator:
    def __init__(self, plog: FakeLog):
        self.plog = plog
        self.loaded_epoch = None     # epoch whose replay memory holds, None when dropped
        self.serving_epoch = None
        self.bad_loads = []

    def unload(self):
        self.loaded_epoch = self.serving_epoch = None

    def load(self, plog, epoch):
        assert self.loaded_epoch is None, "loaded over state that was not dropped"
        if plog.high_watermark < plog.log_end_offset:
            self.bad_loads.append((epoch, plog.high_watermark, plog.log_end_offset))
        self.loaded_epoch = epoch

    def serve(self, epoch):
        assert self.loaded_epoch == epoch
        self.serving_epoch = epoch


def check(host: SeatedCoordinator, coord: FakeCoordinator, view: FakeView) -> None:
    assert coord.bad_loads == []
    seat = host.seat
    if coord.serving_epoch is not None:
        assert seat.state is Seat.LOADED and seat.epoch == coord.serving_epoch
        st = view.state
        assert st.leader == ME and st.leader_epoch == coord.serving_epoch
        assert host.error() == KafkaError.NONE
    else:
        assert host.error() != KafkaError.NONE
    if coord.loaded_epoch is not None:
        assert seat.state in (Seat.LOADING, Seat.LOADED) and seat.epoch == coord.loaded_epoch


def seated(plog):
    """A started SeatedCoordinator on broker ME over fakes of its view, replicas and log."""
    view = FakeView()
    replicas = FakeReplicas(plog)
    broker = SimpleNamespace(config=SimpleNamespace(node_id=ME), cluster=view, replicas=replicas,
                             logs=SimpleNamespace(get=lambda topic, partition: plog))
    coord = FakeCoordinator(plog)
    host = SeatedCoordinator(broker, TOPIC, coord)
    host.start()
    return view, replicas, coord, host


async def run(seed: int, steps: int = 300) -> None:
    rng = random.Random(seed)
    plog = FakeLog()
    view, replicas, coord, host = seated(plog)
    version = epoch = 0
    history = []
    try:
        for _ in range(steps):
            r = rng.random()
            leads = view.state is not None and view.state.leader == ME
            if r < 0.2:                                    # an election
                epoch += 1
                version += 1
                leader = rng.choice([ME, ME, 0, 2, -1])
                st = PartitionState(TOPIC, 0, (0, ME, 2), leader, epoch, (0, ME, 2), version)
                history.append(st)
                view.deliver(st)
            elif r < 0.25 and history:                     # a late delivery of an older state
                view.deliver(rng.choice(history))
            elif r < 0.4 and not leads:                    # a follower replicating the leader's records
                plog.log_end_offset += rng.randint(1, 3)
                if rng.random() < 0.5:
                    plog.high_watermark = plog.log_end_offset
            elif r < 0.6:                                  # the ISR catching up
                plog.high_watermark = min(plog.log_end_offset, plog.high_watermark + rng.randint(0, 2))
                replicas.moved.set()
            else:                                          # time passes
                for _ in range(rng.randint(1, 4)):
                    await asyncio.sleep(0)
            check(host, coord, view)
        # Settle: this broker leads at a newer epoch and the high watermark reaches the end.
        epoch += 1
        version += 1
        view.deliver(PartitionState(TOPIC, 0, (0, ME, 2), ME, epoch, (0, ME, 2), version))
        plog.high_watermark = plog.log_end_offset
        replicas.moved.set()
        for _ in range(200):
            if coord.serving_epoch == epoch:
                break
            await asyncio.sleep(0.001)
        check(host, coord, view)
        assert coord.serving_epoch == epoch
    finally:
        await host.stop()


@pytest.mark.parametrize("seed", range(12))
def test_seated_coordinator_under_racing_states(seed, monkeypatch):
    monkeypatch.setattr(coordinator_host, "RETRY_S", 0)
    monkeypatch.setattr(coordinator_host, "HW_WAIT_S", 0.01)
    asyncio.run(run(seed))


def test_a_load_waits_for_the_high_watermark_then_serves():
    async def go():
        plog = FakeLog()
        plog.log_end_offset = 5
        plog.high_watermark = 2
        view, replicas, coord, host = seated(plog)
        view.deliver(PartitionState(TOPIC, 0, (ME, 2), ME, 3, (ME, 2), 1))
        await asyncio.sleep(0.02)
        assert coord.loaded_epoch is None and host.error() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS
        plog.high_watermark = 5
        replicas.moved.set()
        await asyncio.sleep(0.02)
        assert coord.serving_epoch == 3 and host.error() == KafkaError.NONE
        view.deliver(PartitionState(TOPIC, 0, (ME, 2), 2, 4, (2,), 2))     # another broker leads
        assert coord.loaded_epoch is None and host.error() == KafkaError.NOT_COORDINATOR
        await host.stop()
    asyncio.run(go())
