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

Membership (who joined, heartbeats, the join/sync barrier) is soft state, as in
Kafka: it changes immediately; a snapshot of the group (generation, members,
assignment) is written when the leader's assignment is stored and when a group
becomes empty, so members keep their ids and generation across a restart.

Long-polling requests (JoinGroup, SyncGroup) and writes return futures: the
state change happens when the method is called (in the order the connection
handles requests) and only the answer waits.

Timeouts (session, rebalance, initial rebalance delay, pending sync, offsets
retention) are deadlines in `Timers`, driven by a clock the tests replace.

The coordinator is assembled from modules by concern:
  group_timers       named deadlines
  group_model        config, members, groups, answer values
  group_write_queue  the group's writes through coordinator_log (append -> fsync ->
                     apply in log order, compaction by rewrite; shared with txn)
  group_replay       the apply functions shared with the start-up replay
  group_membership   join/sync/heartbeat/leave, rebalancing, describe/list/delete
  group_offsets      offset commit/fetch, transactional offsets, delete, expiry, compaction
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from ..clock import mono_ms
from ..protocol.errors import KafkaError
from .consumer_group import ConsumerGroupsMixin
from .consumer_group_rules import ConsumerGroup
from .group_membership import GroupMembership
from .group_model import (
    OFFSETS_TOPIC, FetchedOffset, Group, GroupConfig, GroupSummary, JoinResult, MemberSummary,
    SyncResult,
)
from .group_offsets import GroupOffsetsMixin
from .group_replay import GroupReplay
from .group_timers import Timers, wall_clock_ms
from .coordinator_log import CoordinatorLog, resolve_future
from .group_write_queue import GroupWriteQueue
from .offsets import CommittedOffset, OffsetsLogError
from .ports import CoordinatorSeat, PartitionWriter

log = logging.getLogger("semel.coordinator.group")


