"""The group coordinator: classic consumer-group membership and committed offsets.

Shape of every operation that changes durable state (offsets, the assignment,
deletions, transactional offsets and their markers):

  validate  ->  append records to __consumer_offsets (synchronously, so the log
                order is the order requests were handled)
            ->  wait for the group-committed fsync
            ->  apply to memory, strictly in log order, with the same functions
                the start-up replay uses.

So memory is always "the replay of the durable prefix of the log", and a
failed append or fsync leaves memory as it was and answers with an error.

Classic membership (who joined, heartbeats, the join/sync barrier) is soft state, as
in Kafka: the classic shard's op goes into memory at once; a snapshot of the group
(generation, members, assignment) is written when the leader's assignment is stored,
when a group becomes empty and when a static member is replaced, so members keep
their ids and generation across a restart.

Long-polling requests (JoinGroup, SyncGroup) and writes return futures: the
state change happens when the method is called (in the order the connection
handles requests) and only the answer waits.

Timeouts (session, rebalance, initial rebalance delay, pending sync, offsets
retention) are deadlines in `Timers`, driven by a clock the tests replace.

Its lifecycle (status, load by replay, unload, timers, background tasks, the write
path) is the coordinator runtime's (coordinator.runtime.CoordinatorRuntime, as for the
transaction coordinator); the GroupStore is the shard it loads. The coordinator is
composed of parts by concern, each made in __init__ with the collaborators it uses:
  group_replay       GroupStore: the groups in memory and the apply functions shared
                     with the start-up replay
  consumer_group     ConsumerGroups: the consumer protocol's groups (KIP-848), the edge
                     of their shard (consumer_shard.ConsumerShard), written through
                     the runtime's `write`
  group_membership   GroupMembership: join/sync/heartbeat/leave, the edge of the classic
                     protocol's shard (classic_shard.ClassicShard: the rebalance,
                     decided with no I/O), its ops run through the runtime's log
  group_listing      GroupListing: describe/list/delete
  group_offsets      OffsetManager: offset commit/fetch, transactional offsets, delete,
                     expiry, compaction
and every part writes through the runtime's log, `clog` (coordinator_log.CoordinatorLog:
append -> commit point -> apply in log order, compaction by rewrite; its batches
stamped by the coordinator's clock).
(group_timers: named deadlines; group_model: config, members, groups, answer values;
group_waiters: the JoinGroup and SyncGroup answers still owed, by group and member).
Its public methods are the parts' own, handed on.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Coroutine, Iterable, Mapping

from ..clock import mono_ms
from ..protocol.errors import KafkaError
from .consumer_group import ConsumerGroups, ConsumerGroupView
from .group_context import GroupContext
from .group_listing import GroupListing
from .group_membership import GroupMembership
from .group_model import (
    OFFSETS_TOPIC, FetchedOffset, GroupConfig, GroupSummary, JoinResult, MemberSummary,
    SyncResult,
)
from .group_offsets import OffsetManager
from .offsets_shard import OffsetInput
from .group_replay import GroupStore
from .group_timers import Timers, wall_clock_ms
from .runtime import CoordinatorRuntime
from .group_waiters import Waiters
from .offsets import CommittedOffset, OffsetsLogError, TopicPartition
from ..storage.log import PartitionLog
from ..storage.manager import LogManager
from .ports import CoordinatorSeat, PartitionWriter

log = logging.getLogger("semel.coordinator.group")


class GroupCoordinator:
    """Consumer groups and committed offsets of one broker (it coordinates every group).

    `logs` is the storage LogManager, `writer` the PartitionWriter its writes wait on
    (None: no wait, for tests), `seat` its CoordinatorSeat, which loads, serves and drops
    it (semel.coordinator.ports.LocalSeat on a single node), `deleted_topics` the names of topics the
    cluster holds deleted (None on a single node, which deletes offsets itself), `clock` returns milliseconds (tests pass a fake one and
    drive timeouts with `fire_timers()`; with `run_timers=False` no background task
    fires them).
    """

    def __init__(self, logs: LogManager, writer: PartitionWriter | None = None, config: GroupConfig | None = None,
                 clock: Callable[[], int] | None = None, *, run_timers: bool = True,
                 seat: CoordinatorSeat, deleted_topics: Callable[[], set[str]] | None = None) -> None:
        self.logs = logs
        self.config = config or GroupConfig()
        self.clock = clock or wall_clock_ms
        # Deadlines run on the monotonic clock (a wall-clock step expires no session);
        # a test that gives a clock drives both.
        self.runtime = CoordinatorRuntime(self.config.offsets_topic, writer, sync_writes=self.config.sync_writes,
                                          clock=self.clock, timer_clock=clock or mono_ms)
        self.timers = self.runtime.timers
        self._run_timers = run_timers
        self.clog = self.runtime.log
        # The seat on one __consumer_offsets partition (semel.coordinator.ports):
        # groups are loaded, served and dropped as this broker leads that partition or not.
        self.seat = seat
        # Cluster: names of the topics the cluster holds deleted (OffsetManager drops
        # their offsets).
        self.deleted_topics = deleted_topics
        # The parts, each given what it works with.
        self.store = GroupStore(self.clock)
        self.waiters = Waiters()
        ctx = GroupContext(self.store, self.clog, self.timers, self.config, self.clock, self.ready_error,
                           self.runtime, self.waiters)
        self.consumers = ConsumerGroups(ctx, self.spawn)
        self.membership = GroupMembership(ctx, self.consumers)
        self.listing = GroupListing(ctx, self.consumers)
        self.offset_manager = OffsetManager(ctx, self.membership, self.consumers)

    @staticmethod
    def log_configs(config: GroupConfig) -> dict[str, str]:
        # Committed offsets must never age out of the log: no time or size retention,
        # and "compact", which storage never deletes from (compaction is future work).
        return {"cleanup.policy": "compact", "retention.ms": "-1", "retention.bytes": "-1",
                "segment.bytes": str(config.segment_bytes)}

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start the timers; the groups are rebuilt when the seat loads the log
        (NOT_COORDINATOR until then)."""
        self.timers.set("expire-offsets", self.config.offsets_retention_check_interval_ms,
                        self.offset_manager.expire_offsets)
        self.timers.set("compact", self.config.compact_check_interval_ms, self.offset_manager.maybe_compact)
        self.runtime.start(run_timers=self._run_timers)

    # --- the seat loads, serves and drops this coordinator ---------------------------------

    def load(self, plog: PartitionLog, epoch: int | None) -> None:
        """Rebuild every group from `plog` (synchronously); served once `serve` is called."""
        self.offset_manager.topics_dropped = set()
        started = time.monotonic()
        self.runtime.load(self.store, plog, epoch)
        self.membership.restored()
        self.consumers.arm_sessions()
        log.info("loaded %d groups from %s in %.3fs", len(self.store.groups),
                 self.config.offsets_topic, time.monotonic() - started)

    @property
    def epoch(self) -> int | None:
        """The leader epoch served at (cluster)."""
        return self.runtime.epoch

    def serve(self, epoch: int | None) -> None:
        self.runtime.serve()
        if self.deleted_topics is not None:
            # Topics deleted while another broker coordinated (or before its tombstones
            # were durable) lose their offsets here.
            self.offset_manager.follow_deleted_topics(self.deleted_topics())

    def unload(self) -> None:
        """Not the coordinator (any more): answer every waiting member and write
        NOT_COORDINATOR, so they look for the coordinator again, and forget every group."""
        self._answer_members()
        self.runtime.unload(cancel_tasks=False)
        self._drop_groups()

    def _answer_members(self) -> None:
        self.waiters.answer_all(lambda member_id: (JoinResult(KafkaError.NOT_COORDINATOR, member_id),
                                                   SyncResult(KafkaError.NOT_COORDINATOR)))

    def _drop_groups(self) -> None:
        self.store.clear()
        self.consumers.pending.clear()
        self.timers.cancel_if(lambda key: isinstance(key, tuple))   # per-group deadlines

    async def stop(self) -> None:
        """Finish in-flight writes (briefly), then answer every waiting member
        with NOT_COORDINATOR so it looks for the coordinator again."""
        await self.seat.stop()
        await self.runtime.stop(cancel_tasks=False)
        self._answer_members()
        self._drop_groups()

    async def idle(self) -> None:
        """Wait until every background write has been applied (for tests)."""
        await self.runtime.idle()

    def fire_timers(self) -> int:
        """Run the timeouts that are due by the clock (tests call this after
        advancing a fake clock; the runtime's timer loop calls it in production)."""
        return self.runtime.fire_timers()

    def ready_error(self) -> KafkaError:
        """NONE while serving; why not otherwise (the parts ask before every change)."""
        return self.runtime.error()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` in the background; stop waits for it (briefly)."""
        return self.runtime.spawn(coro)

    # --- the parts' public methods ------------------------------------------------------------
    # Classic membership (GroupMembership).

    def join_group(self, group_id: str, member_id: str, *, protocol_type: str,
                   protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                   rebalance_timeout_ms: int = -1, group_instance_id: str | None = None,
                   client_id: str = "", client_host: str = "",
                   require_known_member_id: bool = True,
                   topics: Callable[[], Mapping[str, int]] | None = None) -> "asyncio.Future[JoinResult]":
        return self.membership.join_group(
            group_id, member_id, protocol_type=protocol_type, protocols=protocols,
            session_timeout_ms=session_timeout_ms, rebalance_timeout_ms=rebalance_timeout_ms,
            group_instance_id=group_instance_id, client_id=client_id, client_host=client_host,
            require_known_member_id=require_known_member_id, topics=topics)

    def sync_group(self, group_id: str, generation: int, member_id: str, *,
                   group_instance_id: str | None = None, protocol_type: str | None = None,
                   protocol_name: str | None = None,
                   assignments: dict[str, bytes] | None = None) -> "asyncio.Future[SyncResult]":
        return self.membership.sync_group(group_id, generation, member_id, group_instance_id=group_instance_id,
                                          protocol_type=protocol_type, protocol_name=protocol_name,
                                          assignments=assignments)

    def heartbeat(self, group_id: str, generation: int, member_id: str,
                  group_instance_id: str | None = None) -> KafkaError:
        return self.membership.heartbeat(group_id, generation, member_id, group_instance_id)

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[KafkaError, list[KafkaError]]:
        return self.membership.leave_group(group_id, members)

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupSummary]:
        return self.listing.describe_groups(group_ids)

    def list_groups(self, states: Iterable[str] | None = None) -> tuple[KafkaError, list[tuple[str, str, str]]]:
        return self.listing.list_groups(states)

    def delete_groups(self, group_ids: Iterable[str]) -> "asyncio.Future[dict[str, KafkaError]]":
        return self.listing.delete_groups(group_ids)

    # Consumer-protocol groups (ConsumerGroups). A ConsumerGroupHeartbeat goes straight to
    # `consumers` (partitioned.GroupCoordinators routes it there).

    def consumer_group_describe(self, group_ids: Iterable[str]) -> list[ConsumerGroupView]:
        return self.consumers.consumer_group_describe(group_ids)

    def group_type(self, group_id: str) -> str:
        return self.consumers.group_type(group_id)

    def consumer_group_rows(self) -> list[tuple[str, str, str]]:
        return self.consumers.consumer_group_rows()

    # Committed offsets (OffsetManager).

    def commit_offsets(self, group_id: str, generation: int, member_id: str,
                       offsets: Mapping[TopicPartition, OffsetInput], *,
                       group_instance_id: str | None = None, api_version: int | None = None
                       ) -> "asyncio.Future[dict[TopicPartition, KafkaError]]":
        return self.offset_manager.commit_offsets(group_id, generation, member_id, offsets,
                                           group_instance_id=group_instance_id, api_version=api_version)

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None,
                      require_stable: bool = False, *, member_id: str | None = None,
                      member_epoch: int = -1) -> tuple[KafkaError, list[FetchedOffset]]:
        return self.offset_manager.fetch_offsets(group_id, partitions, require_stable,
                                                 member_id=member_id, member_epoch=member_epoch)

    def txn_commit_offsets(self, producer_id: int, producer_epoch: int, group_id: str,
                           generation: int, member_id: str, group_instance_id: str | None,
                           offsets: Mapping[TopicPartition, OffsetInput]
                           ) -> "asyncio.Future[dict[TopicPartition, KafkaError]]":
        return self.offset_manager.txn_commit_offsets(producer_id, producer_epoch, group_id, generation, member_id,
                                               group_instance_id, offsets)

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     commit: bool) -> "asyncio.Future[KafkaError]":
        return self.offset_manager.complete_txn(producer_id, producer_epoch, coordinator_epoch, commit)

    def has_pending_offsets(self, producer_id: int) -> bool:
        return self.offset_manager.has_pending_offsets(producer_id)

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition],
                       subscribed: Callable[[bytes], set[str]]
                       ) -> "asyncio.Future[tuple[KafkaError, dict[TopicPartition, KafkaError]]]":
        return self.offset_manager.delete_offsets(group_id, partitions, subscribed)

    def drop_topic_offsets(self, topics: Iterable[str]) -> None:
        self.offset_manager.drop_topic_offsets(topics)

    def follow_deleted_topics(self, deleted: Iterable[str]) -> None:
        self.offset_manager.follow_deleted_topics(deleted)


__all__ = [
    "GroupCoordinator", "GroupConfig", "JoinResult", "SyncResult", "GroupSummary", "MemberSummary",
    "FetchedOffset", "CommittedOffset", "Timers", "OFFSETS_TOPIC", "OffsetsLogError",
]
