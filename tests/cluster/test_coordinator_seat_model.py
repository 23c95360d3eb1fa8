"""Model test: coordinator load/unload racing in-flight coordinator appends.

Three brokers share a replicated coordinator partition (RF3). Each runs a
`CoordinatorSeat` fed by its own, delayed, copy of the partition's states, and the
coordinator the seat allows: transactions begin and end (commit or abort, decided at
random per request, as a retry or a re-initialising client would), each transition an
append on the leader that is applied and answered only once the high watermark passes
it. Seeded random steps interleave those with elections, late state deliveries,
follower fetches (truncating to the leader first, KIP-101 style), ISR shrink and
expand, load completions and broker crashes and restarts.

Invariants after every step:
- at most one live broker serves the partition per leader epoch, never at an epoch
  newer than the cluster's;
- a broker holds coordinator memory only while leading (loading or serving): a
  follower never replays or rolls forward its replicated copy;
- a decision is answered only once every in-sync replica holds it, and every answered
  record stays in the current leader's log at its offset;
- no transaction is both committed and aborted anywhere (answers and markers).
Once settled: every decision logged on the final leader has its markers, and every
answered decision is among them.
"""
from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field, replace

import pytest

from semel.cluster.coordinator_seat import LOAD, UNLOAD, CoordinatorSeat, Seat
from semel.cluster.state import NO_LEADER, PartitionState
from semel.protocol.errors import KafkaError

E = KafkaError
NODES = (0, 1, 2)
TXNS = 5


@dataclass(frozen=True)
class Rec:
    kind: str               # "begin" | "prepare" | "complete"
    txn: int
    outcome: str | None     # "commit" | "abort" for prepare/complete
    epoch: int              # the leader epoch stamped on the append


@dataclass
class Node:
    id: int
    log: list = field(default_factory=list)
    seat: CoordinatorSeat = None
    view: PartitionState | None = None
    inbox: deque = field(default_factory=deque)
    mem: dict | None = None            # txn -> (status, outcome), only while leading
    pending: deque = field(default_factory=deque)   # (end offset, epoch, rec), appended, not applied
    load: tuple | None = None          # (epoch, log end replayed up to)
    hw: int = 0
    acked: dict = field(default_factory=dict)       # follower -> log end it fetched from
    asked_isr: tuple = ()              # an ISR expansion asked for, not yet seen
    must_truncate: bool = True
    alive: bool = True

    def __post_init__(self):
        self.seat = CoordinatorSeat(self.id)

    def leads(self) -> bool:
        return self.view is not None and self.view.leader == self.id


