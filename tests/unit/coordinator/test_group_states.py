"""The group state transition table and the per-state request tables."""
import pytest

from semel.coordinator.group_states import (
    COMMIT_RESULT, HEARTBEAT_RESULT, SYNC_RESULT, TRANSITIONS, Event, GroupState,
    IllegalTransition, transition,
)
from semel.protocol.errors import KafkaError

S, E = GroupState, Event


def test_happy_path_through_a_rebalance():
    state = S.EMPTY
    for event, expected in [(E.REBALANCE, S.PREPARING_REBALANCE), (E.JOINED, S.COMPLETING_REBALANCE),
                            (E.ASSIGNED, S.STABLE), (E.REBALANCE, S.PREPARING_REBALANCE),
                            (E.EMPTIED, S.EMPTY), (E.UNLOAD, S.DEAD)]:
        state = transition(state, event)
        assert state is expected


@pytest.mark.parametrize("state", list(S))
def test_every_state_can_be_unloaded_to_dead(state):
    assert transition(state, E.UNLOAD) is S.DEAD


@pytest.mark.parametrize("state,event", [
    (S.EMPTY, E.JOINED), (S.EMPTY, E.ASSIGNED), (S.EMPTY, E.EMPTIED),
    (S.STABLE, E.JOINED), (S.STABLE, E.ASSIGNED),
    (S.PREPARING_REBALANCE, E.ASSIGNED), (S.PREPARING_REBALANCE, E.REBALANCE),
    (S.COMPLETING_REBALANCE, E.JOINED), (S.COMPLETING_REBALANCE, E.EMPTIED),
    (S.DEAD, E.REBALANCE), (S.DEAD, E.JOINED),
])
def test_illegal_transitions_raise(state, event):
    assert (state, event) not in TRANSITIONS
    with pytest.raises(IllegalTransition):
        transition(state, event)


def test_only_join_completion_leaves_preparing_rebalance_besides_unload():
    exits = {ev for (st, ev) in TRANSITIONS if st is S.PREPARING_REBALANCE}
    assert exits == {E.JOINED, E.EMPTIED, E.UNLOAD}


def test_stable_is_reached_only_from_completing_rebalance():
    sources = {st for (st, _), dst in TRANSITIONS.items() if dst is S.STABLE}
    assert sources == {S.COMPLETING_REBALANCE}


@pytest.mark.parametrize("table", [HEARTBEAT_RESULT, SYNC_RESULT, COMMIT_RESULT])
def test_request_tables_cover_every_state(table):
    assert set(table) == set(S)


def test_heartbeat_tells_members_to_rejoin_only_while_preparing():
    rejoin = {s for s, e in HEARTBEAT_RESULT.items() if e == KafkaError.REBALANCE_IN_PROGRESS}
    assert rejoin == {S.PREPARING_REBALANCE}
    assert COMMIT_RESULT[S.COMPLETING_REBALANCE] == KafkaError.REBALANCE_IN_PROGRESS
    assert COMMIT_RESULT[S.PREPARING_REBALANCE] == KafkaError.NONE
