"""Classic group membership as a shard: plain Python, no I/O, no asyncio.

JoinGroup, SyncGroup, Heartbeat and LeaveGroup, the join/sync barrier and its deadlines
(session, rebalance, the initial rebalance delay, the pending sync) are operations of
`ClassicShard`. Each reads the group and one request (or one deadline that fell due)
and returns a `ClassicOp`:

  group     the group as it is next. Membership is soft state, as in Kafka: this is a
            record for memory, put in by `replay`, not written to the log;
  writes    the group snapshots to make durable: when the leader's assignment is
            stored (members get it only once it is durable), when a group empties, when
            a static member is replaced. Once durable the edge runs `stored`, on a
            failure `store_failed`: the outcome of a write is an operation too;
  polls     the JoinGroup and SyncGroup answers to give, and where the request itself
            waits, in the order they were decided;
  timers    deadlines to set (each names the operation that runs when it falls due)
            or cancel, in order;
  response  the answer now (None: the request waits for its poll's answer).

(Those values, and `Edit`, which gathers them on a copy of the group: classic_ops.)

Nothing here changes memory but `replay`. The edge (group_membership.GroupMembership)
runs each op: replay, answers, timers, writes through the runtime's log. The model
test drives this shard alone (tests/property/test_classic_shard_model.py).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence

from ..protocol.errors import KafkaError
from .classic_ops import ClassicOp, Due, Edit, Write, awaiting, session_timer, snapshot
from .group_model import (
    JOIN, NEW_MEMBER_JOIN_TIMEOUT_MS, SYNC, Group, GroupConfig, JoinRequest, JoinResult, Member, SyncResult,
)
from .group_replay import GroupStore
from .group_states import HEARTBEAT_RESULT, SYNC_RESULT, Event, GroupState

S = GroupState


class ClassicShard:
    """The classic groups of one group coordinator (`store.groups`). `now` is the
    deadlines' clock (monotonic milliseconds); `new_id` makes a member id from a prefix."""

    def __init__(self, store: GroupStore, config: GroupConfig, now: Callable[[], int],
                 new_id: Callable[[str], str] | None = None) -> None:
        self.store, self.config, self.now = store, config, now
        self.new_id = new_id or (lambda prefix: f"{prefix}-{uuid.uuid4()}")

    def _edit(self, group_id: str) -> Edit | None:
        live = self.store.groups.get(group_id)
        return None if live is None else Edit(ClassicOp(group_id), live.membership_copy())

    # --- JoinGroup ----------------------------------------------------------------------------

    def join_error(self, group_id: str, session_timeout_ms: int) -> KafkaError:
        """A JoinGroup refused before anything is looked at."""
        if not group_id:
            return KafkaError.INVALID_GROUP_ID
        if not self.config.min_session_timeout_ms <= session_timeout_ms <= self.config.max_session_timeout_ms:
            return KafkaError.INVALID_SESSION_TIMEOUT
        return KafkaError.NONE

    def join(self, group_id: str, member_id: str, req: JoinRequest, require_known: bool = True) -> ClassicOp:
        if req.rebalance_timeout_ms is None or req.rebalance_timeout_ms <= 0:
            req.rebalance_timeout_ms = req.session_timeout_ms   # JoinGroup v0 has no rebalance timeout
        req.protocols = [(name, bytes(meta or b"")) for name, meta in req.protocols]
        e = self._edit(group_id)
        if e is None:
            if member_id:
                return ClassicOp(group_id, JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id))
            e = Edit(ClassicOp(group_id), Group(group_id, self.store.clock()))
        group = e.group
        if group.state is S.DEAD:
            return ClassicOp(group_id, JoinResult(KafkaError.COORDINATOR_NOT_AVAILABLE, member_id))
        if not group.supports(req.protocol_type, [n for n, _ in req.protocols], member_id):
            return ClassicOp(group_id, JoinResult(KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id))
        result = self._join_new(e, req, require_known) if not member_id else self._join_known(e, member_id, req)
        if group.state is S.PREPARING_REBALANCE:
            self._try_complete_join(e)
        return e.finish(result)

    def _join_new(self, e: Edit, req: JoinRequest, require_known: bool) -> JoinResult | None:
        new_id = self.new_id(req.group_instance_id or req.client_id or "member")
        if req.group_instance_id is not None:
            return self._join_static(e, new_id, req, req.group_instance_id)
        if require_known:
            # KIP-394: hand out the id first, so a client that times out and retries
            # does not leave a ghost member behind.
            e.group.pending_members.add(new_id)
            e.at(("hb", e.group.group_id, new_id), req.session_timeout_ms, Due("pending_expired", (new_id,)))
            return JoinResult(KafkaError.MEMBER_ID_REQUIRED, new_id)
        return self._add_member_and_rebalance(e, new_id, req)

    def _join_known(self, e: Edit, member_id: str, req: JoinRequest) -> JoinResult | None:
        group = e.group
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            return self._add_member_and_rebalance(e, member_id, req)
        member = group.members.get(member_id)
        if member is None:
            return JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id)
        if group.static_fenced(req.group_instance_id, member_id):
            return JoinResult(KafkaError.FENCED_INSTANCE_ID, member_id)
        state = group.state
        if state is S.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(e, member, req)
        if state is S.COMPLETING_REBALANCE and member.matches(req.protocols):
            return self._join_result(group, member)   # a retried join of this generation
        if state is S.STABLE and member.member_id != group.leader and member.matches(req.protocols):
            return self._join_result(group, member)
        if state in (S.COMPLETING_REBALANCE, S.STABLE):
            return self._update_member_and_rebalance(e, member, req)
        return JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id)

    def _join_static(self, e: Edit, new_id: str, req: JoinRequest, instance_id: str) -> JoinResult | None:
        """A static member (group_instance_id) joining without a member id: a new
        instance replaces the old one, fencing it, without a rebalance when nothing
        changed (basic KIP-345)."""
        group = e.group
        old_id = group.static.get(instance_id)
        old = group.members.get(old_id) if old_id is not None else None
        if old_id is None or old is None:
            return self._add_member_and_rebalance(e, new_id, req)
        e.answer_both(old, KafkaError.FENCED_INSTANCE_ID)
        was_leader = group.leader == old_id
        was_pending_sync = old_id in group.pending_sync
        group.remove(old_id)
        e.cancel(("hb", group.group_id, old_id))
        replacement = self._new_member(new_id, req)
        replacement.assignment = old.assignment
        group.add(replacement)
        if was_leader:
            group.leader = new_id
        if was_pending_sync:
            group.pending_sync.add(new_id)
        if group.state is S.STABLE and not was_leader and old.matches(req.protocols):
            e.arm(replacement)
            e.op.writes.append(Write(snapshot(group, self.store.clock())))   # so a restart knows the new id
            return self._join_result(group, replacement)
        return self._update_member_and_rebalance(e, replacement, req)

    def _new_member(self, member_id: str, req: JoinRequest) -> Member:
        m = Member(member_id, req.group_instance_id, req.client_id, req.client_host,
                   req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type, req.protocols)
        m.joined_at = self.now()
        return m

    def _add_member_and_rebalance(self, e: Edit, member_id: str, req: JoinRequest) -> JoinResult | None:
        """The member joins; its JoinGroup waits for the join phase's end (None)."""
        group = e.group
        member = self._new_member(member_id, req)
        member.is_new = True
        if group.state is S.PREPARING_REBALANCE and group.generation == 0:
            group.new_member_added = True   # extends the initial rebalance delay
        group.add(member)
        e.wait(JOIN, member)   # the join may complete at once (a lone member), below
        e.arm(member)
        self._maybe_prepare_rebalance(e)
        return None

    def _update_member_and_rebalance(self, e: Edit, member: Member, req: JoinRequest) -> JoinResult | None:
        """A known member joins again with what it sends now; it waits (None)."""
        group = e.group
        member.protocols = req.protocols
        member.protocol_type = req.protocol_type
        if len(group.members) == 1:
            group.protocol_type = req.protocol_type   # a lone member may switch protocol type
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        # A second join while the first still waits: the first is superseded.
        e.answer(JOIN, member, JoinResult(KafkaError.REBALANCE_IN_PROGRESS, member.member_id))
        e.wait(JOIN, member)
        e.arm(member)
        self._maybe_prepare_rebalance(e)   # may complete the join at once (a lone member)
        return None

    @staticmethod
    def _join_result(group: Group, member: Member) -> JoinResult:
        is_leader = member.member_id == group.leader
        members = ([(m.member_id, m.group_instance_id, m.metadata(group.protocol))
                    for m in group.members.values()] if is_leader else [])
        return JoinResult(KafkaError.NONE, member.member_id, group.generation, group.protocol_type,
                          group.protocol, group.leader or "", members)

    # --- rebalance mechanics ---------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, e: Edit) -> None:
        if e.group.state in (S.EMPTY, S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(e)

    def _prepare_rebalance(self, e: Edit) -> None:
        group = e.group
        if group.state is S.COMPLETING_REBALANCE:
            self._reset_assignment(e, KafkaError.REBALANCE_IN_PROGRESS)
        e.cancel(("sync", group.group_id))
        group.pending_sync.clear()
        was_empty = group.state is S.EMPTY
        group.to(Event.REBALANCE, self.store.clock())
        key = ("join", group.group_id)
        if was_empty:
            # Wait a little for more members, so a starting group does not rebalance
            # once per arriving member (Kafka's group.initial.rebalance.delay.ms).
            total = group.max_rebalance_timeout()
            delay = min(self.config.initial_rebalance_delay_ms, total)
            group.initial_delay = True
            e.at(key, delay, Due("initial_delay_over", (total - delay,)))
        else:
            group.initial_delay = False
            e.at(key, group.max_rebalance_timeout(), Due("complete_join"))
            self._try_complete_join(e)

    def _initial_delay_over(self, e: Edit, remaining_ms: int) -> None:
        group = e.group
        if group.state is not S.PREPARING_REBALANCE:
            return
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, remaining_ms)
            e.at(("join", group.group_id), delay, Due("initial_delay_over", (remaining_ms - delay,)))
            return
        self._complete_join(e)

    def _try_complete_join(self, e: Edit) -> None:
        group = e.group
        if group.state is S.PREPARING_REBALANCE and not group.initial_delay and group.all_joined():
            self._complete_join(e)

    def _complete_join(self, e: Edit) -> None:
        """End of the join phase: drop members that did not rejoin, start the next
        generation and answer every waiting JoinGroup."""
        group = e.group
        if group.state is not S.PREPARING_REBALANCE:
            return
        group.initial_delay = group.new_member_added = False
        e.cancel(("join", group.group_id))
        for m in [m for m in group.members.values() if not m.awaiting_join]:
            self._drop_member(e, m)
        now = self.store.clock()
        group.generation += 1
        if not group.members:
            group.protocol = None
            group.to(Event.EMPTIED, now)
            e.op.writes.append(Write(snapshot(group, now)))
            return
        group.protocol = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.to(Event.JOINED, now)
        group.pending_sync = set(group.members)
        for m in group.members.values():
            m.is_new = False
            e.answer(JOIN, m, self._join_result(group, m))
            e.arm(m)
        e.at(("sync", group.group_id), group.max_rebalance_timeout(), Due("sync_overdue", (group.generation,)))

    def _reset_assignment(self, e: Edit, error: KafkaError) -> None:
        for m in e.group.members.values():
            m.assignment = b""
            e.answer(SYNC, m, SyncResult(error))
        e.group.storing_generation = -1

    def _sync_overdue(self, e: Edit, generation: int) -> None:
        """Members that got their JoinGroup answer but never sent SyncGroup within
        the rebalance timeout are removed, so the others are not stuck."""
        group = e.group
        if group.generation != generation or not group.pending_sync:
            return
        if group.state not in (S.COMPLETING_REBALANCE, S.STABLE):
            return
        for member_id in list(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member_and_update_group(e, member)

    # --- sessions and removal --------------------------------------------------------------------

    def _session_expired(self, e: Edit, member_id: str) -> None:
        member = e.group.members.get(member_id)
        if member is None:
            return
        waiting = member.awaiting_join or member.awaiting_sync
        too_long_new = member.is_new and self.now() - member.joined_at >= NEW_MEMBER_JOIN_TIMEOUT_MS
        if waiting and not too_long_new:
            # A member blocked in JoinGroup/SyncGroup cannot heartbeat; the join or
            # sync deadline decides its fate instead.
            e.arm(member)
            return
        self._remove_member_and_update_group(e, member)

    def _pending_expired(self, e: Edit, member_id: str) -> None:
        if member_id in e.group.pending_members:
            e.group.pending_members.discard(member_id)
            self._try_complete_join(e)
            e.op.forget = True

    def _drop_member(self, e: Edit, member: Member) -> None:
        e.answer_both(member, KafkaError.UNKNOWN_MEMBER_ID)
        e.group.remove(member.member_id)
        e.cancel(("hb", e.group.group_id, member.member_id))

    def _remove_member_and_update_group(self, e: Edit, member: Member) -> None:
        self._drop_member(e, member)
        if e.group.state in (S.STABLE, S.COMPLETING_REBALANCE):
            self._prepare_rebalance(e)
        elif e.group.state is S.PREPARING_REBALANCE:
            self._try_complete_join(e)

    def due(self, group_id: str, due: Due) -> ClassicOp:
        """The operation a deadline of `group_id` runs (nothing when the group is gone)."""
        e = self._edit(group_id)
        if e is None:
            return ClassicOp(group_id)
        DUE[due.op](self, e, *due.args)
        return e.finish(None)

    # --- Heartbeat, SyncGroup, LeaveGroup --------------------------------------------------------

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  group_instance_id: str | None = None) -> ClassicOp:
        """Changes no member: at most the session deadline moves."""
        if not group_id:
            return ClassicOp(group_id, KafkaError.INVALID_GROUP_ID)
        group = self.store.groups.get(group_id)
        if group is None:
            return ClassicOp(group_id, KafkaError.UNKNOWN_MEMBER_ID)
        err = group.member_error(generation, member_id, group_instance_id)
        if err:
            return ClassicOp(group_id, err)
        result = HEARTBEAT_RESULT[group.state]
        op = ClassicOp(group_id, result)
        if result in (KafkaError.NONE, KafkaError.REBALANCE_IN_PROGRESS):
            op.timers.append(session_timer(group_id, group.members[member_id]))
        return op

    def touch(self, group_id: str, member_id: str) -> ClassicOp:
        """A sign of life other than a heartbeat (an offset commit): the session restarts."""
        group = self.store.groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        return ClassicOp(group_id, timers=[session_timer(group_id, member)] if member is not None else [])

    def sync(self, group_id: str, generation: int, member_id: str, *, group_instance_id: str | None = None,
             protocol_type: str | None = None, protocol_name: str | None = None,
             assignments: Mapping[str, bytes] | None = None) -> ClassicOp:
        if not group_id:
            return ClassicOp(group_id, SyncResult(KafkaError.INVALID_GROUP_ID))
        live = self.store.groups.get(group_id)
        err = sync_error(live, generation, member_id, group_instance_id, protocol_type, protocol_name)
        if err or live is None:   # (sync_error refuses a missing group)
            return ClassicOp(group_id, SyncResult(err))
        fixed = SYNC_RESULT[live.state]
        if fixed is not None:
            return ClassicOp(group_id, SyncResult(fixed))
        e = Edit(ClassicOp(group_id), live.membership_copy())
        group = e.group
        member = group.members[member_id]
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            e.cancel(("sync", group_id))
        e.arm(member)
        if group.state is S.STABLE:
            return e.finish(SyncResult(KafkaError.NONE, member.assignment, group.protocol_type, group.protocol))
        # CompletingRebalance: wait for the leader's assignment to be stored.
        e.answer(SYNC, member, SyncResult(KafkaError.REBALANCE_IN_PROGRESS))
        e.wait(SYNC, member)
        if member_id == group.leader and group.storing_generation != group.generation:
            full = {mid: bytes((assignments or {}).get(mid) or b"") for mid in group.members}
            group.storing_generation = group.generation
            e.op.writes.append(Write(snapshot(group, self.store.clock(), full), group.generation, full))
        return e.finish(None)

    def stored(self, group_id: str, write: Write) -> ClassicOp:
        """`write` is durable: the group has a record in the log, and the assignment it
        carries reaches the members still waiting for it."""
        e = self._edit(group_id)
        if e is None:
            return ClassicOp(group_id)
        group = e.group
        group.persisted = True
        if self._still_storing(group, write):
            for mid, m in group.members.items():
                m.assignment = write.assignments.get(mid, b"")
            group.to(Event.ASSIGNED, self.store.clock())
            for m in group.members.values():
                e.answer(SYNC, m, SyncResult(KafkaError.NONE, m.assignment, group.protocol_type, group.protocol))
        return e.finish(None)

    def store_failed(self, group_id: str, write: Write, error: KafkaError) -> ClassicOp:
        """`write` did not become durable: members waiting for its assignment get `error`
        and the group rebalances."""
        e = self._edit(group_id)
        if e is None or not self._still_storing(e.group, write):
            return ClassicOp(group_id)
        self._reset_assignment(e, error)
        self._prepare_rebalance(e)
        return e.finish(None)

    @staticmethod
    def _still_storing(group: Group, write: Write) -> bool:
        """The group still waits for this write's assignment (it did not move on)."""
        return (write.generation is not None and group.state is S.COMPLETING_REBALANCE
                and group.generation == write.generation == group.storing_generation)

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> ClassicOp:
        """LeaveGroup: the response is (top-level error, one error per leaving member)."""
        if not group_id:
            return ClassicOp(group_id, (KafkaError.INVALID_GROUP_ID, []))
        e = self._edit(group_id)
        if e is None:
            return ClassicOp(group_id, (KafkaError.NONE, [KafkaError.UNKNOWN_MEMBER_ID] * len(members)))
        if e.group.state is S.DEAD:
            return ClassicOp(group_id, (KafkaError.COORDINATOR_NOT_AVAILABLE, []))
        return e.finish((KafkaError.NONE, [self._leave_one(e, mid, inst) for mid, inst in members]))

    def _leave_one(self, e: Edit, member_id: str, group_instance_id: str | None) -> KafkaError:
        group = e.group
        if group_instance_id is not None:
            known = group.static.get(group_instance_id)
            if known is None:
                return KafkaError.UNKNOWN_MEMBER_ID
            if member_id and known != member_id:
                return KafkaError.FENCED_INSTANCE_ID
            member_id = known
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            e.cancel(("hb", group.group_id, member_id))
            self._try_complete_join(e)
            return KafkaError.NONE
        member = group.members.get(member_id)
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        self._remove_member_and_update_group(e, member)
        return KafkaError.NONE

    # --- the edge's own events ---------------------------------------------------------------------

    def abandoned(self, group_id: str, member_id: str, kind: str) -> ClassicOp:
        """The client waiting in `member_id`'s poll of `kind` went away: it no longer waits."""
        e = self._edit(group_id)
        member = e.group.members.get(member_id) if e is not None else None
        if e is None or member is None:
            return ClassicOp(group_id)
        setattr(member, awaiting(kind), False)
        return e.finish(None)

    def restored(self, group_id: str) -> ClassicOp:
        """A group loaded from the log: its members get a full session to find us again."""
        group = self.store.groups.get(group_id)
        members = group.members.values() if group is not None else ()
        return ClassicOp(group_id, timers=[session_timer(group_id, m) for m in members])

    def downgraded(self, group_id: str, protocols: Mapping[str, Sequence[tuple[str, bytes]]]) -> ClassicOp:
        """A consumer group became this classic group (its last consumer-protocol member
        left). The snapshot holds each member's chosen protocol only: they get all of
        theirs (`protocols`) back; they heartbeat here now and rejoin, so it rebalances."""
        e = self._edit(group_id)
        if e is None:
            return ClassicOp(group_id)
        for m in e.group.members.values():
            m.protocols = list(protocols.get(m.member_id, m.protocols))
            e.arm(m)
        self._prepare_rebalance(e)
        return e.finish(None)

    def handed_over(self, group_id: str) -> ClassicOp:
        """The group becomes a consumer group: its classic members are told to rejoin
        (there), and its deadlines go."""
        e = self._edit(group_id)
        if e is None:
            return ClassicOp(group_id)
        for m in e.group.members.values():
            e.answer_both(m, KafkaError.REBALANCE_IN_PROGRESS)
            e.cancel(("hb", group_id, m.member_id))
        for mid in e.group.pending_members:
            e.cancel(("hb", group_id, mid))
        e.group.pending_members.clear()
        e.cancel(("join", group_id))
        e.cancel(("sync", group_id))
        return e.finish(None)

    # --- replay: the one way membership changes ------------------------------------------------

    def replay(self, op: ClassicOp) -> None:
        """`op`'s group into memory (the live group takes its membership; offsets are
        the offsets shard's and stay)."""
        live = self.store.groups.get(op.group_id)
        if op.group is not None:
            if live is None:
                self.store.groups[op.group_id] = live = op.group
            else:
                live.take_membership(op.group)
        if op.forget and live is not None:
            self.store.maybe_forget(live)


def sync_error(group: Group | None, generation: int, member_id: str, group_instance_id: str | None,
               protocol_type: str | None, protocol_name: str | None) -> KafkaError:
    """Why a SyncGroup is refused (NONE: it is not)."""
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


# The operations a deadline runs, by the name its `Due` carries.
DUE: dict[str, Callable[..., None]] = {
    "session_expired": ClassicShard._session_expired,
    "pending_expired": ClassicShard._pending_expired,
    "initial_delay_over": ClassicShard._initial_delay_over,
    "complete_join": ClassicShard._complete_join,
    "sync_overdue": ClassicShard._sync_overdue,
}