class Model:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.nodes = {i: Node(i) for i in NODES}
        self.table = PartitionState("__transaction_state", 0, NODES, 0, 0, NODES, 0)
        self.answered: dict[int, set] = {}      # txn -> outcomes told to a client
        self.answered_recs: list[tuple[int, Rec]] = []
        self.markers: dict[int, set] = {}       # txn -> marker kinds written
        self.loaded_epochs: list[tuple[int, int]] = []
        for n in self.nodes.values():
            n.inbox.append(self.table)

    # -- the controller -------------------------------------------------------------------
    def publish(self, **changes) -> None:
        self.table = replace(self.table, version=self.table.version + 1, **changes)
        for n in self.nodes.values():
            if n.alive:
                n.inbox.append(self.table)

    def elect(self, exclude=()) -> bool:
        choices = [r for r in self.table.isr if r not in exclude and self.nodes[r].alive]
        if not choices:
            return False
        self.publish(leader=self.rng.choice(choices), leader_epoch=self.table.leader_epoch + 1)
        return True

    # -- a broker -------------------------------------------------------------------------
    def drop(self, n: Node) -> None:
        """Unload: memory gone, in-flight writes answered NOT_COORDINATOR (never OK)."""
        n.mem, n.load = None, None
        n.pending.clear()

    def deliver(self, n: Node) -> None:
        st = n.inbox.popleft()
        if n.view is not None and st.version < n.view.version:
            return
        if n.view is None or (st.leader, st.leader_epoch) != (n.view.leader, n.view.leader_epoch):
            n.must_truncate = n.id != st.leader
            n.acked = {}
        n.view = st
        if n.asked_isr and set(n.asked_isr) <= set(st.isr):
            n.asked_isr = ()
        act = n.seat.observe(st)
        if act is not None and act[0] == UNLOAD:
            self.drop(n)
        elif act is not None and act[0] == LOAD:
            self.drop(n)
            n.load = (act[1], len(n.log))
            self.advance_hw(n)

    def hw_isr(self, n: Node) -> set:
        return set(n.view.isr) | set(n.asked_isr)

    def advance_hw(self, n: Node) -> None:
        ends = [len(n.log)] + [n.acked.get(r, 0) for r in self.hw_isr(n) if r != n.id]
        n.hw = max(n.hw, min(ends))

    def fetch(self, f: Node) -> None:
        leader = self.nodes.get(f.view.leader) if f.view is not None else None
        if leader is None or not leader.alive or leader is f or leader.view is None:
            return
        if (leader.view.leader, leader.view.leader_epoch) != (f.view.leader, f.view.leader_epoch):
            return   # FENCED/UNKNOWN_LEADER_EPOCH: one of the two has not caught up
        if f.must_truncate:
            common = 0
            while common < min(len(f.log), len(leader.log)) and f.log[common] == leader.log[common]:
                common += 1
            del f.log[common:]
            f.must_truncate = False
        f.log.extend(leader.log[len(f.log):len(f.log) + self.rng.randint(1, 2)])
        leader.acked[f.id] = len(f.log)
        self.advance_hw(leader)
        f.hw = min(leader.hw, len(f.log))

    def expand(self, n: Node, r: int) -> None:
        """The leader asks for r back in the ISR once r has caught up with its high watermark."""
        if r in n.view.isr or n.asked_isr or n.acked.get(r, -1) < n.hw or not self.nodes[r].alive:
            return
        if n.view.version != self.table.version:
            return   # the compare-and-set loses; the leader re-reads and decides again
        n.asked_isr = tuple(sorted(n.view.isr + (r,)))
        self.publish(isr=n.asked_isr)

    def append(self, n: Node, rec: Rec) -> None:
        n.log.append(rec)
        n.pending.append((len(n.log), n.seat.epoch, rec))
        self.advance_hw(n)

    def apply(self, n: Node, rec: Rec) -> None:
        if rec.kind == "begin":
            n.mem[rec.txn] = ("ongoing", None)
        elif rec.kind == "prepare":
            n.mem[rec.txn] = ("prepared", rec.outcome)
        else:
            n.mem[rec.txn] = ("complete", rec.outcome)

    def write_markers(self, n: Node, txn: int, outcome: str) -> None:
        self.markers.setdefault(txn, set()).add(outcome)
        self.append(n, Rec("complete", txn, outcome, n.seat.epoch))

    def finish_load(self, n: Node) -> None:
        epoch, end = n.load
        self.advance_hw(n)
        if not n.seat.may_finish_load(n.hw, end):
            return
        assert len(n.log) == end, "nothing is appended while loading"
        if not n.seat.loaded(epoch):
            n.load = None
            return
        n.load, n.mem = None, {}
        for rec in n.log:
            self.apply(n, rec)
        self.loaded_epochs.append((n.id, epoch))
        for txn, (status, outcome) in sorted(n.mem.items()):
            if status == "prepared":   # roll forward what was decided
                self.write_markers(n, txn, outcome)

    def settle_writes(self, n: Node) -> None:
        while n.pending:
            end, epoch, rec = n.pending[0]
            err = n.seat.answer_error(epoch, n.hw, end)
            if err is None:
                return
            n.pending.popleft()
            assert err == E.NONE, "a lost seat drops its pending writes at once"
            for r in self.hw_isr(n):
                log = self.nodes[r].log
                assert len(log) >= end and log[end - 1] == rec, f"answered {rec} before {r} had it"
            self.apply(n, rec)
            if rec.kind == "prepare":
                self.answered.setdefault(rec.txn, set()).add(rec.outcome)
                self.answered_recs.append((end - 1, rec))
                self.write_markers(n, rec.txn, rec.outcome)

    def request(self, n: Node, txn: int, outcome: str | None) -> KafkaError:
        """Begin (outcome None) or EndTxn, sent to broker n."""
        err = n.seat.error()
        if err != E.NONE:
            return err
        if any(rec.txn == txn for _, _, rec in n.pending):
            return E.CONCURRENT_TRANSACTIONS
        status, decided = n.mem.get(txn, (None, None))
        if outcome is None:
            if status is not None:
                return E.INVALID_TXN_STATE
            self.append(n, Rec("begin", txn, None, n.seat.epoch))
            return E.NONE
        if status == "ongoing":
            self.append(n, Rec("prepare", txn, outcome, n.seat.epoch))
            return E.NONE
        if status in ("prepared", "complete") and decided == outcome:
            self.answered.setdefault(txn, set()).add(outcome)   # a retry of a committed decision
            return E.NONE
        return E.INVALID_TXN_STATE

    def crash(self, n: Node) -> None:
        isr = self.table.isr
        if n.id in isr and len(isr) == 1:
            return   # the last in-sync replica: no unclean election, keep it
        n.alive = False
        n.inbox.clear()
        n.view, n.seat = None, CoordinatorSeat(n.id)
        n.hw, n.acked, n.asked_isr = 0, {}, ()
        self.drop(n)
        if self.table.leader == n.id:
            self.publish(leader=NO_LEADER, leader_epoch=self.table.leader_epoch + 1,
                         isr=tuple(r for r in isr if r != n.id))
            self.elect()
        elif n.id in isr:
            self.publish(isr=tuple(r for r in isr if r != n.id))

    def restart(self, n: Node) -> None:
        n.alive, n.must_truncate = True, True
        n.inbox.append(self.table)

    # -- steps ----------------------------------------------------------------------------
    def step(self) -> str:
        rng = self.rng
        live = [n for n in self.nodes.values() if n.alive]
        n = rng.choice(live)
        roll = rng.random()
        if roll < 0.12:
            self.elect(exclude=(self.table.leader,))
            return "elect"
        if roll < 0.25 and n.inbox:
            self.deliver(n)
            return f"deliver {n.id}"
        if roll < 0.45:
            if n.view is not None and not n.leads():
                self.fetch(n)
            return f"fetch {n.id}"
        if roll < 0.50:
            followers = [r for r in self.table.isr if r != self.table.leader]
            if followers and len(self.table.isr) > 1:
                self.publish(isr=tuple(r for r in self.table.isr if r != rng.choice(followers)))
            return "shrink"
        if roll < 0.58:
            if n.leads():
                self.expand(n, rng.choice(NODES))
            return f"expand {n.id}"
        if roll < 0.65:
            if n.load is not None:
                self.finish_load(n)
            return f"load {n.id}"
        if roll < 0.75:
            self.settle_writes(n)
            return f"settle {n.id}"
        if roll < 0.93:
            txn = rng.randrange(TXNS)
            self.request(n, txn, rng.choice((None, "commit", "abort")))
            return f"request {n.id} txn {txn}"
        if roll < 0.97 or len(live) == 1:
            dead = [m for m in self.nodes.values() if not m.alive]
            if dead:
                self.restart(rng.choice(dead))
            return "restart"
        self.crash(n)
        return f"crash {n.id}"

    # -- invariants -----------------------------------------------------------------------
    def check(self, what: str) -> None:
        serving = [(n.id, n.seat.epoch) for n in self.nodes.values() if n.alive and n.seat.serving()]
        epochs = [e for _, e in serving]
        assert len(epochs) == len(set(epochs)), f"after {what}: two brokers serve one epoch: {serving}"
        assert all(e <= self.table.leader_epoch for e in epochs), what
        for n in self.nodes.values():
            if n.mem is not None or n.load is not None:
                assert n.seat.state in (Seat.LOADING, Seat.LOADED), f"after {what}: {n.id} holds state unseated"
                assert n.leads(), f"after {what}: follower {n.id} holds coordinator state"
        for txn in set(self.answered) | set(self.markers):
            seen = self.answered.get(txn, set()) | self.markers.get(txn, set())
            assert len(seen) <= 1, f"after {what}: txn {txn} both committed and aborted: {seen}"
        leader = self.nodes.get(self.table.leader)
        if leader is not None and leader.alive:
            for offset, rec in self.answered_recs:
                assert offset < len(leader.log) and leader.log[offset] == rec, \
                    f"after {what}: answered {rec} at {offset} missing on leader {leader.id}"

    def settle(self) -> None:
        for n in self.nodes.values():
            if not n.alive:
                self.restart(n)
        if self.table.leader == NO_LEADER:
            self.elect()
        for _ in range(200):
            for n in self.nodes.values():
                while n.inbox:
                    self.deliver(n)
                if n.view is not None and not n.leads():
                    self.fetch(n)
                elif n.leads():
                    for r in NODES:
                        self.expand(n, r)
                    if n.load is not None:
                        self.finish_load(n)
                    self.settle_writes(n)
                self.check("settling")
        leader = self.nodes[self.table.leader]
        assert leader.seat.serving(), "the final leader serves once settled"
        assert not leader.pending and leader.hw == len(leader.log)
        for rec in leader.log:
            if rec.kind == "prepare":
                assert self.markers.get(rec.txn) == {rec.outcome}, f"{rec} never rolled forward"
                assert leader.mem[rec.txn] == ("complete", rec.outcome)
        for txn, outcomes in self.answered.items():
            assert self.markers.get(txn) == outcomes, f"answered txn {txn} has no marker"


