"""CoordinatorSeat's transitions, one rule each (the model test races them)."""
from __future__ import annotations

import pytest

from semel.cluster.coordinator_seat import (
    LOAD, TRANSITIONS, UNLOAD, CoordinatorSeat, IllegalSeatTransition, Seat, internal_replication_factor,
)
from semel.cluster.state import NO_LEADER, PartitionState
from semel.protocol.errors import KafkaError as E

_version = iter(range(1, 10_000))


def st(leader: int, epoch: int, replicas=(0, 1, 2), isr=None, version=None) -> PartitionState:
    return PartitionState("__consumer_offsets", 0, replicas, leader, epoch, isr or replicas,
                          next(_version) if version is None else version)


def test_leader_loads_serves_and_unloads_at_once_on_losing():
    seat = CoordinatorSeat(1)
    assert seat.error() == E.NOT_COORDINATOR
    assert seat.observe(st(1, 4)) == (LOAD, 4)
    assert seat.error() == E.COORDINATOR_LOAD_IN_PROGRESS and not seat.serving()
    assert seat.loaded(4) and seat.serving(4) and seat.error() == E.NONE
    assert seat.observe(st(2, 5)) == (UNLOAD, 4)
    assert seat.error() == E.NOT_COORDINATOR and not seat.serving()


def test_follower_never_loads():
    seat = CoordinatorSeat(0)
    for s in (st(1, 0), st(2, 1), st(NO_LEADER, 2), st(0, 3, replicas=(1, 2))):
        assert seat.observe(s) is None
        assert seat.state == Seat.UNLOADED


def test_isr_change_at_the_same_epoch_keeps_serving():
    seat = CoordinatorSeat(0)
    seat.observe(st(0, 2))
    seat.loaded(2)
    assert seat.observe(st(0, 2, isr=(0, 1))) is None
    assert seat.serving(2)


def test_late_delivery_of_an_older_state_changes_nothing():
    seat = CoordinatorSeat(0)
    assert seat.observe(st(0, 3, version=10)) == (LOAD, 3)
    seat.loaded(3)
    assert seat.observe(st(1, 2, version=9)) is None
    assert seat.serving(3)


def test_load_finishing_after_leadership_moved_is_discarded():
    seat = CoordinatorSeat(0)
    seat.observe(st(0, 1))
    assert seat.observe(st(0, 2)) == (LOAD, 2)     # regained at a newer epoch while loading
    assert not seat.loaded(1) and seat.state == Seat.LOADING
    seat.observe(st(1, 3))
    assert not seat.loaded(2) and seat.state == Seat.UNLOADED


def test_epoch_only_grows_and_is_never_served_twice():
    seat = CoordinatorSeat(0)
    seat.observe(st(0, 5))
    seat.loaded(5)
    seat.observe(st(NO_LEADER, 5))                 # offline, no epoch bump
    assert seat.observe(st(0, 5)) is None and seat.state == Seat.UNLOADED
    assert seat.observe(st(0, 6)) == (LOAD, 6)


def test_regained_between_two_deliveries_reloads():
    seat = CoordinatorSeat(0)
    seat.observe(st(0, 1))
    seat.loaded(1)
    assert seat.observe(st(0, 3)) == (LOAD, 3)     # epoch 2 (another leader) never delivered
    assert seat.state == Seat.LOADING


def test_answer_waits_for_the_high_watermark_and_the_seat():
    seat = CoordinatorSeat(0)
    seat.observe(st(0, 7))
    assert not seat.may_finish_load(high_watermark=9, load_end=10)
    assert seat.may_finish_load(high_watermark=10, load_end=10)
    seat.loaded(7)
    assert seat.answer_error(7, high_watermark=10, end_offset=11) is None
    assert seat.answer_error(7, high_watermark=11, end_offset=11) == E.NONE
    assert seat.answer_error(6, high_watermark=11, end_offset=11) == E.NOT_COORDINATOR
    seat.observe(st(1, 8))
    assert seat.answer_error(7, high_watermark=11, end_offset=11) == E.NOT_COORDINATOR


def test_table_has_no_way_out_of_unloaded_but_lead():
    assert {e for (s, e) in TRANSITIONS if s == Seat.UNLOADED} == {"lead", "lose"}
    seat = CoordinatorSeat(0)
    with pytest.raises(IllegalSeatTransition):
        seat._move("loaded")


@pytest.mark.parametrize("live, rf", [(0, 1), (1, 1), (2, 2), (3, 3), (5, 3)])
def test_internal_replication_factor(live, rf):
    assert internal_replication_factor(live) == rf
