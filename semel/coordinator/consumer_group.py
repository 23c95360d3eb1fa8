"""Consumer groups of the KIP-848 protocol in the group coordinator: ConsumerGroupHeartbeat,
ConsumerGroupDescribe, session expiry, and the member-epoch checks of offset commits.

This is the asynchronous edge of the consumer-protocol shard (consumer_shard.ConsumerShard):
each change is an op the shard decides with no I/O (records and an answer), which `run`
writes through the coordinator runtime (append -> commit point -> the shard's replay ->
answer; the replay also when the commit wait failed: the records are in the log, so
memory stays what a restart loads). While a group has a write in flight, the next op for
it waits for that write to be replayed and then decides on the state it left, never on
state read before an await. What waits stays here: the write each group is waiting for
(`pending`), the timers (session, revocation) whose callbacks run the shard's ops.

The groups share the coordinator's log, timers and committed offsets (a group's
offsets live in the classic `Group` of the same id, which holds no members while the
group uses this protocol).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Iterable
from typing import Mapping

from ..protocol.errors import KafkaError
from . import consumer_group_rules as rules
from .consumer_group_classic import ClassicMembers, Spawn
from .consumer_group_rules import Answer, ConsumerGroup, Heartbeat
from .consumer_regex import regex_error, regex_matches
from .consumer_records import records_between
from .consumer_shard import CgOp, ConsumerShard, refused
from .coordinator_log import done_future, resolve_future
from .group_context import GroupContext

log = logging.getLogger("semel.coordinator.consumer_group")


@dataclass(slots=True)
class ConsumerGroupView:
    """ConsumerGroupDescribe's view of one group."""
    group_id: str
    error: KafkaError
    group: ConsumerGroup | None = None
    message: str | None = None


