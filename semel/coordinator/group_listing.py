"""The classic groups as the admin APIs see them: DescribeGroups, ListGroups, DeleteGroups.

A GroupListing belongs to one GroupCoordinator (semel.coordinator.group): it reads the
coordinator's groups in memory and writes DeleteGroups' tombstones through the
coordinator's write queue, both taken from its GroupContext; the consumer-protocol
groups (`consumers`) are listed beside the classic ones and deleted with them."""
from __future__ import annotations

import asyncio
from typing import Iterable

from ..protocol.errors import KafkaError
from ..storage.types import AppendInfo
from .consumer_group import ConsumerGroups
from .consumer_records import Record, apply_records, records_between
from .coordinator_log import done_future
from .group_context import GroupContext
from .group_model import Group, GroupSummary, MemberSummary
from .group_states import STATE_BY_NAME, GroupState
from .offsets import TopicPartition, group_key, offset_key

S = GroupState


class GroupListing:
    """Made with the coordinator's GroupContext and its consumer-protocol groups."""

    def __init__(self, ctx: GroupContext, consumers: ConsumerGroups) -> None:
        self._store, self._log, self._ready = ctx.store, ctx.log, ctx.ready
        self._consumers = consumers

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupSummary]:
        err = self._ready()
        out = []
        for gid in group_ids:
            group = self._store.groups.get(gid)
            if err:
                out.append(GroupSummary(gid, err, "", "", ""))
            elif self._consumers.group_type(gid) == "consumer":
                # As Kafka: DescribeGroups describes classic groups; ConsumerGroupDescribe these.
                out.append(GroupSummary(gid, KafkaError.GROUP_ID_NOT_FOUND, S.DEAD.value, "", ""))
            elif group is None:
                out.append(GroupSummary(gid, KafkaError.NONE, S.DEAD.value, "", ""))
            else:
                out.append(self._summary(group))
        return out

    def _summary(self, group: Group) -> GroupSummary:
        stable = group.state is S.STABLE
        members = [MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                 m.metadata(group.protocol) if stable else b"",
                                 m.assignment if stable else b"")
                   for m in group.members.values()]
        return GroupSummary(group.group_id, KafkaError.NONE, group.state.value,
                            group.protocol_type or "", (group.protocol or "") if stable else "", members)

    def list_groups(self, states: Iterable[str] | None = None
                    ) -> tuple[KafkaError, list[tuple[str, str, str]]]:
        """(error, [(group_id, protocol_type, state name)]), filtered by state names
        (case-insensitive) when `states` is non-empty."""
        err = self._ready()
        if err == KafkaError.NOT_COORDINATOR:
            return KafkaError.NONE, []   # a broker coordinating no group lists none, as in Kafka
        if err:
            return err, []
        wanted = {STATE_BY_NAME.get(s.lower()) for s in states or ()}
        consumer = self._consumers.consumer_group_rows()
        names = {s.lower() for s in states or ()}
        return KafkaError.NONE, [
            (g.group_id, g.protocol_type or "", g.state.value)
            for g in self._store.groups.values()
            if (not wanted or g.state in wanted) and self._consumers.group_type(g.group_id) == "classic"
        ] + [row for row in consumer if not names or row[2].lower() in names]

    def delete_groups(self, group_ids: Iterable[str]) -> "asyncio.Future[dict[str, KafkaError]]":
        """Delete empty groups: tombstones for the group and all its offsets."""
        err = self._ready()
        results: dict[str, KafkaError] = {}
        doomed: list[str] = []
        for gid in group_ids:
            group = self._store.groups.get(gid)
            consumer = self._store.consumer_groups.get(gid)
            if err:
                results[gid] = err
            elif not gid:
                results[gid] = KafkaError.INVALID_GROUP_ID
            elif consumer is not None and consumer.members:
                results[gid] = KafkaError.NON_EMPTY_GROUP
            elif (group is None or group.state is S.DEAD) and consumer is None:
                results[gid] = KafkaError.GROUP_ID_NOT_FOUND
            elif group is not None and (group.state is not S.EMPTY or not group.is_empty()):
                results[gid] = KafkaError.NON_EMPTY_GROUP
            elif gid not in doomed:
                doomed.append(gid)
        if not doomed:
            return done_future(results)
        pairs: list[tuple[bytes, bytes | None]] = []
        plan: list[tuple[str, Group | None, list[TopicPartition], list[Record]]] = []
        for gid in doomed:
            group = self._store.groups.get(gid)
            tps = list(group.offsets.committed) if group is not None else []
            pairs += [(offset_key(gid, t, p), None) for t, p in tps]
            if group is not None:
                pairs.append((group_key(gid), None))
            # An empty group of the consumer protocol goes too: its records are tombstoned.
            tombstones = records_between(self._store.consumer_groups.get(gid), None)
            pairs += tombstones
            plan.append((gid, group, tps, tombstones))

        def apply(info: AppendInfo) -> dict[str, KafkaError]:
            at = info.first_offset
            for gid, group, tps, consumer in plan:
                for tp in tps:
                    self._store.apply_offset(gid, tp, None, at)
                    at += 1
                if group is not None:
                    if group.is_empty() and group.state is S.EMPTY:
                        group.persisted = False
                        self._store.apply_group_record(gid, None)
                    at += 1
                apply_records(self._store.consumer_groups, consumer)
                results[gid] = KafkaError.NONE
            return results

        def fail(error: KafkaError) -> dict[str, KafkaError]:
            results.update({gid: error for gid in doomed})
            return results

        return self._log.write(lambda: self._log.append_records(pairs), apply, fail)
