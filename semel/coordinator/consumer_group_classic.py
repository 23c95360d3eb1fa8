"""Classic members in consumer groups, and the online upgrade and downgrade between the
two protocols (the rules are in consumer_group_migration; this is the coordinator's
side: routing JoinGroup/SyncGroup/Heartbeat/LeaveGroup of a consumer group's classic
members, and answering the waiting members around a conversion's replay).

A conversion is one op of the shard (consumer_shard): the records of one protocol's
group and the tombstone (or snapshot) of the other's in one batch, replayed together
once durable, so a replay finds one group.
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any, Callable, Coroutine, Mapping, Protocol, Sequence, TypeVar

from ..protocol.consumer_protocol import PROTOCOL_TYPE, encode_assignment
from ..protocol.errors import KafkaError
from . import consumer_group_migration as mig
from .consumer_group_rules import Answer
from .consumer_regex import regex_matches
from .consumer_shard import UPGRADE, CgOp, ConsumerShard
from .coordinator_log import done_future
from .group_context import GroupContext
from .group_model import JoinResult, SyncResult

T = TypeVar("T")


class Spawn(Protocol):
    """The coordinator's background tasks: runs `coro` as one of them."""

    def __call__(self, coro: Coroutine[Any, Any, T], /) -> asyncio.Task[T]: ...


class ConsumerWrites(Protocol):
    """What ClassicMembers uses of ConsumerGroups (which makes it): its shard, the write
    path its ops take, and the wait for a group's write in flight."""
    shard: ConsumerShard

    def run(self, op: CgOp) -> "asyncio.Future[Answer]": ...

    async def settled(self, group_id: str) -> None: ...

    def arm_revocation(self, group_id: str, member_id: str) -> None: ...

    def session_expired(self, group_id: str, member_id: str) -> None: ...

log = logging.getLogger("semel.coordinator.consumer_group")

Topics = Callable[[], Mapping[str, int]]


