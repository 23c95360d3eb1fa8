"""The controller's decisions (semel.cluster.controller): assignment spread, clean
election, and a seeded-interleaving model of two controllers racing after a lease
handover against a compare-and-set store, with the partition leaders' own ISR
changes in between. Invariants are checked after every step."""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from semel.cluster.controller import assign_replicas, decide
from semel.cluster.state import NO_LEADER, PartitionState


def test_assignment_spreads_leaders_and_replicas_evenly():
    brokers = [1, 2, 3]
    for start in range(3):
        for shift in range(3):
            got = assign_replicas(brokers, 6, 3, start, shift)
            assert all(len(set(r)) == 3 for r in got)
            assert Counter(r[0] for r in got) == {1: 2, 2: 2, 3: 2}
            for position in (1, 2):   # followers spread too, not always the same broker second
                assert len({r[position] for r in got}) == 3


def test_assignment_refuses_more_replicas_than_brokers():
    with pytest.raises(ValueError, match="needs that many live brokers"):
        assign_replicas([1, 2], 1, 3)
    with pytest.raises(ValueError):
        assign_replicas([1, 2], 1, 0)


def _st(leader, isr, replicas=(1, 2, 3), epoch=4):
    return PartitionState("t", 0, tuple(replicas), leader, epoch, tuple(isr), 7)


def test_live_leader_stays_and_dead_followers_leave_the_isr():
    assert decide(_st(1, (1, 2, 3)), {1, 2, 3}) is None
    assert decide(_st(1, (1, 2, 3)), {1, 3}) == replace(_st(1, (1, 3)))


def test_dead_leader_replaced_by_first_live_isr_replica_with_next_epoch():
    got = decide(_st(1, (1, 3, 2), replicas=(1, 2, 3)), {2, 3})
    assert (got.leader, got.leader_epoch, got.isr) == (2, 5, (3, 2))


def test_no_unclean_election_and_no_needless_move_back():
    # Only 3 is live, but it is not in the ISR: the partition goes offline, keeping its ISR.
    off = decide(_st(1, (1, 2)), {3})
    assert (off.leader, off.leader_epoch, off.isr) == (NO_LEADER, 5, (1, 2))
    assert decide(off, {3}) is None               # stays offline, epoch unchanged
    back = decide(off, {2, 3})                    # an ISR member returns: it leads
    assert (back.leader, back.leader_epoch, back.isr) == (2, 6, (2,))
    assert decide(_st(2, (2, 1)), {1, 2, 3}) is None   # the preferred replica's return moves nothing


class Store:
    """Partition states by key with a version per write: the etcd side of the model."""

    def __init__(self, states):
        self.version = 1
        self.parts = {(s.topic, s.partition): replace(s, version=self.version) for s in states}

    def cas(self, old: PartitionState, new: PartitionState) -> PartitionState | None:
        key = (old.topic, old.partition)
        if self.parts[key].version != old.version:
            return None
        self.version += 1
        self.parts[key] = replace(new, version=self.version)
        return self.parts[key]


class ControllerModel:
    """One controller: a possibly stale set of live brokers (its watch lags) and decisions
    read but not yet written (the await between read and CAS)."""

    def __init__(self):
        self.live: set[int] = set()
        self.pending: list[tuple[PartitionState, PartitionState]] = []


def _partitions(rng):
    out = []
    for p in range(6):
        replicas = tuple(rng.sample([1, 2, 3], rng.choice([1, 2, 3])))
        out.append(PartitionState("t", p, replicas, replicas[0], 0, replicas))
    return out


def _check(store: Store, history: dict, previous: dict) -> None:
    for key, st in store.parts.items():
        assert st.isr and set(st.isr) <= set(st.replicas), st
        assert st.leader == NO_LEADER or st.leader in st.isr, st
        old = previous[key]
        assert st.leader_epoch >= old.leader_epoch, f"epoch went back: {old} -> {st}"
        if st.leader_epoch == old.leader_epoch:
            assert st.leader == old.leader, f"leader changed without a new epoch: {old} -> {st}"
        elif st.leader != NO_LEADER:
            assert st.leader in old.isr, f"unclean election: {old} -> {st}"
        seen = history.setdefault((key, st.leader_epoch), st.leader)
        assert seen == st.leader, f"two leaders for epoch {st.leader_epoch} of {key}: {seen}, {st.leader}"
        previous[key] = st


@pytest.mark.parametrize("seed", range(300))
def test_racing_controllers_never_give_one_epoch_two_leaders(seed):
    rng = random.Random(seed)
    store = Store(_partitions(rng))
    live = {1, 2, 3}
    controllers = [ControllerModel(), ControllerModel()]
    for c in controllers:
        c.live = set(live)
    history: dict = {}
    previous = dict(store.parts)
    _check(store, history, previous)
    for _ in range(120):
        op = rng.random()
        c = rng.choice(controllers)
        if op < 0.15:                                   # a broker dies or comes back
            b = rng.choice([1, 2, 3])
            live.symmetric_difference_update({b})
        elif op < 0.35:                                 # a controller's watch catches up
            c.live = set(live)
        elif op < 0.6:                                  # a controller reads and decides
            st = rng.choice(list(store.parts.values()))
            want = decide(st, c.live)
            if want is not None:
                c.pending.append((st, want))
        elif op < 0.85 and c.pending:                   # ... and writes later, by CAS
            st, want = c.pending.pop(rng.randrange(len(c.pending)))
            store.cas(st, want)
        else:                                           # a live leader changes its ISR (AlterPartition)
            st = rng.choice(list(store.parts.values()))
            if st.leader in live:
                followers = [r for r in st.replicas if r != st.leader]
                isr = {st.leader} | {r for r in followers if r in live and rng.random() < 0.5}
                store.cas(st, replace(st, isr=tuple(r for r in st.replicas if r in isr)))
        _check(store, history, previous)
    # Once both controllers see the truth and their stale decisions are spent, the
    # cluster settles: every partition with a live ISR member has a live leader.
    for c in controllers:
        c.live = set(live)
        c.pending.clear()
    for _ in range(3):
        for st in list(store.parts.values()):
            want = decide(st, live)
            if want is not None:
                store.cas(st, want)
        _check(store, history, previous)
    for st in store.parts.values():
        if any(r in live for r in st.isr):
            assert st.leader in live, st
