"""The classic members' long polls: a JoinGroup or SyncGroup whose answer comes later
(at the end of the join phase, once the leader's assignment is durable).

The futures live here, keyed by group and member; the member itself only says that it
waits (`Member.awaiting_join` / `awaiting_sync`), which the join barrier and session
expiry read. So the group model holds plain values and the answers are given in one
place. A client that goes away mid-poll cancels its future: the member then no longer
counts as waiting, as if it had never asked."""
from __future__ import annotations

import asyncio
from typing import Callable, TypeVar

from ..protocol.errors import KafkaError
from .coordinator_log import resolve_future
from .group_model import JoinResult, Member, SyncResult

T = TypeVar("T")
Key = tuple[str, str]


class Waiters:
    """The JoinGroup and SyncGroup answers still owed, by (group id, member id)."""

    def __init__(self) -> None:
        self._join: dict[Key, asyncio.Future[JoinResult]] = {}
        self._sync: dict[Key, asyncio.Future[SyncResult]] = {}

    def wait_join(self, group_id: str, member: Member) -> asyncio.Future[JoinResult]:
        """A future for `member`'s JoinGroup answer; it waits from now."""
        member.awaiting_join = True
        return self._wait(self._join, (group_id, member.member_id), member, "awaiting_join")

    def wait_sync(self, group_id: str, member: Member) -> asyncio.Future[SyncResult]:
        """A future for `member`'s SyncGroup answer; it waits from now."""
        member.awaiting_sync = True
        return self._wait(self._sync, (group_id, member.member_id), member, "awaiting_sync")

    def answer_join(self, group_id: str, member: Member, result: JoinResult) -> None:
        """Answer `member`'s JoinGroup (nothing when it does not wait)."""
        member.awaiting_join = False
        resolve_future(self._join.pop((group_id, member.member_id), None), result)

    def answer_sync(self, group_id: str, member: Member, result: SyncResult) -> None:
        """Answer `member`'s SyncGroup (nothing when it does not wait)."""
        member.awaiting_sync = False
        resolve_future(self._sync.pop((group_id, member.member_id), None), result)

    def answer(self, group_id: str, member: Member, error: KafkaError) -> None:
        """Answer both of `member`'s polls with `error`: it is gone, fenced or must
        look again."""
        self.answer_join(group_id, member, JoinResult(error, member.member_id))
        self.answer_sync(group_id, member, SyncResult(error))

    def answer_all(self, result: Callable[[str], tuple[JoinResult, SyncResult]]) -> None:
        """Answer every poll (the coordinator stops serving); `result` gives both answers
        for a member id."""
        joins, syncs = self._join, self._sync
        self._join, self._sync = {}, {}
        for (_gid, mid), jfut in joins.items():
            resolve_future(jfut, result(mid)[0])
        for (_gid, mid), sfut in syncs.items():
            resolve_future(sfut, result(mid)[1])

    def _wait(self, table: dict[Key, asyncio.Future[T]], key: Key, member: Member,
              flag: str) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        table[key] = fut

        def gone(done: asyncio.Future[T]) -> None:
            # The client went away (its request task was cancelled): it no longer waits.
            if done.cancelled() and table.get(key) is done:
                del table[key]
                setattr(member, flag, False)
        fut.add_done_callback(gone)
        return fut
