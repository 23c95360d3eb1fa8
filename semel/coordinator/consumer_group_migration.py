"""Online migration between the classic group protocol and the consumer group protocol
(KIP-848), as pure functions beside consumer_group_rules.

Upgrade: a member of the consumer protocol joining a classic group that has members
turns it into a consumer group (policy `upgrade` or `bidirectional`). Each classic
member is carried over with its subscription, its current assignment and the
generation as its member epoch; the group epoch starts at the generation.

Classic members of a consumer group keep speaking JoinGroup/SyncGroup/Heartbeat. The
server's assignor decides their partitions: a JoinGroup is their heartbeat with a
full report (the partitions they still own are in their subscription; an eager
member owns none when it rejoins), SyncGroup hands out what they may hold, and a
Heartbeat answers REBALANCE_IN_PROGRESS when they must rejoin to move on (their
epoch is behind the group's, they hold partitions to give up, or partitions they
wait for were released). The same reconciliation as for the other members applies,
so no partition is held by two members, whatever protocol each speaks.

Downgrade: when the last member of the consumer protocol leaves and classic members
remain (policy `downgrade` or `bidirectional`), the group becomes a classic group
again, at the group epoch as its generation, and rebalances.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Iterable, Mapping

from ..protocol.consumer_protocol import (
    PROTOCOL_TYPE, MalformedProtocol, decode_assignment, decode_subscription, encode_assignment,
)
from ..protocol.errors import KafkaError
from .consumer_group_rules import (
    EMPTY, Answer, ClassicMeta, ConsumerGroup, Matcher, MemberAssignment, MemberMeta, MemberState,
    reconcile, refresh,
)


class MigrationPolicy(str, Enum):
    """group.consumer.migration.policy, as Kafka 4 names it."""
    BIDIRECTIONAL = "bidirectional"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    DISABLED = "disabled"

    @property
    def upgrades(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.UPGRADE)

    @property
    def downgrades(self) -> bool:
        return self in (MigrationPolicy.BIDIRECTIONAL, MigrationPolicy.DOWNGRADE)


@dataclass(frozen=True)
class ClassicMember:
    """A classic member as the classic group holds it, or as its JoinGroup names it."""
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""


def upgrade_refusal(policy: MigrationPolicy, protocol_type: str | None, members: list[ClassicMember],
                    group_id: str) -> str | None:
    """Why a classic group with members cannot become a consumer group (None: it can)."""
    if not policy.upgrades:
        return (f"Cannot upgrade classic group {group_id} to consumer group because the online "
                "upgrade is disabled.")
    if protocol_type != PROTOCOL_TYPE or not all(_decodes(m) for m in members):
        return (f"Cannot upgrade classic group {group_id} to consumer group because the group does "
                "not use the consumer embedded protocol.")
    return None


def _decodes(m: ClassicMember) -> bool:
    try:
        decode_subscription(m.protocols[0][1] if m.protocols else b"")
        decode_assignment(m.assignment)
    except (MalformedProtocol, UnicodeDecodeError):
        return False
    return True


def from_classic(group_id: str, generation: int, members: list[ClassicMember]) -> ConsumerGroup:
    """The consumer group a classic group becomes: its members carried over as they are."""
    g = ConsumerGroup(group_id, epoch=generation, target_epoch=generation)
    for m in members:
        sub = decode_subscription(m.protocols[0][1])
        assigned = decode_assignment(m.assignment)
        g.members[m.member_id] = _meta(m, sub.topics, sub.rack)
        g.target[m.member_id] = assigned
        g.current[m.member_id] = MemberAssignment(generation, -1, MemberState.STABLE, assigned, EMPTY)
    return g


def _meta(m: ClassicMember, topics: Iterable[str], rack: str | None, old: MemberMeta | None = None) -> MemberMeta:
    base = old or MemberMeta(m.member_id)
    return replace(base, instance_id=m.instance_id, rack_id=rack if rack is not None else base.rack_id,
                   client_id=m.client_id or base.client_id, client_host=m.client_host or base.client_host,
                   topics=tuple(sorted(set(topics))), regex=None, assignor=None,
                   rebalance_timeout_ms=(m.rebalance_timeout_ms if m.rebalance_timeout_ms > 0
                                         else base.rebalance_timeout_ms),
                   classic=ClassicMeta(m.session_timeout_ms, m.protocols))


def classic_join(group: ConsumerGroup, m: ClassicMember, topics: Mapping[str, int],
                 matches: Matcher) -> tuple[ConsumerGroup, Answer]:
    """A JoinGroup of a classic member: its subscription and the partitions it still owns
    are a full heartbeat. Answers its epoch (the generation it is told) and what it may hold."""
    try:
        sub = decode_subscription(m.protocols[0][1])
    except (MalformedProtocol, IndexError):
        return group, Answer(KafkaError.INCONSISTENT_GROUP_PROTOCOL, m.member_id, -1)
    g = group.copy()
    start = g.epoch
    old = g.members.get(m.member_id) or _take_over(g, m)
    if old is None:
        g.current[m.member_id] = MemberAssignment()
        g.epoch += 1
    new = _meta(m, sub.topics, sub.rack, old)
    if old is not None and (new.topics, new.regex, new.assignor) != (old.topics, old.regex, old.assignor):
        g.epoch += 1
    g.members[m.member_id] = new
    refresh(g, topics, matches, bumped=g.epoch > start)
    cur = g.current[m.member_id]
    # What it reports not owning any more it has given up (an eager member, all of it).
    before = replace(cur, assigned=cur.assigned & sub.owned, revoking=cur.revoking & sub.owned)
    after = reconcile(before, g.target_epoch, g.target.get(m.member_id, EMPTY),
                      g.owned_by_others(m.member_id), sub.owned)
    g.current[m.member_id] = after
    return g, Answer(KafkaError.NONE, m.member_id, after.epoch, after.assigned)


def _take_over(g: ConsumerGroup, m: ClassicMember) -> MemberMeta | None:
    """A static classic member back under a new member id (its process restarted) takes
    its predecessor's place, target and epoch, with no new group epoch; the predecessor
    is gone (its requests are UNKNOWN_MEMBER_ID)."""
    if m.instance_id is None:
        return None
    holder = next((mid for mid, x in g.members.items() if x.instance_id == m.instance_id), None)
    if holder is None:
        return None
    meta = replace(g.members.pop(holder), member_id=m.member_id)
    g.members[m.member_id] = meta
    g.target[m.member_id] = g.target.pop(holder, EMPTY)
    g.current[m.member_id] = g.current.pop(holder)
    return meta


def classic_heartbeat(group: ConsumerGroup, member_id: str, generation: int) -> KafkaError:
    """Kafka's answer to a classic member's Heartbeat in a consumer group: rejoin
    (REBALANCE_IN_PROGRESS) when its epoch is behind the group's, when it must give
    partitions up, or when partitions it waits for are free now."""
    cur = group.current.get(member_id)
    meta = group.members.get(member_id)
    if cur is None or meta is None or meta.classic is None:
        return KafkaError.UNKNOWN_MEMBER_ID
    if generation != cur.epoch:
        return KafkaError.ILLEGAL_GENERATION
    if cur.epoch < group.epoch or cur.state is MemberState.UNREVOKED_PARTITIONS:
        return KafkaError.REBALANCE_IN_PROGRESS
    if cur.state is MemberState.UNRELEASED_PARTITIONS:
        waiting = group.target.get(member_id, EMPTY) - cur.assigned
        if not waiting & group.owned_by_others(member_id):
            return KafkaError.REBALANCE_IN_PROGRESS
    return KafkaError.NONE


def classic_sync(group: ConsumerGroup, member_id: str, generation: int) -> tuple[KafkaError, MemberAssignment | None]:
    cur = group.current.get(member_id)
    meta = group.members.get(member_id)
    if cur is None or meta is None or meta.classic is None:
        return KafkaError.UNKNOWN_MEMBER_ID, None
    if generation != cur.epoch:
        return KafkaError.ILLEGAL_GENERATION, None
    return KafkaError.NONE, cur


def protocol_name(meta: MemberMeta) -> str:
    """The protocol a classic member is told: its first (the server assigns anyway)."""
    return meta.classic.protocols[0][0] if meta.classic and meta.classic.protocols else ""


def downgrades(group: ConsumerGroup, policy: MigrationPolicy) -> bool:
    """Does this group (after a member of the consumer protocol left) become classic?
    Only when members remain and every one speaks the classic protocol."""
    return (policy.downgrades and bool(group.members)
            and all(m.classic is not None for m in group.members.values()))


def to_classic(group: ConsumerGroup) -> list[ClassicMember]:
    """The members a downgraded group keeps, with what each holds now."""
    out = []
    for mid, meta in group.members.items():
        assert meta.classic is not None
        cur = group.current.get(mid)
        out.append(ClassicMember(mid, meta.instance_id, meta.client_id, meta.client_host,
                                 meta.rebalance_timeout_ms, meta.classic.session_timeout_ms,
                                 meta.classic.protocols,
                                 encode_assignment(cur.assigned if cur else EMPTY)))
    return out
