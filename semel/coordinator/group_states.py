"""Consumer group states and the tables that say what may happen in each.

The classic (pre-KIP-848) group protocol moves a group through five states:

  Empty --REBALANCE--> PreparingRebalance --JOINED--> CompletingRebalance --ASSIGNED--> Stable
    ^                      |   ^                           |                              |
    +-------EMPTIED--------+   +--------REBALANCE----------+-----------REBALANCE----------+

and any live state goes to Dead when the group is deleted, expires or the
coordinator unloads it. Every state change in `group.py` goes through
`transition`, so an illegal move is a loud bug rather than a silent corruption.

The per-request tables below keep the "what does this request get in this
state" decisions in one readable place instead of scattered if-chains.
"""
from __future__ import annotations

from enum import Enum

from ..protocol.errors import KafkaError


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


class Event(Enum):
    REBALANCE = "rebalance"   # membership or metadata changed: (re)start the join phase
    JOINED = "joined"         # join phase over with members: new generation awaits the assignment
    EMPTIED = "emptied"       # join phase over without members: new generation, no one left
    ASSIGNED = "assigned"     # the leader's assignment is durable: members may fetch
    UNLOAD = "unload"         # deleted, expired, or the coordinator is stopping


S, E = GroupState, Event

TRANSITIONS: dict[tuple[GroupState, Event], GroupState] = {
    (S.EMPTY, E.REBALANCE): S.PREPARING_REBALANCE,
    (S.STABLE, E.REBALANCE): S.PREPARING_REBALANCE,
    (S.COMPLETING_REBALANCE, E.REBALANCE): S.PREPARING_REBALANCE,
    (S.PREPARING_REBALANCE, E.JOINED): S.COMPLETING_REBALANCE,
    (S.PREPARING_REBALANCE, E.EMPTIED): S.EMPTY,
    (S.COMPLETING_REBALANCE, E.ASSIGNED): S.STABLE,
    (S.EMPTY, E.UNLOAD): S.DEAD,
    (S.PREPARING_REBALANCE, E.UNLOAD): S.DEAD,
    (S.COMPLETING_REBALANCE, E.UNLOAD): S.DEAD,
    (S.STABLE, E.UNLOAD): S.DEAD,
    (S.DEAD, E.UNLOAD): S.DEAD,
}


class IllegalTransition(RuntimeError):
    """A coordinator bug: an event that the current state does not accept."""


def transition(state: GroupState, event: Event) -> GroupState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"{event.value} is not allowed in state {state.value}") from None


# Heartbeat of a known member with the right generation. During a rebalance the
# answer tells the member to rejoin; in CompletingRebalance a member that already
# got its JoinGroup answer may heartbeat while the leader computes assignments.
HEARTBEAT_RESULT: dict[GroupState, KafkaError] = {
    S.EMPTY: KafkaError.UNKNOWN_MEMBER_ID,
    S.PREPARING_REBALANCE: KafkaError.REBALANCE_IN_PROGRESS,
    S.COMPLETING_REBALANCE: KafkaError.NONE,
    S.STABLE: KafkaError.NONE,
    S.DEAD: KafkaError.COORDINATOR_NOT_AVAILABLE,
}

# SyncGroup of a known member with the right generation: None means "handled by
# the state's own logic" (wait for the leader, or answer with the assignment).
SYNC_RESULT: dict[GroupState, KafkaError | None] = {
    S.EMPTY: KafkaError.UNKNOWN_MEMBER_ID,
    S.PREPARING_REBALANCE: KafkaError.REBALANCE_IN_PROGRESS,
    S.COMPLETING_REBALANCE: None,
    S.STABLE: None,
    S.DEAD: KafkaError.COORDINATOR_NOT_AVAILABLE,
}

# OffsetCommit from a known member with the right generation. Commits during
# PreparingRebalance are allowed (members commit while revoking partitions);
# during CompletingRebalance the next generation's assignment is not known yet.
COMMIT_RESULT: dict[GroupState, KafkaError] = {
    S.EMPTY: KafkaError.NONE,
    S.PREPARING_REBALANCE: KafkaError.NONE,
    S.COMPLETING_REBALANCE: KafkaError.REBALANCE_IN_PROGRESS,
    S.STABLE: KafkaError.NONE,
    S.DEAD: KafkaError.COORDINATOR_NOT_AVAILABLE,
}

STATE_BY_NAME = {s.value.lower(): s for s in GroupState}
