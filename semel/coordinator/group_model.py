"""The group model: configuration, members, groups, and the values the
coordinator answers with. No I/O and no awaiting here."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol.errors import KafkaError
from .group_states import Event, GroupState, transition
from .offsets import GroupOffsets

S = GroupState

OFFSETS_TOPIC = "__consumer_offsets"
# A brand-new member waiting in a join phase is kept at most this long (Kafka's value).
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000
# The two long polls of a classic member: JoinGroup and SyncGroup.
JOIN, SYNC = "join", "sync"
# Records per batch when expiring or deleting many offsets at once.
MAX_RECORDS_PER_BATCH = 2000



@dataclass
class GroupConfig:
    initial_rebalance_delay_ms: int = 300
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_interval_ms: int = 600_000
    max_metadata_bytes: int = 4096
    offsets_topic: str = OFFSETS_TOPIC
    # Wait for fsync before answering a write. Offsets are small and rare next to
    # data, so this stays on even when data logs flush on an interval.
    sync_writes: bool = True
    # Compaction by rewrite (see _maybe_compact): checked this often, once this many
    # records piled up (or 4x the live ones); segments this small so old ones can go.
    compact_check_interval_ms: int = 5_000
    compact_records: int = 50_000
    segment_bytes: int = 8 * 1024 * 1024
    # The consumer protocol (KIP-848): the broker sets the heartbeat interval and the
    # session timeout (group.consumer.heartbeat.interval.ms / .session.timeout.ms).
    consumer_heartbeat_interval_ms: int = 5_000
    consumer_session_timeout_ms: int = 45_000
    # group.consumer.migration.policy: bidirectional, upgrade, downgrade or disabled.
    consumer_migration_policy: str = "bidirectional"


class Member:
    __slots__ = ("member_id", "group_instance_id", "client_id", "client_host",
                 "rebalance_timeout_ms", "session_timeout_ms", "protocol_type", "protocols",
                 "assignment", "awaiting_join", "awaiting_sync", "is_new", "joined_at")

    def __init__(self, member_id: str, group_instance_id: str | None, client_id: str,
                 client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
                 protocol_type: str, protocols: list[tuple[str, bytes]]):
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols            # (name, metadata) in the member's preference order
        self.assignment = b""
        # It waits in JoinGroup / SyncGroup for its answer (group_waiters holds the
        # futures); a waiting member cannot heartbeat, and the join barrier counts it.
        self.awaiting_join = False
        self.awaiting_sync = False
        self.is_new = False
        self.joined_at = 0

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def copy(self) -> "Member":
        m = Member(self.member_id, self.group_instance_id, self.client_id, self.client_host,
                   self.rebalance_timeout_ms, self.session_timeout_ms, self.protocol_type, list(self.protocols))
        m.assignment, m.awaiting_join, m.awaiting_sync = self.assignment, self.awaiting_join, self.awaiting_sync
        m.is_new, m.joined_at = self.is_new, self.joined_at
        return m


class Group:
    # What a classic membership operation may change (classic_shard): everything but
    # the id and the committed offsets, which are the offsets shard's.
    MEMBERSHIP = ("state", "state_ts", "generation", "protocol_type", "protocol", "leader", "members",
                  "pending_members", "static", "pending_sync", "new_member_added", "initial_delay",
                  "storing_generation", "persisted")

    def __init__(self, group_id: str, now_ms: int):
        self.group_id = group_id
        self.state = S.EMPTY
        self.state_ts = now_ms
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.pending_members: set[str] = set()   # got MEMBER_ID_REQUIRED, not joined yet
        self.static: dict[str, str] = {}         # group_instance_id -> member_id
        self.pending_sync: set[str] = set()      # joined this generation, not synced yet
        self.new_member_added = False
        self.initial_delay = False               # join phase held open by the initial delay
        self.storing_generation = -1             # generation whose assignment is being written
        self.persisted = False                   # a group record of it exists in the log
        self.offsets = GroupOffsets()

    def membership_copy(self) -> "Group":
        """A copy to decide on: its own members and sets, the same offsets."""
        c = Group.__new__(Group)
        c.__dict__.update(self.__dict__)
        c.members = {mid: m.copy() for mid, m in self.members.items()}
        c.pending_members, c.static, c.pending_sync = set(self.pending_members), dict(self.static), set(self.pending_sync)
        return c

    def take_membership(self, other: "Group") -> None:
        """Become `other` in membership (its offsets are not taken)."""
        for name in Group.MEMBERSHIP:
            setattr(self, name, getattr(other, name))

    def to(self, event: Event, now_ms: int) -> None:
        self.state = transition(self.state, event)
        self.state_ts = now_ms

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.leader is None:
            self.leader = member.member_id
        if member.group_instance_id is not None:
            self.static[member.group_instance_id] = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self.pending_sync.discard(member_id)
        if member.group_instance_id is not None and self.static.get(member.group_instance_id) == member_id:
            del self.static[member.group_instance_id]
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        return member

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def static_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        if group_instance_id is None:
            return False
        known = self.static.get(group_instance_id)
        return known is not None and known != member_id

    def member_error(self, generation: int, member_id: str, group_instance_id: str | None, *,
                     named_only: bool = False) -> KafkaError:
        """The one check of a classic group's member and generation, for Heartbeat,
        SyncGroup, OffsetCommit and TxnOffsetCommit: a dead group has no coordinator
        (COORDINATOR_NOT_AVAILABLE), a static instance now held by another member id is
        fenced (FENCED_INSTANCE_ID), then the member must be in the group
        (UNKNOWN_MEMBER_ID) at its generation (ILLEGAL_GENERATION). `named_only`
        (TxnOffsetCommit, KIP-447): an empty member id or a negative generation is one
        the request leaves out, and goes unchecked."""
        if self.state is S.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if self.static_fenced(group_instance_id, member_id):
            return KafkaError.FENCED_INSTANCE_ID
        if (member_id or not named_only) and member_id not in self.members:
            return KafkaError.UNKNOWN_MEMBER_ID
        if (generation >= 0 or not named_only) and generation != self.generation:
            return KafkaError.ILLEGAL_GENERATION
        return KafkaError.NONE

    def supports(self, protocol_type: str, names: list[str], member_id: str) -> bool:
        """Can a member with these protocols be in the group? Every other member
        must share at least one protocol with it, and the protocol type must match."""
        if not protocol_type or not names:
            return False
        others = [m for mid, m in self.members.items() if mid != member_id]
        if not others:
            return True
        if protocol_type != self.protocol_type:
            return False
        common = set(names)
        for m in others:
            common &= set(m.protocol_names())
        return bool(common)

    def select_protocol(self) -> str | None:
        """The protocol every member supports that most members prefer."""
        members = list(self.members.values())
        if not members:
            return None
        common = set(members[0].protocol_names())
        for m in members[1:]:
            common &= set(m.protocol_names())
        votes: dict[str, int] = {}
        for m in members:
            first = next((n for n in m.protocol_names() if n in common), None)
            if first is not None:
                votes[first] = votes.get(first, 0) + 1
        if not votes:
            return None
        order = self.members[self.leader].protocol_names() if self.leader in self.members else []
        return max(votes, key=lambda n: (votes[n], -order.index(n) if n in order else -len(order)))

    def max_rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def is_empty(self) -> bool:
        return not self.members and not self.pending_members


@dataclass(slots=True)
class JoinResult:
    error: KafkaError
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class SyncResult:
    error: KafkaError
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupSummary:
    group_id: str
    error: KafkaError
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberSummary] = field(default_factory=list)


@dataclass(slots=True)
class FetchedOffset:
    topic: str
    partition: int
    offset: int            # -1 when nothing is committed (or the partition is unstable)
    leader_epoch: int
    metadata: str | None
    error: KafkaError


@dataclass(slots=True)
class JoinRequest:
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
