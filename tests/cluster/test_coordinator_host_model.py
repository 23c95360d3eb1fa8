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

Several partitions (`run_partitioned`): three brokers, each with one seated coordinator
per partition behind the real router (PartitionedCoordinators) and with the real
replicated flusher, each broker's view getting the partitions' states late and out of
order. After every step: at most one broker serves a partition at any leader epoch, and
only the one the election named; a broker serves a partition only at the leader epoch
its newest state of that partition gives it; an id is answered only by the coordinator
of its own partition (abs(hashCode) % partitions); a write is answered only once the
high watermark passed it. Settled, every id is answered by its partition's leader only.
"""
from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace

import pytest

from semel.cluster import coordinator_host
from semel.cluster.coordinator_host import SeatedCoordinator
from semel.coordinator.partitioned import PartitionedCoordinators
from semel.protocol.txn_hash import partition_for
from semel.cluster.coordinator_seat import Seat
from semel.cluster.state import PartitionState
from semel.protocol.errors import KafkaError
from semel.storage.committed import Committed

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
    logs = SimpleNamespace(get=lambda topic, partition: plog)
    coord = FakeCoordinator(plog)
    host = SeatedCoordinator(view, ME, logs, lambda: replicas, TOPIC, 0)
    host.start(coord)
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


# --- several partitions, three brokers -------------------------------------------------

K, BROKERS = 3, (0, 1, 2)
IDS = [f"txn-{i}" for i in range(16)]


class PartitionsView:
    """One broker's view of the internal topic's partitions, each delivered when it arrives."""

    def __init__(self):
        self.listeners = []
        self.states = {}

    def add_listener(self, fn):
        self.listeners.append(fn)

    def partition(self, topic, partition):
        return self.states.get(partition)

    def deliver(self, st):
        held = self.states.get(st.partition)
        if held is None or st.version >= held.version:
            self.states[st.partition] = st
        for fn in self.listeners:
            fn(st)


class PartitionReplicas:
    """FakeReplicas for each of a broker's partitions."""

    def __init__(self, logs):
        self.by_partition = {p: FakeReplicas(plog) for p, plog in logs.items()}

    def moved(self, partition: int) -> None:
        self.by_partition[partition].moved.set()

    async def wait_for_hw(self, topic, partition, upto, timeout_s):
        return await self.by_partition[partition].wait_for_hw(topic, partition, upto, timeout_s)


class Node:
    """A broker: its view, its replica of each partition, one seated coordinator per partition."""

    def __init__(self, node_id: int):
        self.id = node_id
        self.view = PartitionsView()
        self.logs = {p: FakeLog() for p in range(K)}
        self.replicas = PartitionReplicas(self.logs)
        logs = SimpleNamespace(get=lambda t, p: self.logs[p])
        parts = []
        for p in range(K):
            coord = FakeCoordinator(self.logs[p])
            coord.seat = SeatedCoordinator(self.view, node_id, logs, lambda: self.replicas, TOPIC, p)
            coord.writer = Committed(None, lambda: self.replicas, 0.05, KafkaError.NOT_COORDINATOR).writer(TOPIC, p)
            parts.append(coord)
        self.coords = PartitionedCoordinators(parts)
        self.coords.start_seats()
        self.pending = []        # states elected but not yet delivered here


