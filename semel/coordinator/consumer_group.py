"""Consumer groups of the KIP-848 protocol in the group coordinator: ConsumerGroupHeartbeat,
ConsumerGroupDescribe, session expiry, and the member-epoch checks of offset commits.

Every change takes the coordinator's one path: the rules (consumer_group_rules, pure)
prepare the next state of the group from the current one; the difference is appended
to __consumer_offsets as records (consumer_records); once durable those records are
applied to memory by the same function the start-up replay uses (also when their
fsync failed: they are in the log, so memory stays what a replay gives). While a group has a
write in flight, the next request for it waits for that write to be applied and then
decides on the state it left, never on state read before an await.

The groups share the coordinator's log, timers and committed offsets (a group's
offsets live in the classic `Group` of the same id, which holds no members while the
group uses this protocol).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence
from typing import Mapping

from ..protocol.errors import KafkaError
from . import consumer_group_rules as rules
from .consumer_group_classic import ClassicMembers, Spawn
from .consumer_group_rules import Answer, ConsumerGroup, Heartbeat
from .consumer_regex import regex_error, regex_matches
from .consumer_records import Record, apply_records, records_between
from .coordinator_log import done_future
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
        self._store, self._log, self._ready = ctx.store, ctx.log, ctx.ready
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
        upgraded, refused = self.classic.upgrade_start(group_id)
        if refused is not None:
            return Answer(refused.error, hb.member_id, -1, None, refused.message)
        old = upgraded or self._store.consumer_groups.get(group_id)
        new, answer = rules.heartbeat(old, group_id, hb, topics, regex_matches)
        if answer.error:
            return answer
        if upgraded is not None and new is not None:
            answer = await self.classic.upgrade_write(group_id, new, answer)
        elif answer.member_epoch == rules.LEAVE_EPOCH and old is not None and new is not None:
            answer = await self.classic.commit(group_id, old, new, answer)
        else:
            answer = await self.cg_write(group_id, old, new, answer)
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
                            lambda: self._spawn(self._cg_revocation_overdue(group_id, member_id, epoch)))

    async def _cg_revocation_overdue(self, group_id: str, member_id: str, epoch: int) -> None:
        while (pending := self.pending.get(group_id)) is not None:
            await asyncio.wait([pending])
        old = self._store.consumer_groups.get(group_id)
        cur = old.current.get(member_id) if old is not None and not self._ready() else None
        if old is None or cur is None or cur.state is not rules.MemberState.UNREVOKED_PARTITIONS or cur.epoch != epoch:
            return
        log.info("member %s of consumer group %s kept partitions past its rebalance timeout; fenced",
                 member_id, group_id)
        self.timers.cancel(("cg", group_id, member_id))
        await self.classic.commit(group_id, old, rules.remove_member(old, member_id), Answer())

    def cg_write(self, group_id: str, old: ConsumerGroup | None, new: ConsumerGroup | None,
                 answer: Answer, *, before: Sequence[Record] = (), after: Sequence[Record] = (),
                 on_apply: Callable[[], None] | None = None) -> "asyncio.Future[Answer]":
        """Append the records from `old` to `new`; apply them once durable. A conversion
        between the protocols puts the classic group's records `before` or `after` them in
        the same batch, and `on_apply` applies those."""
        records = records_between(old, new)
        batch = [*before, *records, *after]
        if not batch:
            return done_future(answer)

        def apply(info: object) -> Answer:
            apply_records(self._store.consumer_groups, records)
            if on_apply is not None:
                on_apply()
            return answer

        def fail(error: KafkaError) -> Answer:
            return Answer(error, answer.member_id, -1)

        def unsynced(error: KafkaError) -> Answer:
            # The records are in the log though their fsync failed, and a replay will apply
            # them: memory follows the log (as the transaction coordinator's does), so the
            # next transition is computed from what a restart would load. The member is
            # answered with the error and retries, as after a lost answer.
            apply(None)
            return fail(error)

        fut = self._log.write(lambda: self._log.append_records(batch), apply, fail, unsynced=unsynced)
        if fut.done():   # applied already (no fsync to wait for) or refused
            return fut
        self.pending[group_id] = fut

        def done(_: object) -> None:
            if self.pending.get(group_id) is fut:
                del self.pending[group_id]
        fut.add_done_callback(done)
        return fut

    def session_expired(self, group_id: str, member_id: str) -> None:
        self._spawn(self._cg_fence(group_id, member_id))

    async def _cg_fence(self, group_id: str, member_id: str) -> None:
        """The member missed its session: it is removed and its partitions go to others."""
        while (pending := self.pending.get(group_id)) is not None:
            await asyncio.wait([pending])
        if self._ready() or self.timers.active(("cg", group_id, member_id)):
            return   # not serving, or the member heartbeated meanwhile
        old = self._store.consumer_groups.get(group_id)
        if old is None or member_id not in old.members:
            return
        log.info("member %s of consumer group %s missed its session; fenced", member_id, group_id)
        await self.classic.commit(group_id, old, rules.remove_member(old, member_id), Answer())

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
