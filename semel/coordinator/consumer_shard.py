"""Consumer-protocol (KIP-848) group membership as a shard: plain Python, no I/O.

Each operation reads the groups in memory and one request (a heartbeat, a session that
ran out, a revocation or rejoin that is overdue, a member's removal) and returns a
`CgOp`: the records that turn the group into its next state (one batch, with the
classic group's record beside them when the group changes protocol) and the answer to
give once they are committed. Nothing here changes memory except `replay`, which puts
an op's records in through the same functions the load's replay of a batch calls
(consumer_records.apply_records, GroupStore.apply_group_record), so a live write and a
restart cannot diverge. The edge (consumer_group.ConsumerGroups) runs each op through
the coordinator runtime's write path and keeps what waits (futures, timers) out of here.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..protocol.consumer_protocol import PROTOCOL_TYPE
from ..protocol.errors import KafkaError
from . import consumer_group_migration as mig
from . import consumer_group_rules as rules
from .consumer_group_rules import Answer, ConsumerGroup, Heartbeat, Matcher
from .consumer_records import Record, apply_records, records_between
from .group_replay import GroupStore
from .group_states import GroupState
from .offsets import GroupRecord, MemberRecord, decode_group_value, group_key, group_value

# What a conversion does to the classic group of the same id, once replayed.
UPGRADE = "upgrade"       # the classic group's record goes (its offsets stay)
DOWNGRADE = "downgrade"   # the classic group comes back from the snapshot in `classic`


@dataclass(eq=False)
class CgOp:
    """`records` (the consumer group's) and `classic` (the classic group's record of a
    conversion: key, value) to write as one batch, then `response`. No records: the
    response is the answer at once. `conversion` names which way the group changes
    protocol (None: it does not)."""
    group_id: str
    response: Answer
    records: list[Record] = field(default_factory=list)
    classic: list[Record] = field(default_factory=list)
    conversion: str | None = None

    def pairs(self) -> list[Record]:
        """The batch in log order: an upgrade's classic tombstone first, a downgrade's
        classic snapshot last (a replay then finds one group of each id)."""
        if self.conversion == UPGRADE:
            return [*self.classic, *self.records]
        return [*self.records, *self.classic]


class ConsumerShard:
    """The consumer groups of one group coordinator, beside the classic ones in `store`
    (the classic group of the same id holds the offsets, and the members again after a
    downgrade). `policy` is group.consumer.migration.policy."""

    def __init__(self, store: GroupStore, policy: str = "bidirectional") -> None:
        self.store = store
        self.policy = mig.MigrationPolicy(policy)

    @property
    def groups(self) -> dict[str, ConsumerGroup]:
        return self.store.consumer_groups

    # --- operations: state + request -> records + answer ------------------------------------

    def transition(self, group_id: str, new: ConsumerGroup | None, answer: Answer) -> CgOp:
        """The records from the group as it is to `new` (refused answers write nothing)."""
        if answer.error:
            return CgOp(group_id, answer)
        return CgOp(group_id, answer, records_between(self.groups.get(group_id), new))

    def heartbeat(self, group_id: str, hb: Heartbeat, topics: Mapping[str, int], matches: Matcher) -> CgOp:
        """A ConsumerGroupHeartbeat. Into a classic group with members it is an upgrade:
        the group is converted first (`upgrade_start`); a member leaving for good goes
        through `remove`, which may turn the group classic again."""
        start, refusal = self.upgrade_start(group_id)
        if refusal is not None:
            return CgOp(group_id, Answer(refusal.error, hb.member_id, -1, None, refusal.message))
        old = start or self.groups.get(group_id)
        new, answer = rules.heartbeat(old, group_id, hb, topics, matches)
        if answer.error or new is None:
            return CgOp(group_id, answer)
        if start is not None:
            op = self.transition(group_id, new, answer)
            op.classic, op.conversion = [(group_key(group_id), None)], UPGRADE
            return op
        if answer.member_epoch == rules.LEAVE_EPOCH and old is not None:
            return self.remove(group_id, hb.member_id, answer, after=new)
        return self.transition(group_id, new, answer)

    def upgrade_start(self, group_id: str) -> tuple[ConsumerGroup | None, Answer | None]:
        """The consumer group a heartbeat starts from when the group is classic with members
        (None, None: it is not). Refused as Kafka refuses (GROUP_ID_NOT_FOUND with its
        message); a classic group in the middle of a rebalance is asked to wait (its
        members' assignment is not settled), which the client retries."""
        classic = self.store.groups.get(group_id)
        consumer = self.groups.get(group_id)
        if classic is None or classic.is_empty() or (consumer is not None and consumer.members):
            return None, None
        members = [mig.ClassicMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                     m.rebalance_timeout_ms, m.session_timeout_ms, tuple(m.protocols),
                                     m.assignment) for m in classic.members.values()]
        why = mig.upgrade_refusal(self.policy, classic.protocol_type, members, group_id)
        if why is not None:
            return None, Answer(KafkaError.GROUP_ID_NOT_FOUND, "", -1, None, why)
        if classic.state is not GroupState.STABLE or classic.pending_members:
            return None, Answer(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "", -1, None,
                                f"Classic group {group_id} is rebalancing; retry.")
        base = mig.from_classic(group_id, classic.generation, members)
        if consumer is not None:
            base.epoch = base.target_epoch = max(base.epoch, consumer.epoch)
        return base, None

    def classic_join(self, group_id: str, member: mig.ClassicMember, topics: Mapping[str, int],
                     matches: Matcher) -> CgOp:
        """A JoinGroup of a classic member of a group of this protocol (it has members)."""
        new, answer = mig.classic_join(self.groups[group_id], member, topics, matches)
        return self.transition(group_id, new, answer)

    def remove(self, group_id: str, member_id: str, answer: Answer | None = None, *,
               after: ConsumerGroup | None = None) -> CgOp:
        """A member leaves or is fenced (session expiry, an overdue revocation or rejoin):
        its partitions are free and the group epoch moves. When only classic members
        remain and the policy allows it, the group becomes classic in the same batch.
        `after`: the group without it, when the rules computed it already."""
        answer = answer or Answer()
        old = self.groups.get(group_id)
        if old is None or member_id not in old.members:
            return CgOp(group_id, answer)
        new = after or rules.remove_member(old, member_id)
        record = self._downgrade_record(new) if mig.downgrades(new, self.policy) else None
        if record is None:
            return self.transition(group_id, new, answer)
        op = self.transition(group_id, None, answer)
        op.classic, op.conversion = [(group_key(group_id), group_value(record))], DOWNGRADE
        return op

    def session_expired(self, group_id: str, member_id: str) -> CgOp:
        """The member missed its session: removed (nothing when it is gone already)."""
        return self.remove(group_id, member_id)

    def revocation_overdue(self, group_id: str, member_id: str, epoch: int) -> CgOp:
        """The member kept partitions it was told to give up past its rebalance timeout
        (told at `epoch`): fenced, unless it revoked or moved on meanwhile."""
        g = self.groups.get(group_id)
        cur = g.current.get(member_id) if g is not None else None
        if cur is None or cur.state is not rules.MemberState.UNREVOKED_PARTITIONS or cur.epoch != epoch:
            return CgOp(group_id, Answer())
        return self.remove(group_id, member_id)

    def _downgrade_record(self, g: ConsumerGroup) -> GroupRecord | None:
        """The classic group's snapshot: the members as they are, at the generation most of
        them are at (so their heartbeats hear of the rebalance, not of a wrong generation)."""
        members = mig.to_classic(g)
        common = set.intersection(*({n for n, _ in m.protocols} for m in members))
        first = members[0].protocols
        protocol = next((n for n, _ in first if n in common), None)
        if protocol is None:
            return None
        generation = max(g.current[m.member_id].epoch for m in members)
        rec = GroupRecord(PROTOCOL_TYPE, generation, protocol, members[0].member_id, self.store.clock())
        for m in members:
            meta = dict(m.protocols)[protocol]
            rec.members.append(MemberRecord(m.member_id, m.instance_id, m.client_id, m.client_host,
                                            m.rebalance_timeout_ms, m.session_timeout_ms, meta,
                                            m.assignment))
        return rec

    # --- replay: the one way membership changes ------------------------------------------------

    def replay(self, op: CgOp) -> None:
        """`op`'s records into memory, in the order of its batch."""
        if op.conversion == UPGRADE:
            self._replay_classic(op.group_id, op.classic)
        apply_records(self.groups, op.records)
        if op.conversion == DOWNGRADE:
            self._replay_classic(op.group_id, op.classic)

    def _replay_classic(self, group_id: str, classic: Sequence[Record]) -> None:
        for _key, value in classic:
            self.store.apply_group_record(group_id, None if value is None else decode_group_value(value))


def refused(op: CgOp, error: KafkaError) -> Answer:
    """The answer when `op`'s records did not take effect."""
    return Answer(error, op.response.member_id, -1)
