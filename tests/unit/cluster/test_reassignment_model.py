"""Partition reassignment's decisions (semel.cluster.reassignment): begin, cancel and
finish, and a seeded-interleaving model in which operators (new targets, cancels), the
leader (ISR joins and shrinks), broker deaths and returns, and the controller (elections
and finishing) act on one partition through a compare-and-set store. After every step:
the state is well formed, leader epochs grow by one per leader change, a new leader was
in the ISR before (no committed record lost), and a finished reassignment ends on the
target asked for last."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from semel.cluster.controller import decide
from semel.cluster.reassignment import Throttle, begin, finish, original, target
from semel.cluster.state import NO_LEADER, PartitionState
from semel.protocol.errors import KafkaError

BROKERS = (0, 1, 2, 3, 4)


def _st(replicas=(0, 1, 2), leader=0, isr=None, epoch=3, adding=(), removing=()):
    return PartitionState("t", 0, tuple(replicas), leader, epoch, tuple(isr if isr is not None else replicas), 1,
                          tuple(adding), tuple(removing))


def test_begin_makes_the_union_with_adding_and_removing():
    got = begin(_st(), (1, 2, 3), BROKERS)
    assert (got.replicas, got.adding, got.removing, got.isr, got.leader, got.leader_epoch) == \
        ((1, 2, 3, 0), (3,), (0,), (0, 1, 2), 0, 3)
    assert original(got) == (0, 1, 2) and target(got) == (1, 2, 3)


def test_finish_waits_for_the_isr_then_moves_a_removed_leader_with_the_next_epoch():
    st = begin(_st(), (1, 2, 3), BROKERS)
    assert finish(st, BROKERS) is None                      # 3 not in sync yet
    done = finish(replace(st, isr=(0, 1, 2, 3)), BROKERS)
    assert (done.replicas, done.isr, done.adding, done.removing) == ((1, 2, 3), (1, 2, 3), (), ())
    assert (done.leader, done.leader_epoch) == (1, 4)


def test_finish_keeps_a_leader_that_stays():
    st = replace(begin(_st(), (0, 1, 3), BROKERS), isr=(0, 1, 2, 3))
    done = finish(st, BROKERS)
    assert (done.replicas, done.leader, done.leader_epoch) == ((0, 1, 3), 0, 3)


def test_cancel_restores_the_original_replicas():
    st = begin(_st(), (3, 4, 2), BROKERS)
    back = begin(replace(st, isr=(0, 1, 2, 3)), None, BROKERS)
    assert (back.replicas, back.isr, back.adding, back.removing, back.leader) == \
        ((0, 1, 2), (0, 1, 2), (), (), 0)


def test_refusals():
    assert begin(_st(), None, BROKERS)[0] is KafkaError.NO_REASSIGNMENT_IN_PROGRESS
    assert begin(_st(), (1, 1), BROKERS)[0] is KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert begin(_st(), (), BROKERS)[0] is KafkaError.INVALID_REPLICA_ASSIGNMENT
    assert begin(_st(), (0, 9), BROKERS)[0] is KafkaError.INVALID_REPLICA_ASSIGNMENT
    # A cancel once only an adding replica is in sync: refused (nothing could lead it).
    st = replace(begin(_st(), (3, 0), BROKERS), leader=3, isr=(3,))
    assert begin(st, None, BROKERS)[0] is KafkaError.INVALID_REPLICA_ASSIGNMENT


def test_a_reorder_completes_at_once():
    got = begin(_st(), (2, 1, 0), BROKERS)
    assert (got.replicas, got.reassigning, got.leader) == ((2, 1, 0), False, 0)


def test_throttle_budget():
    now = [0.0]
    t = Throttle(1000, clock=lambda: now[0])
    assert t.allow() == 1000
    t.spend(1500)
    assert t.allow() == 0
    now[0] += 1.0
    assert t.allow() == 500
    assert Throttle(0).allow() == -1


class Store:
    """A compare-and-set cell holding the partition, as etcd holds its key."""

    def __init__(self, st: PartitionState):
        self.st = st

    def cas(self, old: PartitionState, new: PartitionState | None) -> bool:
        if new is None or old.version != self.st.version or new == old:
            return False
        self.st = replace(new, version=old.version + 1)
        return True


def _check(before: PartitionState, after: PartitionState, live: set[int]) -> None:
    reps = set(after.replicas)
    assert len(after.replicas) == len(reps)
    assert set(after.isr) <= reps and set(after.adding) <= reps and set(after.removing) <= reps
    assert not set(after.adding) & set(after.removing)
    if after.reassigning:
        assert set(original(after)) == reps - set(after.adding) and len(original(after)) == len(after.origin)
    else:
        assert after.origin == ()
    if after.leader != NO_LEADER:
        assert after.leader in after.isr
    assert after.isr, "the ISR is never empty"
    assert after.leader_epoch >= before.leader_epoch
    if after.leader != before.leader:
        assert after.leader_epoch == before.leader_epoch + 1
        if after.leader != NO_LEADER:
            assert after.leader in before.isr, "a new leader holds every committed record"


@pytest.mark.parametrize("seed", range(300))
def test_seeded_interleavings_keep_the_invariants(seed):
    rnd = random.Random(seed)
    store = Store(PartitionState("t", 0, (0, 1, 2), 0, 0, (0, 1, 2), 1))
    live = set(BROKERS)
    asked = None          # the target of the last accepted operator request
    seen = store.st
    for _ in range(60):
        before = store.st
        # Each actor decides on what it read, sometimes a state read a step ago: its CAS loses.
        seen = store.st if rnd.random() < 0.7 else seen
        action = rnd.choice(["alter", "cancel", "join", "shrink", "die", "return", "controller", "controller"])
        if action == "alter":
            new = tuple(rnd.sample(BROKERS, rnd.choice((1, 2, 3))))
            got = begin(seen, new, {b for b in BROKERS if b in live})
            if not isinstance(got, tuple) and store.cas(seen, got):
                asked = new
        elif action == "cancel":
            got = begin(seen, None, live)
            if not isinstance(got, tuple) and store.cas(seen, got):
                asked = original(seen)
        elif action == "join" and seen.leader in live:
            out = [r for r in seen.replicas if r not in seen.isr and r in live]
            if out:
                store.cas(seen, replace(seen, isr=seen.isr + (rnd.choice(out),)))
        elif action == "shrink" and seen.leader in live and len(seen.isr) > 1:
            gone = rnd.choice([r for r in seen.isr if r != seen.leader])
            store.cas(seen, replace(seen, isr=tuple(r for r in seen.isr if r != gone)))
        elif action == "die" and len(live) > 1:
            live.discard(rnd.choice(sorted(live)))
        elif action == "return":
            live.update(BROKERS)
        elif action == "controller":
            store.cas(seen, decide(seen, live) or finish(seen, live))
        _check(before, store.st, live)
        if not store.st.reassigning and asked is not None and store.st is not before and before.reassigning:
            assert store.st.replicas == asked, "a finished reassignment ends on the last target, in its order"
