"""Applying group-coordinator records to memory: the live write path (once a
write is durable) and the start-up replay use the same functions, so memory is
always the replay of the durable prefix of the log. A GroupStore holds the groups in
memory that those functions change; the group coordinator and its parts share one.
It is the group coordinator's shard for the runtime's load (coordinator.runtime):
`clear` and `replay` of one batch."""
from __future__ import annotations

from typing import Callable

from ..protocol import records as rb
from ..protocol.records import BatchHeader
from .consumer_group_rules import ConsumerGroup
from .group_model import Group, Member
from .group_states import Event, GroupState
from .consumer_records import apply_record
from .offsets import (
    CommittedOffset, ConsumerGroupKey, GroupRecord, OffsetKey, TopicPartition, decode_group_value,
    decode_key, decode_offset_value,
)

S = GroupState


class GroupStore:
    """The groups of one group coordinator in memory, and the apply functions that are
    the only way they change: classic groups with their committed offsets (`groups`),
    consumer-protocol groups (`consumer_groups`), and which groups hold pending
    transactional offsets of each producer (`producer_groups`)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.producer_groups: dict[int, set[str]] = {}   # producer id -> groups with pending offsets
        self.consumer_groups: dict[str, ConsumerGroup] = {}

    def current(self, group: Group) -> bool:
        """`group` is still the one held under its id (not dropped or replaced)."""
        return self.groups.get(group.group_id) is group

    def clear(self) -> None:
        self.groups.clear()
        self.consumer_groups.clear()
        self.producer_groups.clear()

    def group_for(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id, self.clock())
        return group

    def apply_offset(self, group_id: str, tp: TopicPartition, value: CommittedOffset | None,
                     log_offset: int) -> None:
        if value is None:
            group = self.groups.get(group_id)
            if group is not None:
                group.offsets.remove(tp, log_offset)
                self.maybe_forget(group)
            return
        self.group_for(group_id).offsets.put(tp, value._replace(log_offset=log_offset))

    def apply_pending(self, producer_id: int, group_id: str, tp: TopicPartition,
                      value: CommittedOffset, log_offset: int) -> None:
        self.group_for(group_id).offsets.add_pending(producer_id, tp, value._replace(log_offset=log_offset))
        self.producer_groups.setdefault(producer_id, set()).add(group_id)

    def apply_marker(self, producer_id: int, commit: bool) -> None:
        for group_id in self.producer_groups.pop(producer_id, ()):
            group = self.groups.get(group_id)
            if group is not None:
                group.offsets.complete(producer_id, commit)
                self.maybe_forget(group)

    def maybe_forget(self, group: Group) -> None:
        """Drop a group that holds nothing anymore (bounded memory)."""
        if (group.state is S.EMPTY and group.is_empty() and group.offsets.is_empty()
                and not group.persisted and self.current(group)):
            group.to(Event.UNLOAD, self.clock())
            del self.groups[group.group_id]

    def apply_group_record(self, group_id: str, rec: GroupRecord | None) -> None:
        """Replay of a group snapshot: the group is as the record says."""
        group = self.groups.get(group_id)
        if rec is None:
            if group is not None:
                group.members.clear()
                group.static.clear()
                group.generation, group.protocol, group.leader = 0, None, None
                group.protocol_type, group.persisted = None, False
                group.state = S.EMPTY
                self.maybe_forget(group)
            return
        group = self.group_for(group_id)
        group.generation, group.protocol_type = rec.generation, rec.protocol_type
        group.protocol, group.leader, group.state_ts = rec.protocol, rec.leader, rec.state_ts
        group.persisted = True
        group.members.clear()
        group.static.clear()
        for mr in rec.members:
            protocols = [(rec.protocol, mr.subscription)] if rec.protocol is not None else []
            m = Member(mr.member_id, mr.group_instance_id, mr.client_id, mr.client_host,
                       mr.rebalance_timeout_ms, mr.session_timeout_ms, rec.protocol_type or "", protocols)
            m.assignment = mr.assignment
            group.members[m.member_id] = m
            if m.group_instance_id is not None:
                group.static[m.group_instance_id] = m.member_id
        # Loading is not a transition: the snapshot is Stable when it has members.
        group.state = S.STABLE if group.members else S.EMPTY

    def replay(self, buf: bytes | memoryview, pos: int, hdr: BatchHeader) -> None:
        """Apply one batch of the log (the runtime's load hands every batch here)."""
        if hdr.is_control:
            self.apply_marker(hdr.producer_id, rb.control_type(buf, pos) == rb.CONTROL_COMMIT)
            return
        for rec in rb.iter_records(buf, pos):
            key = decode_key(rec.key)
            if isinstance(key, OffsetKey):
                tp = (key.topic, key.partition)
                value = None if rec.value is None else decode_offset_value(rec.value, rec.offset)
                if hdr.is_transactional:
                    if value is not None:
                        self.apply_pending(hdr.producer_id, key.group, tp, value, rec.offset)
                else:
                    self.apply_offset(key.group, tp, value, rec.offset)
            elif isinstance(key, ConsumerGroupKey):
                if not hdr.is_transactional:
                    apply_record(self.consumer_groups, key, rec.value)
            elif not hdr.is_transactional:
                group = None if rec.value is None else decode_group_value(rec.value)
                self.apply_group_record(key.group, group)
