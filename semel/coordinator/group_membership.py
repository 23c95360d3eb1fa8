"""Group membership and rebalancing: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
the join/sync barrier and its timeouts (DescribeGroups, ListGroups and DeleteGroups:
semel.coordinator.group_listing).
Membership is soft state, as in Kafka; the group snapshot is written through
the durable write queue."""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Callable, Mapping

from ..protocol.errors import KafkaError
from ..storage.types import AppendInfo
from .consumer_group import ConsumerGroups
from .consumer_group_rules import Answer
from .group_model import (
    NEW_MEMBER_JOIN_TIMEOUT_MS, Group, JoinResult, Member, SyncResult, JoinRequest,
)
from .group_states import HEARTBEAT_RESULT, SYNC_RESULT, Event, GroupState
from .coordinator_log import done_future
from .group_context import GroupContext
from .offsets import (
    GroupRecord, MemberRecord, group_key, group_value,
)

log = logging.getLogger("semel.coordinator.group")

S = GroupState


class GroupMembership:
    """GroupCoordinator's classic membership and rebalancing.

    Made with the coordinator's GroupContext and the consumer-protocol groups
    (`consumers`: a group id is of one protocol at a time)."""

    def __init__(self, ctx: GroupContext, consumers: ConsumerGroups) -> None:
        self._store, self._log, self._ready = ctx.store, ctx.log, ctx.ready
        self.timers, self.config, self.clock = ctx.timers, ctx.config, ctx.clock
        self._waiters = ctx.waiters
        self._consumers = consumers
        consumers.classic.on_downgraded = self._downgraded

    def _downgraded(self, group: Group) -> None:
        """A consumer group became this classic group (its last consumer-protocol member
        left): its members heartbeat here now and rejoin, so it rebalances."""
        for m in group.members.values():
            self.arm_heartbeat(group, m)
        self._prepare_rebalance(group)

    def join_group(self, group_id: str, member_id: str, *, protocol_type: str,
                   protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                   rebalance_timeout_ms: int = -1, group_instance_id: str | None = None,
                   client_id: str = "", client_host: str = "",
                   require_known_member_id: bool = True,
                   topics: "Callable[[], Mapping[str, int]] | None" = None) -> "asyncio.Future[JoinResult]":
        """`topics` gives each topic's partition count, for a consumer group's classic members."""
        err = self._ready()
        if not err and not group_id:
            err = KafkaError.INVALID_GROUP_ID
        if not err and not (self.config.min_session_timeout_ms <= session_timeout_ms
                            <= self.config.max_session_timeout_ms):
            err = KafkaError.INVALID_SESSION_TIMEOUT
        if err:
            return done_future(JoinResult(err, member_id))
        consumer = self._store.consumer_groups.get(group_id)
        if consumer is not None and consumer.members:
            # A consumer group answers its classic members (consumer_group_classic).
            return self._consumers.classic.join(
                group_id, member_id, protocol_type=protocol_type, protocols=protocols,
                session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
                group_instance_id=group_instance_id, client_id=client_id, client_host=client_host,
                require_known_member_id=require_known_member_id, topics=topics)
        if consumer is not None:
            # Its last member of the consumer protocol left: the group becomes a classic
            # one, and the consumer protocol's records of it go (its offsets stay).
            self._consumers.run(self._consumers.shard.transition(group_id, None, Answer()))
        if rebalance_timeout_ms is None or rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms   # JoinGroup v0 has no rebalance timeout
        protocols = [(name, bytes(meta or b"")) for name, meta in protocols]
        group = self._store.groups.get(group_id)
        if group is None:
            if member_id:
                return done_future(JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id))
            group = Group(group_id, self.clock())
        if group.state is S.DEAD:
            return done_future(JoinResult(KafkaError.COORDINATOR_NOT_AVAILABLE, member_id))
        if not group.supports(protocol_type, [n for n, _ in protocols], member_id):
            return done_future(JoinResult(KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id))
        self._store.groups.setdefault(group_id, group)
        req = JoinRequest(group_instance_id, client_id, client_host, session_timeout_ms,
                           rebalance_timeout_ms, protocol_type, protocols)
        if not member_id:
            fut = self._join_new(group, req, require_known_member_id)
        else:
            fut = self._join_known(group, member_id, req)
        if group.state is S.PREPARING_REBALANCE:
            self._try_complete_join(group)
        return fut

    def _join_new(self, group: Group, req: "JoinRequest", require_known: bool) -> asyncio.Future[JoinResult]:
        prefix = req.group_instance_id or req.client_id or "member"
        new_id = f"{prefix}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            return self._join_static(group, new_id, req, req.group_instance_id)
        if require_known:
            # KIP-394: hand out the id first, so a client that times out and retries
            # does not leave a ghost member behind.
            group.pending_members.add(new_id)
            self._at(("hb", group.group_id, new_id), req.session_timeout_ms,
                     lambda g: self._expire_pending(g, new_id))
            return done_future(JoinResult(KafkaError.MEMBER_ID_REQUIRED, new_id))
        return self._add_member_and_rebalance(group, new_id, req)

    def _join_known(self, group: Group, member_id: str, req: "JoinRequest") -> asyncio.Future[JoinResult]:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            return self._add_member_and_rebalance(group, member_id, req)
        member = group.members.get(member_id)
        if member is None:
            return done_future(JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id))
        if group.static_fenced(req.group_instance_id, member_id):
            return done_future(JoinResult(KafkaError.FENCED_INSTANCE_ID, member_id))
        state = group.state
        if state is S.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(group, member, req)
        if state is S.COMPLETING_REBALANCE and member.matches(req.protocols):
            # A retried join of this generation: answer again, nothing changed.
            return done_future(self._join_result(group, member))
        if state is S.STABLE and member.member_id != group.leader and member.matches(req.protocols):
            return done_future(self._join_result(group, member))
        if state in (S.COMPLETING_REBALANCE, S.STABLE):
            return self._update_member_and_rebalance(group, member, req)
        return done_future(JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id))

    def _join_static(self, group: Group, new_id: str, req: "JoinRequest",
                     instance_id: str) -> asyncio.Future[JoinResult]:
        """A static member (group_instance_id) joining without a member id: a new
        instance replaces the old one, fencing it, without a rebalance when nothing
        changed (basic KIP-345)."""
        old_id = group.static.get(instance_id)
        old = group.members.get(old_id) if old_id is not None else None
        if old_id is None or old is None:
            return self._add_member_and_rebalance(group, new_id, req)
        self._waiters.answer(group.group_id, old, KafkaError.FENCED_INSTANCE_ID)
        was_leader = group.leader == old_id
        was_pending_sync = old_id in group.pending_sync
        group.remove(old_id)
        self.timers.cancel(("hb", group.group_id, old_id))
        replacement = self._new_member(new_id, req)
        replacement.assignment = old.assignment
        group.add(replacement)
        if was_leader:
            group.leader = new_id
        if was_pending_sync:
            group.pending_sync.add(new_id)
        if group.state is S.STABLE and not was_leader and old.matches(req.protocols):
            self.arm_heartbeat(group, replacement)
            self._store_group_snapshot(group)   # so a restart knows the new id
            return done_future(self._join_result(group, replacement))
        return self._update_member_and_rebalance(group, replacement, req)

    def _new_member(self, member_id: str, req: "JoinRequest") -> Member:
        m = Member(member_id, req.group_instance_id, req.client_id, req.client_host,
                   req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type, req.protocols)
        m.joined_at = self.timers.now()
        return m

    def _add_member_and_rebalance(self, group: Group, member_id: str,
                                  req: "JoinRequest") -> asyncio.Future[JoinResult]:
        member = self._new_member(member_id, req)
        member.is_new = True
        if group.state is S.PREPARING_REBALANCE and group.generation == 0:
            group.new_member_added = True   # extends the initial rebalance delay
        group.add(member)
        # The join may complete (a lone member) before _maybe_prepare_rebalance returns.
        fut = self._waiters.wait_join(group.group_id, member)
        self.arm_heartbeat(group, member)
        self._maybe_prepare_rebalance(group)
        return fut

    def _update_member_and_rebalance(self, group: Group, member: Member,
                                     req: "JoinRequest") -> asyncio.Future[JoinResult]:
        member.protocols = req.protocols
        member.protocol_type = req.protocol_type
        if len(group.members) == 1:
            group.protocol_type = req.protocol_type   # a lone member may switch protocol type
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        # A second join while the first still waits: the first is superseded.
        self._waiters.answer_join(group.group_id, member,
                                  JoinResult(KafkaError.REBALANCE_IN_PROGRESS, member.member_id))
        fut = self._waiters.wait_join(group.group_id, member)
        self.arm_heartbeat(group, member)
        self._maybe_prepare_rebalance(group)   # may complete the join at once (a lone member)
        return fut

    def _join_result(self, group: Group, member: Member) -> JoinResult:
        is_leader = member.member_id == group.leader
        members = ([(m.member_id, m.group_instance_id, m.metadata(group.protocol))
                    for m in group.members.values()] if is_leader else [])
        return JoinResult(KafkaError.NONE, member.member_id, group.generation, group.protocol_type,
                          group.protocol, group.leader or "", members)

    # --- rebalance mechanics -------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group) -> None:
        if group.state in (S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group)

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state is S.COMPLETING_REBALANCE:
            self._reset_assignment(group, KafkaError.REBALANCE_IN_PROGRESS)
        self.timers.cancel(("sync", group.group_id))
        group.pending_sync.clear()
        was_empty = group.state is S.EMPTY
        group.to(Event.REBALANCE, self.clock())
        key = ("join", group.group_id)
        if was_empty:
            # Wait a little for more members, so a starting group does not rebalance
            # once per arriving member (Kafka's group.initial.rebalance.delay.ms).
            total = group.max_rebalance_timeout()
            delay = min(self.config.initial_rebalance_delay_ms, total)
            group.initial_delay = True
            self._at(key, delay, lambda g: self._initial_delay_over(g, total - delay))
        else:
            group.initial_delay = False
            self._at(key, group.max_rebalance_timeout(), self._complete_join)
            self._try_complete_join(group)

    def _initial_delay_over(self, group: Group, remaining_ms: int) -> None:
        if group.state is not S.PREPARING_REBALANCE:
            return
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, remaining_ms)
            self._at(("join", group.group_id), delay, lambda g: self._initial_delay_over(g, remaining_ms - delay))
            return
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if group.state is S.PREPARING_REBALANCE and not group.initial_delay and group.all_joined():
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """End of the join phase: drop members that did not rejoin, start the next
        generation and answer every waiting JoinGroup."""
        if group.state is not S.PREPARING_REBALANCE or not self._store.current(group):
            return
        group.initial_delay = group.new_member_added = False
        self.timers.cancel(("join", group.group_id))
        for m in [m for m in group.members.values() if not m.awaiting_join]:
            self._drop_member(group, m)
        now = self.clock()
        group.generation += 1
        if not group.members:
            group.protocol = None
            group.to(Event.EMPTIED, now)
            self._store_group_snapshot(group)
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.to(Event.JOINED, now)
        group.pending_sync = set(group.members)
        for m in group.members.values():
            m.is_new = False
            self._waiters.answer_join(group.group_id, m, self._join_result(group, m))
            self.arm_heartbeat(group, m)
        generation = group.generation
        self._at(("sync", group.group_id), group.max_rebalance_timeout(),
                 lambda g: self._sync_overdue(g, generation))

    def _reset_assignment(self, group: Group, error: KafkaError) -> None:
        for m in group.members.values():
            m.assignment = b""
            self._waiters.answer_sync(group.group_id, m, SyncResult(error))
        group.storing_generation = -1

    def _sync_overdue(self, group: Group, generation: int) -> None:
        """Members that got their JoinGroup answer but never sent SyncGroup within
        the rebalance timeout are removed, so the others are not stuck."""
        if group.generation != generation or not group.pending_sync:
            return
        if group.state not in (S.COMPLETING_REBALANCE, S.STABLE):
            return
        for member_id in list(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member_and_update_group(group, member)

    def _at(self, key: tuple[str, ...], delay_ms: int, fire: Callable[[Group], None]) -> None:
        """Set deadline `key` (its second part the group id); `fire` runs on the group
        held under that id when it falls due (nothing when there is none). A deadline
        names its group and keeps no reference to it."""
        group_id = key[1]

        def due() -> None:
            group = self._store.groups.get(group_id)
            if group is not None:
                fire(group)
        self.timers.set(key, delay_ms, due)

    # --- heartbeats and removal ------------------------------------------------------------------

    def arm_heartbeat(self, group: Group, member: Member) -> None:
        member_id = member.member_id
        self._at(("hb", group.group_id, member_id), member.session_timeout_ms,
                 lambda g: self._session_expired(g, member_id))

    def _session_expired(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None:
            return
        waiting = member.awaiting_join or member.awaiting_sync
        too_long_new = member.is_new and self.timers.now() - member.joined_at >= NEW_MEMBER_JOIN_TIMEOUT_MS
        if waiting and not too_long_new:
            # A member blocked in JoinGroup/SyncGroup cannot heartbeat; the join or
            # sync deadline decides its fate instead.
            self.arm_heartbeat(group, member)
            return
        log.info("member %s of group %s expired", member_id, group.group_id)
        self._remove_member_and_update_group(group, member)

    def _expire_pending(self, group: Group, member_id: str) -> None:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._try_complete_join(group)
            self._store.maybe_forget(group)

    def _drop_member(self, group: Group, member: Member) -> None:
        self._waiters.answer(group.group_id, member, KafkaError.UNKNOWN_MEMBER_ID)
        group.remove(member.member_id)
        self.timers.cancel(("hb", group.group_id, member.member_id))

    def _remove_member_and_update_group(self, group: Group, member: Member) -> None:
        self._drop_member(group, member)
        if group.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group)
        elif group.state is S.PREPARING_REBALANCE:
            self._try_complete_join(group)

    # --- Heartbeat, SyncGroup, LeaveGroup --------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  group_instance_id: str | None = None) -> KafkaError:
        err = self._ready()
        if err:
            return err
        if not group_id:
            return KafkaError.INVALID_GROUP_ID
        if self._consumers.classic.hosts(group_id):
            return self._consumers.classic.heartbeat(group_id, generation, member_id)
        group = self._store.groups.get(group_id)
        if group is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        err = group.member_error(generation, member_id, group_instance_id)
        if err:
            return err
        member = group.members[member_id]
        result = HEARTBEAT_RESULT[group.state]
        if result in (KafkaError.NONE, KafkaError.REBALANCE_IN_PROGRESS):
            self.arm_heartbeat(group, member)
        return result

    def sync_group(self, group_id: str, generation: int, member_id: str, *,
                   group_instance_id: str | None = None, protocol_type: str | None = None,
                   protocol_name: str | None = None,
                   assignments: dict[str, bytes] | None = None) -> "asyncio.Future[SyncResult]":
        err = self._ready()
        if not err and not group_id:
            err = KafkaError.INVALID_GROUP_ID
        if not err and self._consumers.classic.hosts(group_id):
            return self._consumers.classic.sync(group_id, generation, member_id)
        group = self._store.groups.get(group_id) if not err else None
        if not err:
            err = self._check_sync(group, generation, member_id, group_instance_id,
                                   protocol_type, protocol_name)
        if err or group is None:   # (_check_sync refuses a missing group)
            return done_future(SyncResult(err))
        member = group.members[member_id]
        fixed = SYNC_RESULT[group.state]
        if fixed is not None:
            return done_future(SyncResult(fixed))
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self.timers.cancel(("sync", group.group_id))
        self.arm_heartbeat(group, member)
        if group.state is S.STABLE:
            return done_future(SyncResult(KafkaError.NONE, member.assignment, group.protocol_type, group.protocol))
        # CompletingRebalance: wait for the leader's assignment to be stored.
        self._waiters.answer_sync(group.group_id, member, SyncResult(KafkaError.REBALANCE_IN_PROGRESS))
        fut = self._waiters.wait_sync(group.group_id, member)
        if member_id == group.leader and group.storing_generation != group.generation:
            self._store_assignment(group, assignments or {})
        return fut

    def _check_sync(self, group: Group | None, generation: int, member_id: str,
                    group_instance_id: str | None, protocol_type: str | None,
                    protocol_name: str | None) -> KafkaError:
        if group is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        err = group.member_error(generation, member_id, group_instance_id)
        if err:
            return err
        if protocol_type is not None and protocol_type != group.protocol_type:
            return KafkaError.INCONSISTENT_GROUP_PROTOCOL
        if protocol_name is not None and protocol_name != group.protocol:
            return KafkaError.INCONSISTENT_GROUP_PROTOCOL
        return KafkaError.NONE

    def group_record(self, group: Group, assignments: dict[str, bytes] | None = None) -> GroupRecord:
        rec = GroupRecord(group.protocol_type, group.generation, group.protocol, group.leader,
                          self.clock())
        for m in group.members.values():
            assignment = m.assignment if assignments is None else assignments.get(m.member_id, b"")
            rec.members.append(MemberRecord(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                            m.rebalance_timeout_ms, m.session_timeout_ms,
                                            m.metadata(group.protocol), assignment))
        return rec

    def _store_assignment(self, group: Group, assignments: dict[str, bytes]) -> None:
        """The leader's assignment becomes visible to members only once durable."""
        generation = group.generation
        full = {mid: bytes(assignments.get(mid) or b"") for mid in group.members}
        snapshot = self.group_record(group, full)
        group.storing_generation = generation

        def still_waiting() -> bool:
            return (self._store.current(group) and group.state is S.COMPLETING_REBALANCE
                    and group.generation == generation)

        def apply(info: AppendInfo) -> None:
            group.persisted = True
            if not still_waiting():
                return   # the group moved on meanwhile; its members were answered then
            for mid, m in group.members.items():
                m.assignment = full.get(mid, b"")
            group.to(Event.ASSIGNED, self.clock())
            for m in group.members.values():
                self._waiters.answer_sync(group.group_id, m, SyncResult(KafkaError.NONE, m.assignment,
                                                                        group.protocol_type, group.protocol))

        def fail(error: KafkaError) -> None:
            if still_waiting():
                self._reset_assignment(group, error)
                self._prepare_rebalance(group)

        # Encoding happens inside the append so an unencodable name is an error answer.
        self._log.write(lambda: self._log.append_records([(group_key(group.group_id), group_value(snapshot))]),
                    apply, fail)

    def _store_group_snapshot(self, group: Group) -> None:
        """Persist generation and members (after a group empties or a static member
        is replaced). Memory already changed: a lost snapshot only means the next
        start sees an older one, whose members then expire."""
        snapshot = self.group_record(group)

        def apply(info: AppendInfo) -> None:
            group.persisted = True

        self._log.write(lambda: self._log.append_records([(group_key(group.group_id), group_value(snapshot))]),
                    apply, lambda error: None)

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[KafkaError, list[KafkaError]]:
        """(top-level error, one error per leaving (member_id, group_instance_id))."""
        err = self._ready()
        if not err and not group_id:
            err = KafkaError.INVALID_GROUP_ID
        if err:
            return err, []
        if self._consumers.classic.hosts(group_id):
            return KafkaError.NONE, self._consumers.classic.leave(group_id, members)
        group = self._store.groups.get(group_id)
        if group is None:
            return KafkaError.NONE, [KafkaError.UNKNOWN_MEMBER_ID] * len(members)
        if group.state is S.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE, []
        return KafkaError.NONE, [self._leave_one(group, mid, inst) for mid, inst in members]

    def _leave_one(self, group: Group, member_id: str, group_instance_id: str | None) -> KafkaError:
        if group_instance_id is not None:
            known = group.static.get(group_instance_id)
            if known is None:
                return KafkaError.UNKNOWN_MEMBER_ID
            if member_id and known != member_id:
                return KafkaError.FENCED_INSTANCE_ID
            member_id = known
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self.timers.cancel(("hb", group.group_id, member_id))
            self._try_complete_join(group)
            return KafkaError.NONE
        member = group.members.get(member_id)
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        self._remove_member_and_update_group(group, member)
        return KafkaError.NONE