@pytest.mark.parametrize("seed", range(12))
def test_seat_load_unload_racing_coordinator_appends(seed):
    model = Model(random.Random(seed))
    for _ in range(2500):
        what = model.step()
        model.check(what)
    model.settle()
    # The run exercised what it is about.
    assert model.answered and len({e for _, e in model.loaded_epochs}) > 2


def _deliver_all(model: Model) -> None:
    for n in model.nodes.values():
        while n.inbox:
            model.deliver(n)


def test_new_leader_does_not_roll_forward_an_uncommitted_prepare():
    """Broker 1 becomes leader holding a Prepare(commit) that broker 2 never fetched (past
    the high watermark). Rolled forward at once, its commit markers would contradict the
    abort broker 2 decides without that record after the next election."""
    model = Model(random.Random(0))
    n0, n1, n2 = (model.nodes[i] for i in NODES)
    _deliver_all(model)
    model.finish_load(n0)
    assert model.request(n0, 1, None) == E.NONE
    model.fetch(n1), model.fetch(n2)
    model.settle_writes(n0)
    assert n0.mem == {1: ("ongoing", None)}
    assert model.request(n0, 1, "commit") == E.NONE
    model.fetch(n1)                       # broker 2 stays one record behind
    assert n0.hw == 1 and len(n1.log) == 2
    model.publish(leader=1, leader_epoch=1)
    _deliver_all(model)
    model.finish_load(n1)
    assert n1.seat.error() == E.COORDINATOR_LOAD_IN_PROGRESS and not model.markers
    model.publish(leader=2, leader_epoch=2)
    _deliver_all(model)
    assert n1.seat.error() == E.NOT_COORDINATOR and n1.mem is None
    model.finish_load(n2)
    assert n2.seat.serving(2) and n2.mem == {1: ("ongoing", None)}
    assert model.request(n2, 1, "abort") == E.NONE
    model.fetch(n0), model.fetch(n1)      # both truncate the commit away first
    model.settle_writes(n2)
    model.check("abort on broker 2")
    assert model.answered == {1: {"abort"}} and model.markers == {1: {"abort"}}
    assert all(r.outcome != "commit" for n in (n0, n1, n2) for r in n.log)