class Model:
    def __init__(self, rng):
        self.rng = rng
        self.nodes = {b: Node(b) for b in BROKERS}
        self.epoch = {p: 0 for p in range(K)}
        self.leader_at = {}      # (partition, epoch) -> the leader the election named
        self.version = 0
        self.writes = set()
        self.violations = []

    def elect(self, p: int, leader: int, deliver_to) -> None:
        self.epoch[p] += 1
        self.version += 1
        st = PartitionState(TOPIC, p, BROKERS, leader, self.epoch[p], BROKERS, self.version)
        self.leader_at[(p, st.leader_epoch)] = leader
        for node in self.nodes.values():
            (node.view.deliver if node.id in deliver_to else node.pending.append)(st)

    def ask(self, node: Node, txn_id: str):
        """A request for txn_id at `node`: the coordinator the router picks, answering or refusing."""
        coord = node.coords.for_key(txn_id)
        if coord is not node.coords.parts[partition_for(txn_id, K)] or coord.seat.partition != partition_for(txn_id, K):
            self.violations.append(("routed elsewhere", txn_id, node.id))
        return coord, coord.seat.error()

    async def write(self, node: Node, coord, txn_id: str) -> None:
        """A decision logged at the coordinator and answered once its writer lets it."""
        plog, epoch = coord.plog, coord.seat.epoch
        plog.log_end_offset += 1
        end = plog.log_end_offset
        try:
            await coord.writer.sync(plog, end)
        except Exception:   # AppendError: not replicated in time, a failed write (not answered as done)
            return
        if plog.high_watermark < end:
            self.violations.append(("answered before replication", txn_id, node.id, epoch, end))

    def step(self) -> None:
        rng = self.rng
        r = rng.random()
        node = self.nodes[rng.choice(BROKERS)]
        p = rng.randrange(K)
        if r < 0.15:                                   # an election, seen by some brokers at once
            self.elect(p, rng.choice(BROKERS + (-1,)), {b for b in BROKERS if rng.random() < 0.5})
        elif r < 0.3 and node.pending:                 # a late delivery, in any order
            node.view.deliver(node.pending.pop(rng.randrange(len(node.pending))))
        elif r < 0.4:                                  # records arriving at a follower
            st = node.view.states.get(p)
            if st is None or st.leader != node.id:
                node.logs[p].log_end_offset += rng.randint(1, 3)
        elif r < 0.55:                                 # the ISR catching up
            plog = node.logs[p]
            plog.high_watermark = min(plog.log_end_offset, plog.high_watermark + rng.randint(0, 2))
            node.replicas.moved(p)
        elif r < 0.75:                                 # a client's request
            txn_id = rng.choice(IDS)
            coord, err = self.ask(node, txn_id)
            if err == KafkaError.NONE:
                task = asyncio.get_running_loop().create_task(self.write(node, coord, txn_id))
                self.writes.add(task)
                task.add_done_callback(self.writes.discard)

    def check(self) -> None:
        assert self.violations == []
        for p in range(K):
            serving = {}
            for node in self.nodes.values():
                coord = node.coords.parts[p]
                assert coord.bad_loads == []
                if coord.seat.serving():
                    e = coord.seat.epoch
                    assert e not in serving, f"partition {p} served by {serving[e]} and {node.id} at epoch {e}"
                    serving[e] = node.id
                    assert self.leader_at[(p, e)] == node.id
                    st = node.view.states[p]
                    assert st.leader == node.id and st.leader_epoch == e and coord.serving_epoch == e


async def run_partitioned(seed: int, steps: int = 400) -> None:
    model = Model(random.Random(seed))
    try:
        for _ in range(steps):
            model.step()
            for _ in range(model.rng.randint(0, 2)):
                await asyncio.sleep(0)
            model.check()
        # Settle: every state delivered, each partition led by a broker that has its log committed.
        for node in model.nodes.values():
            while node.pending:
                node.view.deliver(node.pending.pop(0))
        leaders = {p: BROKERS[p % len(BROKERS)] for p in range(K)}
        for p, leader in leaders.items():
            model.elect(p, leader, set(BROKERS))
        for node in model.nodes.values():
            for p, plog in node.logs.items():
                plog.high_watermark = plog.log_end_offset
                node.replicas.moved(p)
        for _ in range(400):
            if all(model.nodes[b].coords.parts[p].seat.serving() for p, b in leaders.items()):
                break
            await asyncio.sleep(0.001)
        model.check()
        for txn_id in IDS:
            answered = {node.id for node in model.nodes.values() if model.ask(node, txn_id)[1] == KafkaError.NONE}
            assert answered == {leaders[partition_for(txn_id, K)]}
        await asyncio.gather(*list(model.writes), return_exceptions=True)
        model.check()
    finally:
        for node in model.nodes.values():
            for coord in node.coords.parts:
                await coord.seat.stop()


@pytest.mark.parametrize("seed", range(12))
def test_partitioned_coordinators_under_racing_states(seed, monkeypatch):
    monkeypatch.setattr(coordinator_host, "RETRY_S", 0)
    monkeypatch.setattr(coordinator_host, "HW_WAIT_S", 0.01)
    asyncio.run(run_partitioned(seed))
