"""What a classic membership operation decides (classic_shard.ClassicShard): the values
of a `ClassicOp` (the group's next state, the snapshots to write, the long polls to
answer, the deadlines) and `Edit`, which gathers them while an operation runs on a copy
of the group. No I/O here."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..protocol.errors import KafkaError
from .group_model import JOIN, SYNC, Group, JoinResult, Member, SyncResult
from .offsets import GroupRecord, MemberRecord

Poll = tuple[str, str, "JoinResult | SyncResult | None"]   # (kind, member id, answer; None: waits here)
LeaveAnswer = tuple[KafkaError, list[KafkaError]]


@dataclass(frozen=True, slots=True)
class Due:
    """What runs when a deadline falls due: the shard's operation named `op` (a key of
    classic_shard.DUE) on the deadline's group, with `args`."""
    op: str
    args: tuple[object, ...] = ()


@dataclass(frozen=True, slots=True)
class Timer:
    """Set deadline `key` `delay_ms` from now to run `due`; `due` None cancels it."""
    key: tuple[str, ...]
    delay_ms: int = 0
    due: Due | None = None


@dataclass(slots=True)
class Write:
    """A group snapshot to make durable. `generation`: the one whose assignment it
    carries (`assignments`), answered to the members once durable; None: a snapshot
    kept for a restart only."""
    snapshot: GroupRecord
    generation: int | None = None
    assignments: dict[str, bytes] = field(default_factory=dict)


@dataclass(eq=False)
class ClassicOp:
    """What one operation on group `group_id` decided (classic_shard's docstring says what
    each part is); an op with nothing but `response` changes nothing."""
    group_id: str
    response: object = None
    group: Group | None = None
    forget: bool = False          # drop the group from memory if it holds nothing any more
    writes: list[Write] = field(default_factory=list)
    polls: list[Poll] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)


def snapshot(group: Group, now_ms: int, assignments: Mapping[str, bytes] | None = None) -> GroupRecord:
    """The group's record: generation, protocol, leader and members with their
    assignment (`assignments` instead of the members' own when given)."""
    rec = GroupRecord(group.protocol_type, group.generation, group.protocol, group.leader, now_ms)
    for m in group.members.values():
        assignment = m.assignment if assignments is None else assignments.get(m.member_id, b"")
        rec.members.append(MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                        m.rebalance_timeout_ms, m.session_timeout_ms,
                                        m.metadata(group.protocol), assignment))
    return rec


def awaiting(kind: str) -> str:
    """The member's flag that says it waits in its poll of `kind`."""
    return "awaiting_join" if kind == JOIN else "awaiting_sync"


class Edit:
    """One operation under way: `group` is a copy of the live group (or a new one) that
    the operation changes, and `op` gathers what it decides."""

    def __init__(self, op: ClassicOp, group: Group) -> None:
        self.op, self.group = op, group

    def finish(self, response: object) -> ClassicOp:
        self.op.response, self.op.group = response, self.group
        return self.op

    def answer(self, kind: str, member: Member, result: JoinResult | SyncResult) -> None:
        """Answer `member`'s poll of `kind` (nothing when it does not wait)."""
        if getattr(member, awaiting(kind)):
            setattr(member, awaiting(kind), False)
            self.op.polls.append((kind, member.member_id, result))

    def answer_both(self, member: Member, error: KafkaError) -> None:
        """Both polls answered `error`: the member is gone, fenced or must look again."""
        self.answer(JOIN, member, JoinResult(error, member.member_id))
        self.answer(SYNC, member, SyncResult(error))

    def wait(self, kind: str, member: Member) -> None:
        """The request waits from here for `member`'s answer of `kind`."""
        setattr(member, awaiting(kind), True)
        self.op.polls.append((kind, member.member_id, None))

    def arm(self, member: Member) -> None:
        """The member's session starts again from now."""
        self.op.timers.append(session_timer(self.group.group_id, member))

    def at(self, key: tuple[str, ...], delay_ms: int, due: Due) -> None:
        self.op.timers.append(Timer(key, delay_ms, due))

    def cancel(self, key: tuple[str, ...]) -> None:
        self.op.timers.append(Timer(key))


def session_timer(group_id: str, member: Member) -> Timer:
    """The member's session deadline, from now."""
    return Timer(("hb", group_id, member.member_id), member.session_timeout_ms,
                 Due("session_expired", (member.member_id,)))