class GroupCoordinator(GroupMembership, ConsumerGroupsMixin, GroupOffsetsMixin, GroupReplay, GroupWriteQueue):
    """Consumer groups and committed offsets of one broker (it coordinates every group).

    `logs` is the storage LogManager, `flusher` the PartitionWriter its writes wait on
    (None: no wait, for tests), `seat` its CoordinatorSeat, which loads, serves and drops
    it (semel.coordinator.ports.LocalSeat on a single node), `deleted_topics` the names of topics the
    cluster holds deleted (None on a single node, which deletes offsets itself), `clock` returns milliseconds (tests pass a fake one and
    drive timeouts with `fire_timers()`; with `run_timers=False` no background task
    fires them).
    """

    def __init__(self, logs, flusher: PartitionWriter | None = None, config: GroupConfig | None = None,
                 clock: Callable[[], int] | None = None, *, run_timers: bool = True,
                 seat: CoordinatorSeat, deleted_topics: Callable[[], set[str]] | None = None):
        self.logs = logs
        self.flusher = flusher
        self.config = config or GroupConfig()
        self.clock = clock or wall_clock_ms
        # Deadlines run on the monotonic clock (a wall-clock step expires no session);
        # a test that gives a clock drives both.
        self.timers = Timers(clock or mono_ms)
        self._run_timers = run_timers
        self._groups: dict[str, Group] = {}
        self._producer_groups: dict[int, set[str]] = {}   # producer id -> groups with pending offsets
        # Groups of the consumer protocol (KIP-848), and the write each is waiting for.
        self._consumer_groups: dict[str, ConsumerGroup] = {}
        self._cg_pending: dict[str, asyncio.Future] = {}
        self._log = None
        self._status = "new"
        self._tasks: set[asyncio.Task] = set()
        self._timer_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._clog = CoordinatorLog(self.config.offsets_topic, flusher, self._spawn,
                                    sync_writes=self.config.sync_writes)
        # The seat on one __consumer_offsets partition (semel.coordinator.ports):
        # groups are loaded, served and dropped as this broker leads that partition or not.
        self.seat = seat
        self.epoch: int | None = None    # the leader epoch served at (cluster)
        # Cluster: names of the topics the cluster holds deleted, and those whose offsets
        # this coordinator has dropped since it loaded.
        self.deleted_topics = deleted_topics
        self._topics_dropped: set[str] = set()

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
        self._status = "stopped"
        self.timers.set("expire-offsets", self.config.offsets_retention_check_interval_ms,
                        self._expire_offsets)
        self.timers.set("compact", self.config.compact_check_interval_ms, self._maybe_compact)
        if self._run_timers:
            self._wake = asyncio.Event()
            self.timers.on_change = self._wake.set
            self._timer_task = asyncio.create_task(self._timer_loop(), name="group-timers")

    # --- the seat loads, serves and drops this coordinator ---------------------------------

    def load(self, plog, epoch: int | None) -> None:
        """Rebuild every group from `plog` (synchronously); served once `serve` is called."""
        self._status = "loading"
        self.epoch = epoch
        self._log = self._clog.plog = plog
        self._topics_dropped = set()
        started = time.monotonic()
        self._load()
        log.info("loaded %d groups from %s in %.3fs", len(self._groups),
                 self.config.offsets_topic, time.monotonic() - started)

    def serve(self, epoch: int | None) -> None:
        self._status = "active"
        if self.deleted_topics is not None:
            # Topics deleted while another broker coordinated (or before its tombstones
            # were durable) lose their offsets here.
            self.follow_deleted_topics(self.deleted_topics())

    def unload(self) -> None:
        """Not the coordinator (any more): answer every waiting member and write
        NOT_COORDINATOR, so they look for the coordinator again, and forget every group."""
        self._status = "stopped"
        self._drop_groups()

    def _drop_groups(self) -> None:
        for group in self._groups.values():
            for m in group.members.values():
                resolve_future(m.join_future, JoinResult(KafkaError.NOT_COORDINATOR, m.member_id))
                resolve_future(m.sync_future, SyncResult(KafkaError.NOT_COORDINATOR))
        self._clog.fail_all(KafkaError.NOT_COORDINATOR)
        self._groups.clear()
        self._consumer_groups.clear()
        self._cg_pending.clear()
        self._producer_groups.clear()
        self.timers.cancel_if(lambda key: isinstance(key, tuple))   # per-group deadlines

    async def stop(self) -> None:
        """Finish in-flight writes (briefly), then answer every waiting member
        with NOT_COORDINATOR so it looks for the coordinator again."""
        await self.seat.stop()
        self._status = "stopped"
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
            self._timer_task = None
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        self._drop_groups()

    async def idle(self) -> None:
        """Wait until every background write has been applied (for tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def fire_timers(self) -> int:
        """Run the timeouts that are due by the clock (tests call this after
        advancing a fake clock; the timer task calls it in production)."""
        return self.timers.fire_due()

    async def _timer_loop(self) -> None:
        """Sleep until the next deadline (or until a timer is set), fire what is due.
        Every group timeout depends on this loop, so it logs and carries on after
        any unexpected error instead of dying silently."""
        assert self._wake is not None
        while True:
            try:
                self._wake.clear()
                deadline = self.timers.next_deadline()
                delay = None if deadline is None else (deadline - self.timers.now()) / 1000
                if delay is None or delay > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                self.fire_timers()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("group timer loop failed; continuing")
                await asyncio.sleep(0.1)

    def _ready_error(self) -> KafkaError:
        if self._status == "active":
            return KafkaError.NONE
        if self._status == "loading":
            return KafkaError.COORDINATOR_LOAD_IN_PROGRESS
        if self._status == "stopped":
            return KafkaError.NOT_COORDINATOR
        return KafkaError.COORDINATOR_NOT_AVAILABLE

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("group coordinator task failed", exc_info=task.exception())

    def _current(self, group: Group) -> bool:
        return self._groups.get(group.group_id) is group


__all__ = [
    "GroupCoordinator", "GroupConfig", "JoinResult", "SyncResult", "GroupSummary", "MemberSummary",
    "FetchedOffset", "CommittedOffset", "Timers", "OFFSETS_TOPIC", "OffsetsLogError",
]
