"""The classic members' long polls: a JoinGroup or SyncGroup whose answer comes later
(at the end of the join phase, once the leader's assignment is durable).

The futures live here, keyed by group and member; the classic shard's state says only
that a member waits (`Member.awaiting_join` / `awaiting_sync`), and its operations say
which poll to answer with what (classic_shard.ClassicOp.polls). A client that goes
away mid-poll cancels its future: `on_gone` tells the edge, which has the shard record
that the member no longer waits."""
from __future__ import annotations

import asyncio
from typing import Callable, TypeVar

from .coordinator_log import resolve_future
from .group_model import JOIN, SYNC, JoinResult, SyncResult

T = TypeVar("T")
Key = tuple[str, str]


class Waiters:
    """The JoinGroup and SyncGroup answers still owed, by (group id, member id).
    `on_gone(kind, group_id, member_id)` runs when a waiting client goes away."""

    def __init__(self) -> None:
        self._join: dict[Key, asyncio.Future[JoinResult]] = {}
        self._sync: dict[Key, asyncio.Future[SyncResult]] = {}
        self.on_gone: Callable[[str, str, str], None] = lambda kind, group_id, member_id: None

    def wait_join(self, group_id: str, member_id: str) -> asyncio.Future[JoinResult]:
        """A future for the member's JoinGroup answer."""
        return self._wait(self._join, JOIN, (group_id, member_id))

    def wait_sync(self, group_id: str, member_id: str) -> asyncio.Future[SyncResult]:
        """A future for the member's SyncGroup answer."""
        return self._wait(self._sync, SYNC, (group_id, member_id))

    def answer_join(self, group_id: str, member_id: str, result: JoinResult) -> None:
        """Answer the member's JoinGroup (nothing when it does not wait)."""
        resolve_future(self._join.pop((group_id, member_id), None), result)

    def answer_sync(self, group_id: str, member_id: str, result: SyncResult) -> None:
        """Answer the member's SyncGroup (nothing when it does not wait)."""
        resolve_future(self._sync.pop((group_id, member_id), None), result)

    def answer_all(self, result: Callable[[str], tuple[JoinResult, SyncResult]]) -> None:
        """Answer every poll (the coordinator stops serving); `result` gives both answers
        for a member id."""
        joins, syncs = self._join, self._sync
        self._join, self._sync = {}, {}
        for (_gid, mid), jfut in joins.items():
            resolve_future(jfut, result(mid)[0])
        for (_gid, mid), sfut in syncs.items():
            resolve_future(sfut, result(mid)[1])

    def _wait(self, table: dict[Key, asyncio.Future[T]], kind: str, key: Key) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        table[key] = fut

        def gone(done: asyncio.Future[T]) -> None:
            # The client went away (its request task was cancelled): it no longer waits.
            if done.cancelled() and table.get(key) is done:
                del table[key]
                self.on_gone(kind, *key)
        fut.add_done_callback(gone)
        return fut
