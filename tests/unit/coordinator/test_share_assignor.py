"""The share group's simple assignor: balance first (each partition to one member while
members do not outnumber partitions; each member one partition, partitions shared
evenly, once they do), then stickiness (a join or leave moves only what balance needs);
and the share coordinator handing it out through ShareGroupHeartbeat, the member epoch
moving with each new assignment."""
from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from semel.coordinator.share_assignor import assign, assign_topic
from semel.coordinator.share_state import ShareState
from semel.protocol.errors import KafkaError


def _check_balanced(plan: dict[str, list[int]], partitions: int) -> None:
    owners = Counter(p for ps in plan.values() for p in ps)
    if len(plan) <= partitions:
        assert sorted(owners) == list(range(partitions)) and set(owners.values()) <= {1}
        sizes = [len(ps) for ps in plan.values()]
        assert max(sizes) - min(sizes) <= 1
    else:
        assert all(len(ps) == 1 for ps in plan.values())
        counts = [owners.get(p, 0) for p in range(partitions)]
        assert max(counts) - min(counts) <= 1


@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 12), st.integers(0, 2 ** 16))
def test_balanced_and_sticky_after_any_join_or_leave(before, after, partitions, seed):
    first = [f"m{i}" for i in range(before)]
    plan = assign_topic(first, partitions, {})
    _check_balanced(plan, partitions)
    # Members come and go: those who stay keep what balance lets them keep.
    later = [f"m{i}" for i in range(seed % 3, seed % 3 + after)]
    again = assign_topic(later, partitions, plan)
    _check_balanced(again, partitions)
    if before <= partitions and after <= partitions:
        quota = -(-partitions // after)
        for m in set(first) & set(later):
            kept = set(plan[m]) & set(again[m])
            assert len(kept) >= min(len(plan[m]), partitions // after)   # never loses more than balance needs
            assert len(again[m]) <= quota


def test_join_moves_only_what_balance_needs():
    two = assign_topic(["a", "b"], 4, {})
    three = assign_topic(["a", "b", "c"], 4, two)
    moved = sum(len(set(two[m]) - set(three[m])) for m in ("a", "b"))
    assert moved == 1 and len(three["c"]) == 1


def test_more_members_than_partitions_share_them():
    plan = assign_topic(["a", "b", "c", "d", "e"], 2, {})
    assert sorted(Counter(p for ps in plan.values() for p in ps).values()) == [2, 3]


def test_topics_are_balanced_among_their_own_subscribers():
    plan = assign({"a": ("x", "y"), "b": ("x",)}, {"x": 2, "y": 3}, {})
    assert [tp for tp in plan["a"] if tp[0] == "y"] == [("y", 0), ("y", 1), ("y", 2)]
    assert len([tp for tp in plan["a"] if tp[0] == "x"]) == 1 and len(plan["b"]) == 1


def test_heartbeats_hand_out_the_assignment_and_move_the_epoch():
    state = ShareState()
    counts = {"t": 4}
    a = state.heartbeat("g", "a", 0, ("t",), None, counts, 0)
    assert a.error == KafkaError.NONE and a.assignment == [("t", p) for p in range(4)]
    b = state.heartbeat("g", "b", 0, ("t",), None, counts, 0)
    assert len(b.assignment) == 2
    # a's next heartbeat brings its smaller assignment and a newer epoch.
    a2 = state.heartbeat("g", "a", a.epoch, ("t",), None, counts, 1)
    assert a2.error == KafkaError.NONE and a2.epoch > a.epoch
    assert sorted(a2.assignment + b.assignment) == [("t", p) for p in range(4)]
    a3 = state.heartbeat("g", "a", a2.epoch, None, None, counts, 2)
    assert (a3.epoch, a3.assignment) == (a2.epoch, a2.assignment)   # unchanged: same epoch
    # b leaves: a gets everything back.
    state.heartbeat("g", "b", -1, None, None, counts, 3)
    a4 = state.heartbeat("g", "a", a3.epoch, None, None, counts, 4)
    assert a4.assignment == [("t", p) for p in range(4)] and a4.epoch > a3.epoch