class ClassicMembers:
    """The classic side of ConsumerGroups: made by it with the coordinator's GroupContext,
    itself (`cg`: its writes and the write each group waits for) and `spawn`. GroupMembership
    sets `on_upgrading` (the classic group's members are told to rejoin, its deadlines go)
    and `on_downgraded` (the members' sessions start and the group made classic again
    rebalances): both run operations of the classic shard."""

    def __init__(self, ctx: GroupContext, cg: ConsumerWrites,
                 spawn: Spawn) -> None:
        self.cg = cg
        self._store, self._ready, self.timers, self.config = ctx.store, ctx.ready, ctx.timers, ctx.config
        self._spawn = spawn
        self.on_downgraded: Callable[[str, Mapping[str, Sequence[tuple[str, bytes]]]], None] = lambda gid, protocols: None
        self.on_upgrading: Callable[[str], None] = lambda gid: None

    def hosts(self, group_id: str) -> bool:
        """Are the classic APIs of this group answered by its consumer group?"""
        g = self._store.consumer_groups.get(group_id)
        return g is not None and bool(g.members)

    def arm_session(self, group_id: str, member_id: str) -> None:
        g = self._store.consumer_groups.get(group_id)
        meta = g.members.get(member_id) if g is not None else None
        timeout = (meta.classic.session_timeout_ms if meta is not None and meta.classic is not None
                   else self.config.consumer_session_timeout_ms)
        self.timers.set(("cg", group_id, member_id), timeout,
                        lambda: self.cg.session_expired(group_id, member_id))

    # --- a conversion between the protocols, around its replay ---------------------------------

    def prepare_conversion(self, op: CgOp) -> Callable[[], None]:
        """What the edge does around the replay of a conversion (the shard's replay changes
        the groups; this answers the members that wait and moves their timers): called
        before the replay, it returns what to do after it."""
        gid = op.group_id
        if op.conversion == UPGRADE:
            # The classic members are told to rejoin, now into the consumer group.
            self.on_upgrading(gid)

            def upgraded() -> None:
                g = self._store.consumer_groups.get(gid)
                for mid, m in (g.members.items() if g is not None else ()):
                    if m.classic is not None:
                        self.arm_session(gid, mid)
                log.info("classic group %s upgraded to a consumer group", gid)
            return upgraded
        g = self._store.consumer_groups.get(gid)
        # The snapshot holds each member's chosen protocol only; they keep all of theirs.
        protocols = {mid: m.classic.protocols for mid, m in g.members.items() if m.classic} if g else {}

        def downgraded() -> None:
            for mid in self._store.groups[gid].members:
                for kind in ("cg", "cg-revoke", "cg-rejoin"):
                    self.timers.cancel((kind, gid, mid))
            self.on_downgraded(gid, protocols)
            log.info("consumer group %s downgraded to a classic group", gid)
        return downgraded

    # --- the classic APIs of a consumer group's classic members ----------------------------------

    def join(self, group_id: str, member_id: str, *, protocol_type: str,
                     protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                     rebalance_timeout_ms: int, group_instance_id: str | None, client_id: str,
                     client_host: str, require_known_member_id: bool,
                     topics: Topics | None) -> "asyncio.Future[JoinResult]":
        if protocol_type != PROTOCOL_TYPE or not protocols or topics is None:
            return done_future(JoinResult(KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id))
        if not member_id:
            member_id = f"{group_instance_id or client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                return done_future(JoinResult(KafkaError.MEMBER_ID_REQUIRED, member_id))
        m = mig.ClassicMember(member_id, group_instance_id, client_id, client_host, rebalance_timeout_ms,
                              session_timeout_ms, tuple(protocols))
        return self._spawn(self._classic_join(group_id, m, topics))

    async def _classic_join(self, group_id: str, m: mig.ClassicMember, topics: Topics) -> JoinResult:
        await self.cg.settled(group_id)
        if err := self._ready():
            return JoinResult(err, m.member_id)
        if not self.hosts(group_id):
            # Became classic meanwhile: the member joins again, there.
            return JoinResult(KafkaError.REBALANCE_IN_PROGRESS, m.member_id)
        self.timers.cancel(("cg-rejoin", group_id, m.member_id))
        op = self.cg.shard.classic_join(group_id, m, topics(), regex_matches)
        if op.response.error:
            return JoinResult(op.response.error, m.member_id)
        answer = await self.cg.run(op)
        if answer.error:
            return JoinResult(answer.error, m.member_id)
        self.arm_session(group_id, m.member_id)
        self.cg.arm_revocation(group_id, m.member_id)
        return JoinResult(KafkaError.NONE, m.member_id, answer.member_epoch, PROTOCOL_TYPE,
                          m.protocols[0][0], "", [])

    def sync(self, group_id: str, generation: int, member_id: str) -> "asyncio.Future[SyncResult]":
        async def sync() -> SyncResult:
            await self.cg.settled(group_id)
            if err := self._ready():
                return SyncResult(err)
            g = self._store.consumer_groups.get(group_id)
            if g is None:
                return SyncResult(KafkaError.REBALANCE_IN_PROGRESS)
            err, cur = mig.classic_sync(g, member_id, generation)
            if err or cur is None:
                return SyncResult(err)
            self.arm_session(group_id, member_id)
            return SyncResult(KafkaError.NONE, encode_assignment(cur.assigned), PROTOCOL_TYPE,
                              mig.protocol_name(g.members[member_id]))
        return self._spawn(sync())

    def heartbeat(self, group_id: str, generation: int, member_id: str) -> KafkaError:
        err = mig.classic_heartbeat(self._store.consumer_groups[group_id], member_id, generation)
        if err in (KafkaError.NONE, KafkaError.REBALANCE_IN_PROGRESS):
            self.arm_session(group_id, member_id)
        if err == KafkaError.REBALANCE_IN_PROGRESS:
            self._arm_rejoin(group_id, member_id)
        return err

    def _arm_rejoin(self, group_id: str, member_id: str) -> None:
        """A classic member told to rejoin has its rebalance timeout to do so, from the first
        time it was told; one that keeps heartbeating without rejoining would otherwise hold
        its partitions from the others for ever. It is fenced then, as in Kafka."""
        key = ("cg-rejoin", group_id, member_id)
        if self.timers.active(key):
            return
        timeout = self._store.consumer_groups[group_id].members[member_id].rebalance_timeout_ms
        self.timers.set(key, timeout, lambda: self._spawn(self._rejoin_overdue(group_id, member_id)))

    async def _rejoin_overdue(self, group_id: str, member_id: str) -> None:
        await self.cg.settled(group_id)
        old = self._store.consumer_groups.get(group_id)
        if self._ready() or old is None or member_id not in old.members:
            return
        log.info("classic member %s of consumer group %s did not rejoin within its rebalance timeout; fenced",
                 member_id, group_id)
        await self.remove(group_id, member_id)

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[KafkaError]:
        g = self._store.consumer_groups[group_id]
        out = []
        for member_id, instance_id in members:
            if instance_id is not None:
                member_id = next((mid for mid, m in g.members.items() if m.instance_id == instance_id),
                                 member_id)
            if member_id not in g.members:
                out.append(KafkaError.UNKNOWN_MEMBER_ID)
                continue
            out.append(KafkaError.NONE)
            self._spawn(self.remove(group_id, member_id))
        return out

    async def remove(self, group_id: str, member_id: str) -> None:
        await self.cg.settled(group_id)
        old = self._store.consumer_groups.get(group_id)
        if self._ready() or old is None or member_id not in old.members:
            return
        for kind in ("cg", "cg-revoke", "cg-rejoin"):
            self.timers.cancel((kind, group_id, member_id))
        await self.cg.run(self.cg.shard.remove(group_id, member_id))