class ConsumerGroups:
    """GroupCoordinator's groups of the consumer protocol.

    Made with the coordinator's GroupContext (its store holds these groups beside the
    classic ones) and `spawn` (the coordinator's background tasks). Owns `pending`: the
    write each group is waiting for."""

    def __init__(self, ctx: GroupContext, spawn: Spawn) -> None:
        self._store, self._log, self._ready, self._runtime = ctx.store, ctx.log, ctx.ready, ctx.runtime
        self.shard = ConsumerShard(ctx.store, ctx.config.consumer_migration_policy)
        self.timers, self.config = ctx.timers, ctx.config
        self._spawn = spawn
        self.pending: dict[str, asyncio.Future[Answer]] = {}
        # Classic members of these groups, and the migration between the protocols.
        self.classic = ClassicMembers(ctx, self, spawn)

    # --- ConsumerGroupHeartbeat ---------------------------------------------------------------

    async def consumer_group_heartbeat(self, group_id: str, hb: Heartbeat,
                                       topics: Mapping[str, int]) -> Answer:
        """One heartbeat; `topics` maps each topic a member may subscribe to -> partitions."""
        if hb.regex and (bad := regex_error(hb.regex)) is not None:
            return Answer(KafkaError.INVALID_REGULAR_EXPRESSION, hb.member_id, -1, None, bad)
        while True:
            err = self._ready()
            if err:
                return Answer(err, hb.member_id, -1)
            pending = self.pending.get(group_id)
            if pending is None:
                break
            await asyncio.wait([pending])
        op = self.shard.heartbeat(group_id, hb, topics, regex_matches)
        if op.response.error:
            return op.response
        answer = await self.run(op)
        if not answer.error:
            if answer.member_epoch == rules.LEAVE_EPOCH:
                self.timers.cancel(("cg", group_id, answer.member_id))
            else:
                self.classic.arm_session(group_id, answer.member_id)
            self.arm_revocation(group_id, answer.member_id)
        return answer

    def arm_revocation(self, group_id: str, member_id: str) -> None:
        """A member told to give partitions up has its rebalance timeout to do so (from the
        moment it was told); one that keeps them longer is fenced, as in Kafka, so a client
        that heartbeats but never revokes cannot hold its partitions from the others."""
        key = ("cg-revoke", group_id, member_id)
        g = self._store.consumer_groups.get(group_id)
        cur = g.current.get(member_id) if g is not None else None
        if g is None or cur is None or cur.state is not rules.MemberState.UNREVOKED_PARTITIONS:
            self.timers.cancel(key)
        elif not self.timers.active(key):
            epoch = cur.epoch
            self.timers.set(key, g.members[member_id].rebalance_timeout_ms,
                            lambda: self._spawn(self._revocation_overdue(group_id, member_id, epoch)))

    async def _revocation_overdue(self, group_id: str, member_id: str, epoch: int) -> None:
        await self.settled(group_id)
        if self._ready():
            return
        op = self.shard.revocation_overdue(group_id, member_id, epoch)
        if op.pairs():
            log.info("member %s of consumer group %s kept partitions past its rebalance timeout; fenced",
                     member_id, group_id)
            self.timers.cancel(("cg", group_id, member_id))
        await self.run(op)

    async def settled(self, group_id: str) -> None:
        """Wait until the group has no write in flight (the next op decides on its result)."""
        while (pending := self.pending.get(group_id)) is not None:
            await asyncio.wait([pending])

    def run(self, op: CgOp) -> "asyncio.Future[Answer]":
        """Write `op` through the runtime: append its batch now; once committed (or in the
        log though its commit wait failed: memory follows the log, and the member, answered
        with the error, retries as after a lost answer) replay it and answer. While it is in
        flight the group's next op waits for it (`pending`)."""
        pairs = op.pairs()
        if not pairs:
            return done_future(op.response)
        try:
            batch = self._log.batch(pairs)
        except ValueError as exc:   # a name that cannot be encoded
            log.warning("refused a write to consumer group %s: %s", op.group_id, exc)
            return done_future(refused(op, KafkaError.INVALID_REQUEST))
        written = self._runtime.write(batch, lambda: self._replay(op), what=f"consumer group {op.group_id}")
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()

        def done(_: object) -> None:
            if self.pending.get(op.group_id) is fut:
                del self.pending[op.group_id]
            try:
                resolve_future(fut, self._answer(op, written))
            except Exception as exc:   # a bug in a replay: the waiter hears of it
                if not fut.done():
                    fut.set_exception(exc)
        if written.done():   # replayed already (no commit point to wait for) or refused
            done(written)
        else:
            self.pending[op.group_id] = fut
            written.add_done_callback(done)
        return fut

    @staticmethod
    def _answer(op: CgOp, written: "asyncio.Future[tuple[KafkaError, bool]]") -> Answer:
        error, _replayed = written.result()
        return refused(op, error) if error else op.response

    def _replay(self, op: CgOp) -> None:
        after = self.classic.prepare_conversion(op) if op.conversion is not None else None
        self.shard.replay(op)
        if after is not None:
            after()

    def session_expired(self, group_id: str, member_id: str) -> None:
        self._spawn(self._fence(group_id, member_id))

    async def _fence(self, group_id: str, member_id: str) -> None:
        """The member missed its session: it is removed and its partitions go to others."""
        await self.settled(group_id)
        if self._ready() or self.timers.active(("cg", group_id, member_id)):
            return   # not serving, or the member heartbeated meanwhile
        op = self.shard.session_expired(group_id, member_id)
        if op.pairs():
            log.info("member %s of consumer group %s missed its session; fenced", member_id, group_id)
        await self.run(op)

    # --- ConsumerGroupDescribe, ListGroups ------------------------------------------------------

    def consumer_group_describe(self, group_ids: Iterable[str]) -> list[ConsumerGroupView]:
        err = self._ready()
        out: list[ConsumerGroupView] = []
        for gid in group_ids:
            if err:
                out.append(ConsumerGroupView(gid, err))
                continue
            g = self._store.consumer_groups.get(gid) if self.group_type(gid) == "consumer" else None
            if g is None:
                classic = self._store.groups.get(gid)
                msg = (f"Group {gid} is not a consumer group." if classic is not None and not classic.is_empty()
                       else f"Group {gid} not found.")
                out.append(ConsumerGroupView(gid, KafkaError.GROUP_ID_NOT_FOUND, None, msg))
            else:
                out.append(ConsumerGroupView(gid, KafkaError.NONE, g))
        return out

    def group_type(self, group_id: str) -> str:
        """Kafka's group type (ListGroups v5): `consumer` for this protocol, else `classic`.
        A consumer group whose members all left, joined by a classic member meanwhile, is
        classic already (its records are on their way out)."""
        if group_id not in self._store.consumer_groups:
            return "classic"
        classic = self._store.groups.get(group_id)
        consumer = self._store.consumer_groups[group_id]
        return "consumer" if consumer.members or classic is None or classic.is_empty() else "classic"

    def consumer_group_rows(self) -> list[tuple[str, str, str]]:
        """(group_id, protocol type, state) of each consumer group, for ListGroups."""
        return [(g.group_id, "consumer", g.state_name()) for g in self._store.consumer_groups.values()
                if self.group_type(g.group_id) == "consumer"]

    # --- member epochs of offset commits ----------------------------------------------------------

    def check_consumer_commit(self, group_id: str, member_epoch: int, member_id: str, *,
                              transactional: bool, api_version: int | None) -> KafkaError | None:
        """The answer to an offset commit for a group of this protocol (None: not one,
        the classic rules decide). Kafka's rules: a commit without a member (epoch < 0)
        only while the group has no members, or from a producer that names no member;
        otherwise the member must exist and its epoch match: an older one is
        STALE_MEMBER_EPOCH (ILLEGAL_GENERATION for TxnOffsetCommit, whose clients do not
        know that code), a newer one FENCED_MEMBER_EPOCH."""
        g = self._store.consumer_groups.get(group_id)
        if g is None:
            return None
        if member_epoch < 0 and (not g.members or (transactional and not member_id)):
            return KafkaError.NONE
        current = g.current.get(member_id)
        if current is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        meta = g.members.get(member_id)
        if meta is not None and meta.classic is not None:
            # A classic member commits with its generation, which is its member epoch.
            return KafkaError.NONE if member_epoch == current.epoch else KafkaError.ILLEGAL_GENERATION
        if not transactional and api_version is not None and api_version < 9:
            return KafkaError.UNSUPPORTED_VERSION
        if member_epoch > current.epoch:
            return KafkaError.FENCED_MEMBER_EPOCH
        if member_epoch < current.epoch:
            return KafkaError.ILLEGAL_GENERATION if transactional else KafkaError.STALE_MEMBER_EPOCH
        return KafkaError.NONE

    def check_consumer_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> KafkaError:
        """OffsetFetch v9 in a group of this protocol, as Kafka checks it: a request that
        names no member (epoch -1, no id: an admin client or a consumer outside group
        management) is served; otherwise the member must exist (UNKNOWN_MEMBER_ID) at
        that very epoch (STALE_MEMBER_EPOCH)."""
        g = self._store.consumer_groups.get(group_id)
        if g is None or (member_epoch < 0 and member_id is None):
            return KafkaError.NONE
        current = g.current.get(member_id or "")
        if current is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        return KafkaError.NONE if member_epoch == current.epoch else KafkaError.STALE_MEMBER_EPOCH

    # --- replay, compaction, unload ----------------------------------------------------------------

    def arm_sessions(self) -> None:
        """Members restored from the log get a full session (and a member revoking, its full
        rebalance timeout) to find the coordinator again."""
        for g in self._store.consumer_groups.values():
            for mid in g.members:
                self.classic.arm_session(g.group_id, mid)
                self.arm_revocation(g.group_id, mid)

    def snapshot_records(self) -> list[tuple[bytes, bytes | None]]:
        out: list[tuple[bytes, bytes | None]] = []
        for g in self._store.consumer_groups.values():
            out += records_between(None, g)
        return out
