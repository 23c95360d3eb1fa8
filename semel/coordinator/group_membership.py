"""Classic group membership at the edge: JoinGroup, SyncGroup, Heartbeat, LeaveGroup
(DescribeGroups, ListGroups and DeleteGroups: semel.coordinator.group_listing).

What a request does to a group is decided by the classic shard (classic_shard.ClassicShard)
with no I/O; this edge checks that the coordinator serves, hands a group of the consumer
protocol to its own classic path, and runs each op the shard returns (`run`): the group
into memory by the shard's replay, the long polls answered or waited on (group_waiters),
the deadlines set as runtime timers whose callbacks run the shard's operation for them,
and the group snapshots written through the runtime's log, their outcome run as an
operation of the shard in turn."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping, Sequence

from ..protocol.errors import KafkaError
from .classic_ops import ClassicOp, LeaveAnswer, Timer, Write
from .classic_shard import ClassicShard
from .consumer_group import ConsumerGroups
from .consumer_group_rules import Answer
from .coordinator_log import done_future
from .group_context import GroupContext
from .group_model import JOIN, JoinRequest, JoinResult, SyncResult
from .offsets import group_key, group_value

log = logging.getLogger("semel.coordinator.group")


class GroupMembership:
    """GroupCoordinator's classic membership: the edge of its ClassicShard (`shard`).

    Made with the coordinator's GroupContext and the consumer-protocol groups
    (`consumers`: a group id is of one protocol at a time)."""

    def __init__(self, ctx: GroupContext, consumers: ConsumerGroups) -> None:
        self._log, self._ready, self.timers = ctx.log, ctx.ready, ctx.timers
        self._store = ctx.store
        self._waiters = ctx.waiters
        self._consumers = consumers
        self.shard = ClassicShard(ctx.store, ctx.config, ctx.timers.now)
        self._waiters.on_gone = self._gone
        consumers.classic.on_downgraded = self._downgraded
        consumers.classic.on_upgrading = self._handed_over

    def _gone(self, kind: str, group_id: str, member_id: str) -> None:
        """The client waiting in the member's poll went away."""
        self.run(self.shard.abandoned(group_id, member_id, kind))

    def _handed_over(self, group_id: str) -> None:
        """The group becomes a consumer group: its classic members rejoin there."""
        self.run(self.shard.handed_over(group_id))

    def _downgraded(self, group_id: str, protocols: Mapping[str, Sequence[tuple[str, bytes]]]) -> None:
        """A consumer group became this classic group: it rebalances."""
        self.run(self.shard.downgraded(group_id, protocols))

    # --- carrying out what the shard decided -------------------------------------------------

    def run(self, op: ClassicOp) -> "asyncio.Future[Any] | None":
        """Carry `op` out: its group into memory, its polls answered in order, its timers,
        its writes. Returns the future the request waits on (None: it does not wait)."""
        self.shard.replay(op)
        gid, waiting = op.group_id, None
        for kind, member_id, result in op.polls:
            if result is None:
                waiting = (self._waiters.wait_join if kind == JOIN else self._waiters.wait_sync)(gid, member_id)
            elif isinstance(result, JoinResult):
                self._waiters.answer_join(gid, member_id, result)
            else:
                self._waiters.answer_sync(gid, member_id, result)
        for timer in op.timers:
            self._set(gid, timer)
        for write in op.writes:
            self._write(gid, write)
        return waiting

    def _set(self, group_id: str, timer: Timer) -> None:
        due = timer.due
        if due is None:
            self.timers.cancel(timer.key)
            return

        def fire() -> None:
            expiring = str(due.args[0]) if due.op == "session_expired" else None
            was_member = expiring is not None and self._member_of(group_id, expiring)
            self.run(self.shard.due(group_id, due))
            if was_member and not self._member_of(group_id, str(expiring)):
                log.info("member %s of group %s expired", expiring, group_id)
        self.timers.set(timer.key, timer.delay_ms, fire)

    def _member_of(self, group_id: str, member_id: str) -> bool:
        group = self._store.groups.get(group_id)
        return group is not None and member_id in group.members

    def _write(self, group_id: str, write: Write) -> None:
        # Encoding happens inside the append so an unencodable name is an error answer.
        self._log.write(lambda: self._log.append_records([(group_key(group_id), group_value(write.snapshot))]),
                        lambda info: self.run(self.shard.stored(group_id, write)),
                        lambda error: self.run(self.shard.store_failed(group_id, write, error)))

    def _answer(self, op: ClassicOp) -> "asyncio.Future[Any]":
        """Run `op`; the request's answer: its poll, or the op's response now."""
        waiting = self.run(op)
        return waiting if waiting is not None else done_future(op.response)

    # --- the requests ------------------------------------------------------------------------------

    def join_group(self, group_id: str, member_id: str, *, protocol_type: str,
                   protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                   rebalance_timeout_ms: int = -1, group_instance_id: str | None = None,
                   client_id: str = "", client_host: str = "",
                   require_known_member_id: bool = True,
                   topics: "Callable[[], Mapping[str, int]] | None" = None) -> "asyncio.Future[JoinResult]":
        """`topics` gives each topic's partition count, for a consumer group's classic members."""
        err = self._ready() or self.shard.join_error(group_id, session_timeout_ms)
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
        req = JoinRequest(group_instance_id, client_id, client_host, session_timeout_ms,
                          rebalance_timeout_ms, protocol_type, protocols)
        return self._answer(self.shard.join(group_id, member_id, req, require_known_member_id))

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  group_instance_id: str | None = None) -> KafkaError:
        err = self._ready()
        if err:
            return err
        if self._consumers.classic.hosts(group_id):
            return self._consumers.classic.heartbeat(group_id, generation, member_id)
        op = self.shard.heartbeat(group_id, generation, member_id, group_instance_id)
        self.run(op)
        assert isinstance(op.response, KafkaError)
        return op.response

    def touch(self, group_id: str, member_id: str) -> None:
        """A commit is a sign of life: the member's session starts again."""
        self.run(self.shard.touch(group_id, member_id))

    def sync_group(self, group_id: str, generation: int, member_id: str, *,
                   group_instance_id: str | None = None, protocol_type: str | None = None,
                   protocol_name: str | None = None,
                   assignments: dict[str, bytes] | None = None) -> "asyncio.Future[SyncResult]":
        err = self._ready()
        if err:
            return done_future(SyncResult(err))
        if self._consumers.classic.hosts(group_id):
            return self._consumers.classic.sync(group_id, generation, member_id)
        return self._answer(self.shard.sync(group_id, generation, member_id, group_instance_id=group_instance_id,
                                            protocol_type=protocol_type, protocol_name=protocol_name,
                                            assignments=assignments))

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]) -> LeaveAnswer:
        """(top-level error, one error per leaving (member_id, group_instance_id))."""
        err = self._ready()
        if err:
            return err, []
        if self._consumers.classic.hosts(group_id):
            return KafkaError.NONE, self._consumers.classic.leave(group_id, members)
        op = self.shard.leave(group_id, members)
        self.run(op)
        assert isinstance(op.response, tuple)
        return op.response

    def restored(self) -> None:
        """After a load: every restored member gets a full session to find us again."""
        for group_id in list(self._store.groups):
            self.run(self.shard.restored(group_id))

