"""The rules of the consumer group protocol (KIP-848) as pure functions: a group's
state and one heartbeat (or one fencing) in, the next state and the answer out.
No I/O, no clock, no awaiting: the coordinator (consumer_group.py) logs the
difference between the two states and applies it once durable, and the
model-based test drives these functions directly.

Epochs. The group epoch grows whenever what the assignment depends on changes
(a member joins, leaves or changes its subscription; a subscribed topic appears
or grows). The target assignment is computed for a group epoch (the assignment
epoch). A member's epoch moves to the assignment epoch once it holds its target,
or all of it that it may hold yet.

Incremental reconciliation. A partition moves between members in two steps: the
previous owner is told to give it up (its state is UNREVOKED_PARTITIONS and its
epoch does not move) until a heartbeat of its shows it no longer owns it; only
then may the next owner be given it (until then it waits in
UNRELEASED_PARTITIONS). So no partition is ever held by two members.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Mapping

from ..protocol.errors import KafkaError
from .consumer_assignors import ASSIGNORS, DEFAULT_ASSIGNOR, TopicPartition

LEAVE_EPOCH = -1           # a member leaves for good
STATIC_LEAVE_EPOCH = -2    # a static member leaves and will come back under its instance id

Partitions = frozenset[TopicPartition]
EMPTY: Partitions = frozenset()


class MemberState(str, Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class Step(Enum):
    """What reconciling a member against the target found (the table's events)."""
    UP_TO_DATE = "up_to_date"          # at the target's epoch and holding all of it
    STILL_OWNS_REVOKED = "still_owns"  # told to give partitions up; its heartbeat still has them
    MUST_REVOKE = "must_revoke"        # holds partitions the target gives to others
    WAITS_FOR_RELEASE = "waits"        # the target gives it partitions others still hold
    COMPLETE = "complete"              # now holds its whole target


M = MemberState
# (state, step) -> next state. A pair not in the table is a bug (KeyError).
MEMBER_TRANSITIONS: dict[tuple[MemberState, Step], MemberState] = {
    (M.STABLE, Step.UP_TO_DATE): M.STABLE,
    (M.STABLE, Step.MUST_REVOKE): M.UNREVOKED_PARTITIONS,
    (M.STABLE, Step.WAITS_FOR_RELEASE): M.UNRELEASED_PARTITIONS,
    (M.STABLE, Step.COMPLETE): M.STABLE,
    (M.UNREVOKED_PARTITIONS, Step.STILL_OWNS_REVOKED): M.UNREVOKED_PARTITIONS,
    (M.UNREVOKED_PARTITIONS, Step.MUST_REVOKE): M.UNREVOKED_PARTITIONS,
    (M.UNREVOKED_PARTITIONS, Step.WAITS_FOR_RELEASE): M.UNRELEASED_PARTITIONS,
    (M.UNREVOKED_PARTITIONS, Step.COMPLETE): M.STABLE,
    (M.UNRELEASED_PARTITIONS, Step.MUST_REVOKE): M.UNREVOKED_PARTITIONS,
    (M.UNRELEASED_PARTITIONS, Step.WAITS_FOR_RELEASE): M.UNRELEASED_PARTITIONS,
    (M.UNRELEASED_PARTITIONS, Step.COMPLETE): M.STABLE,
}


@dataclass(frozen=True)
class ClassicMeta:
    """A member on the classic protocol (JoinGroup/SyncGroup/Heartbeat) of a group of this
    protocol: its session timeout and its (name, metadata) protocols in its order."""
    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class MemberMeta:
    """What a member told the coordinator about itself."""
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    topics: tuple[str, ...] = ()
    regex: str | None = None
    assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    classic: ClassicMeta | None = None


@dataclass(frozen=True)
class MemberAssignment:
    """What a member holds: `assigned` it may use, `revoking` it must give up."""
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Partitions = EMPTY
    revoking: Partitions = EMPTY


@dataclass
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    # The subscribed topics' partition counts the group epoch last accounted for.
    topic_counts: tuple[tuple[str, int], ...] = ()
    target_epoch: int = 0
    members: dict[str, MemberMeta] = field(default_factory=dict)
    target: dict[str, Partitions] = field(default_factory=dict)
    current: dict[str, MemberAssignment] = field(default_factory=dict)

    def copy(self) -> "ConsumerGroup":
        return replace(self, members=dict(self.members), target=dict(self.target),
                       current=dict(self.current))

    @property
    def assignor(self) -> str:
        """The assignor most members asked for (ties by name); the default when none did."""
        votes: dict[str, int] = {}
        for m in self.members.values():
            if m.assignor:
                votes[m.assignor] = votes.get(m.assignor, 0) + 1
        if not votes:
            return DEFAULT_ASSIGNOR
        return min(votes, key=lambda name: (-votes[name], name))

    def state_name(self) -> str:
        """Kafka's group states: Empty, Assigning, Reconciling, Stable."""
        if not self.members:
            return "Empty"
        if self.target_epoch < self.epoch:
            return "Assigning"
        if any(a.epoch != self.target_epoch or a.state is not M.STABLE
               for a in self.current.values() if a.epoch != STATIC_LEAVE_EPOCH):
            return "Reconciling"
        return "Stable"

    def owned_by_others(self, member_id: str) -> set[TopicPartition]:
        out: set[TopicPartition] = set()
        for mid, a in self.current.items():
            if mid != member_id:
                out |= a.assigned | a.revoking
        return out


@dataclass(frozen=True)
class Heartbeat:
    """One ConsumerGroupHeartbeat, as the rules need it. None = unchanged since the last one."""
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    topics: tuple[str, ...] | None = None
    regex: str | None = None
    assignor: str | None = None
    owned: Partitions | None = None
    client_id: str = ""
    client_host: str = ""
    # v0: the coordinator names a joining member; v1+: the member names itself.
    coordinator_names_member: bool = False


@dataclass(frozen=True)
class Answer:
    error: KafkaError = KafkaError.NONE
    member_id: str = ""
    member_epoch: int = 0
    assignment: Partitions | None = None   # None: unchanged, not sent
    message: str | None = None


Matcher = Callable[[str, str], bool]   # (regex, topic) -> matches


def subscribed_topics(meta: MemberMeta, topics: Mapping[str, int], matches: Matcher) -> frozenset[str]:
    """The member's topics: those it named, and those its regex matches that exist."""
    names = set(meta.topics)
    if meta.regex:
        names |= {t for t in topics if matches(meta.regex, t)}
    return frozenset(names)


def refresh(group: ConsumerGroup, topics: Mapping[str, int], matches: Matcher,
             bumped: bool = False) -> dict[str, frozenset[str]]:
    """Bump the group epoch when the subscribed topics' partition counts changed since it
    last accounted for them (once per transition: `bumped` when it moved already);
    recompute the target when the group epoch moved past it."""
    subs = {mid: subscribed_topics(m, topics, matches) for mid, m in group.members.items()}
    wanted = sorted({t for s in subs.values() for t in s})
    counts = tuple((t, topics[t]) for t in wanted if t in topics)
    if counts != group.topic_counts:
        group.topic_counts = counts
        if not bumped:
            group.epoch += 1
    if group.target_epoch < group.epoch:
        assign = ASSIGNORS[group.assignor]
        group.target = dict(assign(subs, dict(counts), group.target))
        group.target_epoch = group.epoch
    return subs


def reconcile(cur: MemberAssignment, target_epoch: int, target: Partitions,
              owned_by_others: set[TopicPartition], reported: Partitions | None) -> MemberAssignment:
    """The member's next assignment (see the module's docstring)."""
    if cur.state is M.UNREVOKED_PARTITIONS:
        if reported is None or reported & cur.revoking:
            return _to(cur, Step.STILL_OWNS_REVOKED)
        cur = replace(cur, revoking=EMPTY)
    if cur.epoch == target_epoch and cur.state is M.STABLE and cur.assigned == target:
        # (A classic member that rejoined having given its partitions up is at the target's
        # epoch without holding it: it goes on below and gets them again.)
        return _to(cur, Step.UP_TO_DATE)
    kept = cur.assigned & target
    revoke = cur.assigned - target
    if revoke:
        return replace(_to(cur, Step.MUST_REVOKE), assigned=kept, revoking=revoke)
    assigned = kept | ((target - kept) - owned_by_others)
    previous = cur.epoch if cur.epoch != target_epoch else cur.previous_epoch
    step = Step.COMPLETE if assigned == target else Step.WAITS_FOR_RELEASE
    return replace(_to(cur, step), epoch=target_epoch, previous_epoch=previous,
                   assigned=assigned, revoking=EMPTY)


def _to(cur: MemberAssignment, step: Step) -> MemberAssignment:
    nxt = MEMBER_TRANSITIONS[(cur.state, step)]
    return cur if nxt is cur.state else replace(cur, state=nxt)


def remove_member(group: ConsumerGroup, member_id: str) -> ConsumerGroup:
    """The member is gone (left, or fenced after its session): its partitions are free
    and the group epoch moves so the target is computed without it."""
    new = group.copy()
    if member_id in new.members:
        del new.members[member_id]
        new.target.pop(member_id, None)
        new.current.pop(member_id, None)
        new.epoch += 1
    return new


def heartbeat(group: ConsumerGroup | None, group_id: str, hb: Heartbeat, topics: Mapping[str, int],
              matches: Matcher, *, new_member_id: Callable[[], str] = lambda: str(uuid.uuid4())
              ) -> tuple[ConsumerGroup | None, Answer]:
    """Apply one heartbeat. Returns the next state (the same object when refused) and
    the answer. `topics` maps every topic a member may subscribe to -> partition count."""
    def refuse(err: KafkaError, msg: str | None = None) -> tuple[ConsumerGroup | None, Answer]:
        return group, Answer(err, hb.member_id, -1 if err else 0, None, msg)

    if not group_id:
        return refuse(KafkaError.INVALID_REQUEST, "GroupId can't be empty.")
    if hb.assignor is not None and hb.assignor not in ASSIGNORS:
        return refuse(KafkaError.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {hb.assignor} is not supported.")
    if not hb.member_id and not (hb.coordinator_names_member and hb.member_epoch == 0):
        return refuse(KafkaError.INVALID_REQUEST, "MemberId can't be empty.")
    g = group.copy() if group is not None else ConsumerGroup(group_id)
    start_epoch = g.epoch

    if hb.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
        return _leave(group, g, hb)
    if hb.member_epoch == 0:
        if hb.topics is None and hb.regex is None:
            return refuse(KafkaError.INVALID_REQUEST,
                          "SubscribedTopicNames or SubscribedTopicRegex must be set in the first request.")
        joined = _join(g, hb, new_member_id)
        if isinstance(joined, Answer):
            return group, joined
        member_id = joined
    else:
        member_id = hb.member_id
        cur = g.current.get(member_id)
        if cur is None:
            return refuse(KafkaError.UNKNOWN_MEMBER_ID)
        lost_answer = (hb.member_epoch == cur.previous_epoch and hb.owned is not None
                       and hb.owned <= cur.assigned)
        if hb.member_epoch != cur.epoch and not lost_answer:
            return refuse(KafkaError.FENCED_MEMBER_EPOCH,
                          f"member epoch {hb.member_epoch} is not the current one")
        _update_meta(g, member_id, hb)

    refresh(g, topics, matches, bumped=g.epoch > start_epoch)
    before = g.current[member_id]
    after = reconcile(before, g.target_epoch, g.target.get(member_id, EMPTY),
                      g.owned_by_others(member_id), hb.owned if hb.member_epoch != 0 else before.assigned)
    g.current[member_id] = after
    send = (hb.member_epoch == 0 or after.assigned != before.assigned
            or (hb.owned is not None and hb.owned != after.assigned))
    return g, Answer(KafkaError.NONE, member_id, after.epoch, after.assigned if send else None)


def _leave(group: ConsumerGroup | None, g: ConsumerGroup, hb: Heartbeat) -> tuple[ConsumerGroup | None, Answer]:
    meta = g.members.get(hb.member_id)
    if meta is None:
        return group, Answer(KafkaError.UNKNOWN_MEMBER_ID, hb.member_id, hb.member_epoch)
    if hb.member_epoch == STATIC_LEAVE_EPOCH and meta.instance_id is not None:
        # Kept with its partitions for its session, so it can come back without a rebalance.
        cur = g.current[hb.member_id]
        g.current[hb.member_id] = replace(cur, epoch=STATIC_LEAVE_EPOCH, previous_epoch=cur.epoch)
        return g, Answer(KafkaError.NONE, hb.member_id, STATIC_LEAVE_EPOCH)
    return remove_member(g, hb.member_id), Answer(KafkaError.NONE, hb.member_id, LEAVE_EPOCH)


def _join(g: ConsumerGroup, hb: Heartbeat, new_member_id: Callable[[], str]) -> str | Answer:
    member_id = hb.member_id or new_member_id()
    if hb.instance_id is not None:
        holder = next((mid for mid, m in g.members.items() if m.instance_id == hb.instance_id), None)
        if holder is not None and holder != member_id:
            old = g.current[holder]
            if old.epoch != STATIC_LEAVE_EPOCH:
                return Answer(KafkaError.UNRELEASED_INSTANCE_ID, member_id, -1, None,
                              f"instance {hb.instance_id} is still held by member {holder}")
            # The static member is back under a new member id: it takes over its
            # predecessor's place, partitions and epoch, with no new group epoch.
            g.members[member_id] = replace(g.members.pop(holder), member_id=member_id)
            g.target[member_id] = g.target.pop(holder, EMPTY)
            g.current[member_id] = replace(g.current.pop(holder), epoch=old.previous_epoch,
                                           previous_epoch=-1)
            _update_meta(g, member_id, hb)
            return member_id
    if member_id in g.members:
        # A member that lost its partitions (fenced) rejoins under its own id.
        g.current[member_id] = MemberAssignment(0, -1, M.STABLE, EMPTY, EMPTY)
        _update_meta(g, member_id, hb)
        return member_id
    g.members[member_id] = MemberMeta(member_id)
    g.current[member_id] = MemberAssignment()
    before = g.epoch
    _update_meta(g, member_id, hb)
    if g.epoch == before:   # a new member always moves the group epoch, once
        g.epoch += 1
    return member_id


def _update_meta(g: ConsumerGroup, member_id: str, hb: Heartbeat) -> None:
    old = g.members[member_id]
    new = replace(
        old,
        instance_id=hb.instance_id if hb.instance_id is not None else old.instance_id,
        rack_id=hb.rack_id if hb.rack_id is not None else old.rack_id,
        client_id=hb.client_id or old.client_id,
        client_host=hb.client_host or old.client_host,
        topics=tuple(sorted(set(hb.topics))) if hb.topics is not None else old.topics,
        regex=(hb.regex or None) if hb.regex is not None else old.regex,
        assignor=hb.assignor if hb.assignor is not None else old.assignor,
        rebalance_timeout_ms=hb.rebalance_timeout_ms if hb.rebalance_timeout_ms > 0 else old.rebalance_timeout_ms,
    )
    if (new.topics, new.regex, new.assignor) != (old.topics, old.regex, old.assignor):
        g.epoch += 1
    g.members[member_id] = new
