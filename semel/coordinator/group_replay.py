"""Applying group-coordinator records to memory: the live write path (once a
write is durable) and the start-up replay use the same functions, so memory is
always the replay of the durable prefix of the log."""
from __future__ import annotations

from ..protocol import records as rb
from .group_model import Group, Member
from .group_states import Event, GroupState
from .consumer_records import apply_record
from .offsets import (
    CommittedOffset, ConsumerGroupKey, GroupRecord, OffsetKey, TopicPartition, decode_group_value,
    decode_key, decode_offset_value, scan_log,
)

S = GroupState


class GroupReplay:
    """Mixin of GroupCoordinator: apply functions and the start-up load."""

    def _group_for(self, group_id: str) -> Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id, self.clock())
        return group

    def _apply_offset(self, group_id: str, tp: TopicPartition, value: CommittedOffset | None,
                      log_offset: int) -> None:
        if value is None:
            group = self._groups.get(group_id)
            if group is not None:
                group.offsets.remove(tp, log_offset)
                self._maybe_forget(group)
            return
        self._group_for(group_id).offsets.put(tp, value._replace(log_offset=log_offset))

    def _apply_pending(self, producer_id: int, group_id: str, tp: TopicPartition,
                       value: CommittedOffset, log_offset: int) -> None:
        self._group_for(group_id).offsets.add_pending(producer_id, tp, value._replace(log_offset=log_offset))
        self._producer_groups.setdefault(producer_id, set()).add(group_id)

    def _apply_marker(self, producer_id: int, commit: bool) -> None:
        for group_id in self._producer_groups.pop(producer_id, ()):
            group = self._groups.get(group_id)
            if group is not None:
                group.offsets.complete(producer_id, commit)
                self._maybe_forget(group)

    def _maybe_forget(self, group: Group) -> None:
        """Drop a group that holds nothing anymore (bounded memory)."""
        if (group.state is S.EMPTY and group.is_empty() and group.offsets.is_empty()
                and not group.persisted and self._current(group)):
            group.to(Event.UNLOAD, self.clock())
            del self._groups[group.group_id]

    def _apply_group_record(self, group_id: str, rec: GroupRecord | None) -> None:
        """Replay of a group snapshot: the group is as the record says."""
        group = self._groups.get(group_id)
        if rec is None:
            if group is not None:
                group.members.clear()
                group.static.clear()
                group.generation, group.protocol, group.leader = 0, None, None
                group.protocol_type, group.persisted = None, False
                group.state = S.EMPTY
                self._maybe_forget(group)
            return
        group = self._group_for(group_id)
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

    def _load(self) -> None:
        self._clog.records_since_compaction = 0
        for buf, pos, hdr in scan_log(self._log):
            self._clog.records_since_compaction += hdr.record_count
            if hdr.is_control:
                self._apply_marker(hdr.producer_id, rb.control_type(buf, pos) == rb.CONTROL_COMMIT)
                continue
            for rec in rb.iter_records(buf, pos):
                key = decode_key(rec.key)
                if isinstance(key, OffsetKey):
                    tp = (key.topic, key.partition)
                    value = None if rec.value is None else decode_offset_value(rec.value, rec.offset)
                    if hdr.is_transactional:
                        if value is not None:
                            self._apply_pending(hdr.producer_id, key.group, tp, value, rec.offset)
                    else:
                        self._apply_offset(key.group, tp, value, rec.offset)
                elif isinstance(key, ConsumerGroupKey):
                    if not hdr.is_transactional:
                        apply_record(self._consumer_groups, key, rec.value)
                elif not hdr.is_transactional:
                    value = None if rec.value is None else decode_group_value(rec.value)
                    self._apply_group_record(key.group, value)
        # Restored members get a full session to find us again.
        for group in self._groups.values():
            for m in group.members.values():
                self._arm_heartbeat(group, m)
        self._arm_consumer_sessions()
