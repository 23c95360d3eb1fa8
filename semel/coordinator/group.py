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
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from ..protocol import records as rb
from ..protocol.errors import KafkaError
from .group_states import (
    COMMIT_RESULT, HEARTBEAT_RESULT, STATE_BY_NAME, SYNC_RESULT, Event, GroupState,
    transition,
)
from .offsets import (
    CommittedOffset, GroupKey, GroupOffsets, GroupRecord, MemberRecord, OffsetKey,
    OffsetsLogError, TopicPartition, decode_group_value, decode_key, decode_offset_value,
    group_key, group_value, offset_key, offset_value, scan_log,
)

from ..storage.errors import AppendError, StorageError

log = logging.getLogger("semel.coordinator.group")

T = TypeVar("T")
S = GroupState

OFFSETS_TOPIC = "__consumer_offsets"
# A brand-new member waiting in a join phase is kept at most this long (Kafka's value).
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000
# Records per batch when expiring or deleting many offsets at once.
MAX_RECORDS_PER_BATCH = 2000


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class GroupConfig:
    initial_rebalance_delay_ms: int = 300
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_interval_ms: int = 600_000
    max_metadata_bytes: int = 4096
    offsets_topic: str = OFFSETS_TOPIC
    # Wait for fsync before answering a write. Offsets are small and rare next to
    # data, so this stays on even when data logs flush on an interval.
    sync_writes: bool = True
    # Compaction by rewrite (see _maybe_compact): checked this often, once this many
    # records piled up (or 4x the live ones); segments this small so old ones can go.
    compact_check_interval_ms: int = 5_000
    compact_records: int = 50_000
    segment_bytes: int = 8 * 1024 * 1024


# --- timers -------------------------------------------------------------------------

class Timers:
    """Named deadlines. Setting a name again replaces its deadline; the heap keeps
    stale entries until they surface (heartbeats re-arm often), compacted when
    they outnumber the live ones."""

    def __init__(self, clock: Callable[[], int]):
        self._clock = clock
        self._heap: list[tuple[int, int, Any]] = []
        self._live: dict[Any, tuple[int, int, Callable[[], None]]] = {}
        self._seq = itertools.count()
        self.on_change: Callable[[], None] | None = None

    def set(self, key: Any, delay_ms: int, callback: Callable[[], None]) -> None:
        deadline = self._clock() + max(0, int(delay_ms))
        seq = next(self._seq)
        self._live[key] = (deadline, seq, callback)
        heapq.heappush(self._heap, (deadline, seq, key))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [(d, s, k) for k, (d, s, _) in self._live.items()]
            heapq.heapify(self._heap)
        if self.on_change is not None:
            self.on_change()

    def cancel(self, key: Any) -> None:
        self._live.pop(key, None)

    def active(self, key: Any) -> bool:
        return key in self._live

    def _is_stale(self, entry: tuple[int, int, Any]) -> bool:
        live = self._live.get(entry[2])
        return live is None or live[1] != entry[1]

    def next_deadline(self) -> int | None:
        while self._heap and self._is_stale(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def fire_due(self) -> int:
        """Run every callback whose deadline has passed; returns how many ran."""
        now, fired = self._clock(), 0
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._is_stale(entry):
                continue
            _, _, callback = self._live.pop(entry[2])
            fired += 1
            try:
                callback()
            except Exception:  # one broken timer must not stop the others
                log.exception("group timer %r failed", entry[2])
        return fired


# --- members, groups, results ---------------------------------------------------------------

class Member:
    __slots__ = ("member_id", "group_instance_id", "client_id", "client_host",
                 "rebalance_timeout_ms", "session_timeout_ms", "protocol_type", "protocols",
                 "assignment", "join_future", "sync_future", "is_new", "joined_at")

    def __init__(self, member_id: str, group_instance_id: str | None, client_id: str,
                 client_host: str, rebalance_timeout_ms: int, session_timeout_ms: int,
                 protocol_type: str, protocols: list[tuple[str, bytes]]):
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        self.protocols = protocols            # (name, metadata) in the member's preference order
        self.assignment = b""
        self.join_future: asyncio.Future | None = None
        self.sync_future: asyncio.Future | None = None
        self.is_new = False
        self.joined_at = 0

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols

    def awaiting_join(self) -> bool:
        return self.join_future is not None and not self.join_future.done()

    def awaiting_sync(self) -> bool:
        return self.sync_future is not None and not self.sync_future.done()


class Group:
    def __init__(self, group_id: str, now_ms: int):
        self.group_id = group_id
        self.state = S.EMPTY
        self.state_ts = now_ms
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol: str | None = None
        self.leader: str | None = None
        self.members: dict[str, Member] = {}
        self.pending_members: set[str] = set()   # got MEMBER_ID_REQUIRED, not joined yet
        self.static: dict[str, str] = {}         # group_instance_id -> member_id
        self.pending_sync: set[str] = set()      # joined this generation, not synced yet
        self.new_member_added = False
        self.initial_delay = False               # join phase held open by the initial delay
        self.storing_generation = -1             # generation whose assignment is being written
        self.persisted = False                   # a group record of it exists in the log
        self.offsets = GroupOffsets()

    def to(self, event: Event, now_ms: int) -> None:
        self.state = transition(self.state, event)
        self.state_ts = now_ms

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if self.leader is None:
            self.leader = member.member_id
        if member.group_instance_id is not None:
            self.static[member.group_instance_id] = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        self.pending_sync.discard(member_id)
        if member.group_instance_id is not None and self.static.get(member.group_instance_id) == member_id:
            del self.static[member.group_instance_id]
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        return member

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join() for m in self.members.values())

    def static_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        if group_instance_id is None:
            return False
        known = self.static.get(group_instance_id)
        return known is not None and known != member_id

    def supports(self, protocol_type: str, names: list[str], member_id: str) -> bool:
        """Can a member with these protocols be in the group? Every other member
        must share at least one protocol with it, and the protocol type must match."""
        if not protocol_type or not names:
            return False
        others = [m for mid, m in self.members.items() if mid != member_id]
        if not others:
            return True
        if protocol_type != self.protocol_type:
            return False
        common = set(names)
        for m in others:
            common &= set(m.protocol_names())
        return bool(common)

    def select_protocol(self) -> str | None:
        """The protocol every member supports that most members prefer."""
        members = list(self.members.values())
        if not members:
            return None
        common = set(members[0].protocol_names())
        for m in members[1:]:
            common &= set(m.protocol_names())
        votes: dict[str, int] = {}
        for m in members:
            first = next((n for n in m.protocol_names() if n in common), None)
            if first is not None:
                votes[first] = votes.get(first, 0) + 1
        if not votes:
            return None
        order = self.members[self.leader].protocol_names() if self.leader in self.members else []
        return max(votes, key=lambda n: (votes[n], -order.index(n) if n in order else -len(order)))

    def max_rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def is_empty(self) -> bool:
        return not self.members and not self.pending_members


@dataclass(slots=True)
class JoinResult:
    error: KafkaError
    member_id: str = ""
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass(slots=True)
class SyncResult:
    error: KafkaError
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(slots=True)
class MemberSummary:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(slots=True)
class GroupSummary:
    group_id: str
    error: KafkaError
    state: str
    protocol_type: str
    protocol: str
    members: list[MemberSummary] = field(default_factory=list)


@dataclass(slots=True)
class FetchedOffset:
    topic: str
    partition: int
    offset: int            # -1 when nothing is committed (or the partition is unstable)
    leader_epoch: int
    metadata: str | None
    error: KafkaError


_WAITING, _SYNCED, _FAILED = 0, 1, 2


class _InFlight:
    """A write appended to the log and not yet applied to memory."""
    __slots__ = ("info", "apply", "fail", "future", "state", "error")

    def __init__(self, info, apply, fail, future, error):
        self.info, self.apply, self.fail, self.future = info, apply, fail, future
        self.state, self.error = _WAITING, error


def _done(value: T) -> "asyncio.Future[T]":
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


def _resolve(fut: asyncio.Future | None, value: Any) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


def _as_committed(value) -> CommittedOffset:
    if isinstance(value, CommittedOffset):
        return CommittedOffset(value.offset, value.leader_epoch, value.metadata)
    offset, *rest = value
    return CommittedOffset(int(offset), *rest[:2])


# --- the coordinator ---------------------------------------------------------------------

class GroupCoordinator:
    """Consumer groups and committed offsets of one broker (it coordinates every group).

    `logs` is the storage LogManager, `flusher` the GroupCommitFlusher (None: no
    fsync wait, for tests), `clock` returns milliseconds (tests pass a fake one and
    drive timeouts with `fire_timers()`; with `run_timers=False` no background task
    fires them).
    """

    def __init__(self, logs, flusher=None, config: GroupConfig | None = None,
                 clock: Callable[[], int] | None = None, *, run_timers: bool = True):
        self.logs = logs
        self.flusher = flusher
        self.config = config or GroupConfig()
        self.clock = clock or wall_clock_ms
        self.timers = Timers(self.clock)
        self._run_timers = run_timers
        self._groups: dict[str, Group] = {}
        self._producer_groups: dict[int, set[str]] = {}   # producer id -> groups with pending offsets
        self._log = None
        self._status = "new"
        self._inflight: deque[_InFlight] = deque()
        self._tasks: set[asyncio.Task] = set()
        self._timer_task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._records_since_compaction = 0

    @classmethod
    def from_broker(cls, broker) -> "GroupCoordinator":
        c = broker.config
        config = GroupConfig(
            initial_rebalance_delay_ms=c.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=c.group_min_session_timeout_ms,
            max_session_timeout_ms=c.group_max_session_timeout_ms,
            offsets_retention_ms=c.offsets_retention_ms,
            compact_records=c.offsets_log_compact_records,
            segment_bytes=c.offsets_log_segment_bytes,
        )
        return cls(broker.logs, broker.flusher, config)

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Open (or create) __consumer_offsets and rebuild every group from it."""
        self._status = "loading"
        self._log = self._open_offsets_log()
        started = time.monotonic()
        self._load()
        log.info("loaded %d groups from %s in %.3fs", len(self._groups),
                 self.config.offsets_topic, time.monotonic() - started)
        self._status = "active"
        self.timers.set("expire-offsets", self.config.offsets_retention_check_interval_ms,
                        self._expire_offsets)
        self.timers.set("compact", self.config.compact_check_interval_ms, self._maybe_compact)
        if self._run_timers:
            self._wake = asyncio.Event()
            self.timers.on_change = self._wake.set
            self._timer_task = asyncio.create_task(self._timer_loop(), name="group-timers")

    async def stop(self) -> None:
        """Finish in-flight writes (briefly), then answer every waiting member
        with NOT_COORDINATOR so it looks for the coordinator again."""
        self._status = "stopped"
        if self._timer_task is not None:
            self._timer_task.cancel()
            await asyncio.gather(self._timer_task, return_exceptions=True)
            self._timer_task = None
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        for group in self._groups.values():
            for m in group.members.values():
                _resolve(m.join_future, JoinResult(KafkaError.NOT_COORDINATOR, m.member_id))
                _resolve(m.sync_future, SyncResult(KafkaError.NOT_COORDINATOR))
        while self._inflight:
            entry = self._inflight.popleft()
            _resolve(entry.future, entry.fail(KafkaError.NOT_COORDINATOR))
        self._groups.clear()
        self._producer_groups.clear()

    async def idle(self) -> None:
        """Wait until every background write has been applied (for tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    def fire_timers(self) -> int:
        """Run the timeouts that are due by the clock (tests call this after
        advancing a fake clock; the timer task calls it in production)."""
        return self.timers.fire_due()

    def _open_offsets_log(self):
        name = self.config.offsets_topic
        plog = self.logs.get(name, 0)
        if plog is not None:
            return plog
        # Committed offsets must never age out of the log: no time or size retention,
        # and "compact", which storage never deletes from (compaction is future work).
        err = self.logs.create_topic(name, 1, {"cleanup.policy": "compact", "retention.ms": "-1",
                                               "retention.bytes": "-1",
                                               "segment.bytes": str(self.config.segment_bytes)},
                                     internal=True)
        if err not in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS):
            raise RuntimeError(f"cannot create {name}: {KafkaError(err).name}")
        plog = self.logs.get(name, 0)
        if plog is None:
            raise RuntimeError(f"{name} partition 0 missing after creation")
        return plog

    async def _timer_loop(self) -> None:
        """Sleep until the next deadline (or until a timer is set), fire what is due.
        Every group timeout depends on this loop, so it logs and carries on after
        any unexpected error instead of dying silently."""
        assert self._wake is not None
        while True:
            try:
                self._wake.clear()
                deadline = self.timers.next_deadline()
                delay = None if deadline is None else (deadline - self.clock()) / 1000
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

    # --- the write path ----------------------------------------------------------------------

    def _write(self, append: Callable[[], Any], apply: Callable[[Any], T],
               fail: Callable[[KafkaError], T],
               storage_error: KafkaError = KafkaError.COORDINATOR_NOT_AVAILABLE) -> "asyncio.Future[T]":
        """Append now; apply (or fail) once durable, in log order. Returns the future
        of what `apply`/`fail` return."""
        fut = asyncio.get_running_loop().create_future()
        try:
            info = append()
        except StorageError as exc:
            log.error("append to %s failed: %s", self.config.offsets_topic, exc)
            fut.set_result(fail(storage_error))
            return fut
        except AppendError as exc:   # producer fencing (ProducerStateError) and the like
            fut.set_result(fail(exc.error))
            return fut
        except ValueError as exc:  # a name that cannot be encoded
            log.warning("refused a group write: %s", exc)
            fut.set_result(fail(KafkaError.INVALID_REQUEST))
            return fut
        entry = _InFlight(info, apply, fail, fut, storage_error)
        self._inflight.append(entry)
        if self.flusher is None or not self.config.sync_writes:
            entry.state = _SYNCED
            self._drain()
        else:
            self._spawn(self._await_durable(entry))
        return fut

    async def _await_durable(self, entry: _InFlight) -> None:
        try:
            await self.flusher.sync(self._log, entry.info.last_offset + 1)
            entry.state = _SYNCED
        except Exception as exc:
            log.error("fsync of %s failed: %s", self.config.offsets_topic, exc)
            entry.state = _FAILED
        self._drain()

    def _drain(self) -> None:
        """Apply finished writes from the head of the queue: log order is apply order."""
        while self._inflight and self._inflight[0].state != _WAITING:
            entry = self._inflight.popleft()
            try:
                if entry.state == _SYNCED:
                    result = entry.apply(entry.info)
                else:
                    result = entry.fail(entry.error)
            except Exception as exc:  # a bug: report it to the waiter, keep draining
                log.exception("applying a group write failed")
                if not entry.future.done():
                    entry.future.set_exception(exc)
                continue
            _resolve(entry.future, result)

    def _append_records(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
                        producer_epoch: int = -1):
        data = rb.build_batch(pairs, timestamp_ms=self.clock(), producer_id=producer_id,
                              producer_epoch=producer_epoch, base_sequence=rb.NO_SEQUENCE,
                              transactional=producer_id >= 0)
        info = self._log.append(data, [(0, rb.parse_header(data))])
        self._records_since_compaction += len(pairs)
        return info

    # --- apply: shared by the live path and the replay ---------------------------------------

    def _group_for(self, group_id: str) -> Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id, self.clock())
        return group

    def _apply_offset(self, group_id: str, tp: TopicPartition, value: CommittedOffset | None,
                      log_offset: int) -> None:
        if value is None:
            group = self._groups.get(group_id)
            if group is not None:
                group.offsets.remove(tp, log_offset)
                self._maybe_forget(group)
            return
        self._group_for(group_id).offsets.put(tp, value._replace(log_offset=log_offset))

    def _apply_pending(self, producer_id: int, group_id: str, tp: TopicPartition,
                       value: CommittedOffset, log_offset: int) -> None:
        self._group_for(group_id).offsets.add_pending(producer_id, tp, value._replace(log_offset=log_offset))
        self._producer_groups.setdefault(producer_id, set()).add(group_id)

    def _apply_marker(self, producer_id: int, commit: bool) -> None:
        for group_id in self._producer_groups.pop(producer_id, ()):
            group = self._groups.get(group_id)
            if group is not None:
                group.offsets.complete(producer_id, commit)
                self._maybe_forget(group)

    def _maybe_forget(self, group: Group) -> None:
        """Drop a group that holds nothing anymore (bounded memory)."""
        if (group.state is S.EMPTY and group.is_empty() and group.offsets.is_empty()
                and not group.persisted and self._current(group)):
            group.to(Event.UNLOAD, self.clock())
            del self._groups[group.group_id]

    def _apply_group_record(self, group_id: str, rec: GroupRecord | None) -> None:
        """Replay of a group snapshot: the group is as the record says."""
        group = self._groups.get(group_id)
        if rec is None:
            if group is not None:
                group.members.clear()
                group.static.clear()
                group.generation, group.protocol, group.leader = 0, None, None
                group.protocol_type, group.persisted = None, False
                group.state = S.EMPTY
                self._maybe_forget(group)
            return
        group = self._group_for(group_id)
        group.generation, group.protocol_type = rec.generation, rec.protocol_type
        group.protocol, group.leader, group.state_ts = rec.protocol, rec.leader, rec.state_ts
        group.persisted = True
        group.members.clear()
        group.static.clear()
        for mr in rec.members:
            protocols = [(rec.protocol, mr.subscription)] if rec.protocol is not None else []
            m = Member(mr.member_id, mr.group_instance_id, mr.client_id, mr.client_host,
                       mr.rebalance_timeout_ms, mr.session_timeout_ms, rec.protocol_type or "", protocols)
            m.assignment = mr.assignment
            group.members[m.member_id] = m
            if m.group_instance_id is not None:
                group.static[m.group_instance_id] = m.member_id
        # Loading is not a transition: the snapshot is Stable when it has members.
        group.state = S.STABLE if group.members else S.EMPTY

    def _load(self) -> None:
        self._records_since_compaction = 0
        for buf, pos, hdr in scan_log(self._log):
            self._records_since_compaction += hdr.record_count
            if hdr.is_control:
                self._apply_marker(hdr.producer_id, rb.control_type(buf, pos) == rb.CONTROL_COMMIT)
                continue
            for rec in rb.iter_records(buf, pos):
                key = decode_key(rec.key)
                if isinstance(key, OffsetKey):
                    tp = (key.topic, key.partition)
                    value = None if rec.value is None else decode_offset_value(rec.value, rec.offset)
                    if hdr.is_transactional:
                        if value is not None:
                            self._apply_pending(hdr.producer_id, key.group, tp, value, rec.offset)
                    else:
                        self._apply_offset(key.group, tp, value, rec.offset)
                elif not hdr.is_transactional:
                    value = None if rec.value is None else decode_group_value(rec.value)
                    self._apply_group_record(key.group, value)
        # Restored members get a full session to find us again.
        for group in self._groups.values():
            for m in group.members.values():
                self._arm_heartbeat(group, m)

    # --- JoinGroup ------------------------------------------------------------------------

    def join_group(self, group_id: str, member_id: str, *, protocol_type: str,
                   protocols: list[tuple[str, bytes]], session_timeout_ms: int,
                   rebalance_timeout_ms: int = -1, group_instance_id: str | None = None,
                   client_id: str = "", client_host: str = "",
                   require_known_member_id: bool = True) -> "asyncio.Future[JoinResult]":
        err = self._ready_error()
        if not err and not group_id:
            err = KafkaError.INVALID_GROUP_ID
        if not err and not (self.config.min_session_timeout_ms <= session_timeout_ms
                            <= self.config.max_session_timeout_ms):
            err = KafkaError.INVALID_SESSION_TIMEOUT
        if err:
            return _done(JoinResult(err, member_id))
        if rebalance_timeout_ms is None or rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms   # JoinGroup v0 has no rebalance timeout
        protocols = [(name, bytes(meta or b"")) for name, meta in protocols]
        group = self._groups.get(group_id)
        if group is None:
            if member_id:
                return _done(JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id))
            group = Group(group_id, self.clock())
        if group.state is S.DEAD:
            return _done(JoinResult(KafkaError.COORDINATOR_NOT_AVAILABLE, member_id))
        if not group.supports(protocol_type, [n for n, _ in protocols], member_id):
            return _done(JoinResult(KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id))
        self._groups.setdefault(group_id, group)
        req = _JoinRequest(group_instance_id, client_id, client_host, session_timeout_ms,
                           rebalance_timeout_ms, protocol_type, protocols)
        if not member_id:
            fut = self._join_new(group, req, require_known_member_id)
        else:
            fut = self._join_known(group, member_id, req)
        if group.state is S.PREPARING_REBALANCE:
            self._try_complete_join(group)
        return fut

    def _join_new(self, group: Group, req: "_JoinRequest", require_known: bool) -> asyncio.Future:
        prefix = req.group_instance_id or req.client_id or "member"
        new_id = f"{prefix}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            return self._join_static(group, new_id, req)
        if require_known:
            # KIP-394: hand out the id first, so a client that times out and retries
            # does not leave a ghost member behind.
            group.pending_members.add(new_id)
            self.timers.set(("hb", group.group_id, new_id), req.session_timeout_ms,
                            lambda: self._expire_pending(group, new_id))
            return _done(JoinResult(KafkaError.MEMBER_ID_REQUIRED, new_id))
        return self._add_member_and_rebalance(group, new_id, req)

    def _join_known(self, group: Group, member_id: str, req: "_JoinRequest") -> asyncio.Future:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            return self._add_member_and_rebalance(group, member_id, req)
        member = group.members.get(member_id)
        if member is None:
            return _done(JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id))
        if group.static_fenced(req.group_instance_id, member_id):
            return _done(JoinResult(KafkaError.FENCED_INSTANCE_ID, member_id))
        state = group.state
        if state is S.PREPARING_REBALANCE:
            return self._update_member_and_rebalance(group, member, req)
        if state is S.COMPLETING_REBALANCE and member.matches(req.protocols):
            # A retried join of this generation: answer again, nothing changed.
            return _done(self._join_result(group, member))
        if state is S.STABLE and member.member_id != group.leader and member.matches(req.protocols):
            return _done(self._join_result(group, member))
        if state in (S.COMPLETING_REBALANCE, S.STABLE):
            return self._update_member_and_rebalance(group, member, req)
        return _done(JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member_id))

    def _join_static(self, group: Group, new_id: str, req: "_JoinRequest") -> asyncio.Future:
        """A static member (group_instance_id) joining without a member id: a new
        instance replaces the old one, fencing it, without a rebalance when nothing
        changed (basic KIP-345)."""
        old_id = group.static.get(req.group_instance_id)
        old = group.members.get(old_id) if old_id is not None else None
        if old is None:
            return self._add_member_and_rebalance(group, new_id, req)
        _resolve(old.join_future, JoinResult(KafkaError.FENCED_INSTANCE_ID, old_id))
        _resolve(old.sync_future, SyncResult(KafkaError.FENCED_INSTANCE_ID))
        old.join_future = old.sync_future = None
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
            self._arm_heartbeat(group, replacement)
            self._store_group_snapshot(group)   # so a restart knows the new id
            return _done(self._join_result(group, replacement))
        return self._update_member_and_rebalance(group, replacement, req)

    def _new_member(self, member_id: str, req: "_JoinRequest") -> Member:
        m = Member(member_id, req.group_instance_id, req.client_id, req.client_host,
                   req.rebalance_timeout_ms, req.session_timeout_ms, req.protocol_type, req.protocols)
        m.joined_at = self.clock()
        return m

    def _add_member_and_rebalance(self, group: Group, member_id: str, req: "_JoinRequest") -> asyncio.Future:
        member = self._new_member(member_id, req)
        member.is_new = True
        if group.state is S.PREPARING_REBALANCE and group.generation == 0:
            group.new_member_added = True   # extends the initial rebalance delay
        group.add(member)
        # Keep our own reference: the join may complete (and clear the member's
        # field) before _maybe_prepare_rebalance returns.
        fut = member.join_future = asyncio.get_running_loop().create_future()
        self._arm_heartbeat(group, member)
        self._maybe_prepare_rebalance(group)
        return fut

    def _update_member_and_rebalance(self, group: Group, member: Member, req: "_JoinRequest") -> asyncio.Future:
        member.protocols = req.protocols
        member.protocol_type = req.protocol_type
        if len(group.members) == 1:
            group.protocol_type = req.protocol_type   # a lone member may switch protocol type
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        # A second join while the first still waits: the first is superseded.
        _resolve(member.join_future, JoinResult(KafkaError.REBALANCE_IN_PROGRESS, member.member_id))
        fut = member.join_future = asyncio.get_running_loop().create_future()
        self._arm_heartbeat(group, member)
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
            self.timers.set(key, delay, lambda: self._initial_delay_over(group, total - delay))
        else:
            group.initial_delay = False
            self.timers.set(key, group.max_rebalance_timeout(), lambda: self._complete_join(group))
            self._try_complete_join(group)

    def _initial_delay_over(self, group: Group, remaining_ms: int) -> None:
        if group.state is not S.PREPARING_REBALANCE or not self._current(group):
            return
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.config.initial_rebalance_delay_ms, remaining_ms)
            self.timers.set(("join", group.group_id), delay,
                            lambda: self._initial_delay_over(group, remaining_ms - delay))
            return
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if group.state is S.PREPARING_REBALANCE and not group.initial_delay and group.all_joined():
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """End of the join phase: drop members that did not rejoin, start the next
        generation and answer every waiting JoinGroup."""
        if group.state is not S.PREPARING_REBALANCE or not self._current(group):
            return
        group.initial_delay = group.new_member_added = False
        self.timers.cancel(("join", group.group_id))
        for m in [m for m in group.members.values() if not m.awaiting_join()]:
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
            fut, m.join_future = m.join_future, None
            m.is_new = False
            _resolve(fut, self._join_result(group, m))
            self._arm_heartbeat(group, m)
        generation = group.generation
        self.timers.set(("sync", group.group_id), group.max_rebalance_timeout(),
                        lambda: self._sync_overdue(group, generation))

    def _reset_assignment(self, group: Group, error: KafkaError) -> None:
        for m in group.members.values():
            m.assignment = b""
            fut, m.sync_future = m.sync_future, None
            _resolve(fut, SyncResult(error))
        group.storing_generation = -1

    def _sync_overdue(self, group: Group, generation: int) -> None:
        """Members that got their JoinGroup answer but never sent SyncGroup within
        the rebalance timeout are removed, so the others are not stuck."""
        if not self._current(group) or group.generation != generation or not group.pending_sync:
            return
        if group.state not in (S.COMPLETING_REBALANCE, S.STABLE):
            return
        for member_id in list(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member_and_update_group(group, member)

    # --- heartbeats and removal ------------------------------------------------------------------

    def _arm_heartbeat(self, group: Group, member: Member) -> None:
        member_id = member.member_id
        self.timers.set(("hb", group.group_id, member_id), member.session_timeout_ms,
                        lambda: self._session_expired(group, member_id))

    def _session_expired(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None or not self._current(group):
            return
        waiting = member.awaiting_join() or member.awaiting_sync()
        too_long_new = member.is_new and self.clock() - member.joined_at >= NEW_MEMBER_JOIN_TIMEOUT_MS
        if waiting and not too_long_new:
            # A member blocked in JoinGroup/SyncGroup cannot heartbeat; the join or
            # sync deadline decides its fate instead.
            self._arm_heartbeat(group, member)
            return
        log.info("member %s of group %s expired", member_id, group.group_id)
        self._remove_member_and_update_group(group, member)

    def _expire_pending(self, group: Group, member_id: str) -> None:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._try_complete_join(group)
            self._maybe_forget(group)

    def _drop_member(self, group: Group, member: Member) -> None:
        _resolve(member.join_future, JoinResult(KafkaError.UNKNOWN_MEMBER_ID, member.member_id))
        _resolve(member.sync_future, SyncResult(KafkaError.UNKNOWN_MEMBER_ID))
        member.join_future = member.sync_future = None
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
        err = self._ready_error()
        if err:
            return err
        if not group_id:
            return KafkaError.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if group.state is S.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if group.static_fenced(group_instance_id, member_id):
            return KafkaError.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return KafkaError.ILLEGAL_GENERATION
        result = HEARTBEAT_RESULT[group.state]
        if result in (KafkaError.NONE, KafkaError.REBALANCE_IN_PROGRESS):
            self._arm_heartbeat(group, member)
        return result

    def sync_group(self, group_id: str, generation: int, member_id: str, *,
                   group_instance_id: str | None = None, protocol_type: str | None = None,
                   protocol_name: str | None = None,
                   assignments: dict[str, bytes] | None = None) -> "asyncio.Future[SyncResult]":
        err = self._ready_error()
        if not err and not group_id:
            err = KafkaError.INVALID_GROUP_ID
        group = self._groups.get(group_id) if not err else None
        if not err:
            err = self._check_sync(group, generation, member_id, group_instance_id,
                                   protocol_type, protocol_name)
        if err:
            return _done(SyncResult(err))
        member = group.members[member_id]
        fixed = SYNC_RESULT[group.state]
        if fixed is not None:
            return _done(SyncResult(fixed))
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self.timers.cancel(("sync", group.group_id))
        self._arm_heartbeat(group, member)
        if group.state is S.STABLE:
            return _done(SyncResult(KafkaError.NONE, member.assignment, group.protocol_type, group.protocol))
        # CompletingRebalance: wait for the leader's assignment to be stored.
        _resolve(member.sync_future, SyncResult(KafkaError.REBALANCE_IN_PROGRESS))
        member.sync_future = asyncio.get_running_loop().create_future()
        fut = member.sync_future
        if member_id == group.leader and group.storing_generation != group.generation:
            self._store_assignment(group, assignments or {})
        return fut

    def _check_sync(self, group: Group | None, generation: int, member_id: str,
                    group_instance_id: str | None, protocol_type: str | None,
                    protocol_name: str | None) -> KafkaError:
        if group is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if group.state is S.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if member_id not in group.members:
            return KafkaError.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return KafkaError.ILLEGAL_GENERATION
        if protocol_type is not None and protocol_type != group.protocol_type:
            return KafkaError.INCONSISTENT_GROUP_PROTOCOL
        if protocol_name is not None and protocol_name != group.protocol:
            return KafkaError.INCONSISTENT_GROUP_PROTOCOL
        if group.static_fenced(group_instance_id, member_id):
            return KafkaError.FENCED_INSTANCE_ID
        return KafkaError.NONE

    def _group_record(self, group: Group, assignments: dict[str, bytes] | None = None) -> GroupRecord:
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
        snapshot = self._group_record(group, full)
        group.storing_generation = generation

        def still_waiting() -> bool:
            return (self._current(group) and group.state is S.COMPLETING_REBALANCE
                    and group.generation == generation)

        def apply(info) -> None:
            group.persisted = True
            if not still_waiting():
                return   # the group moved on meanwhile; its members were answered then
            for mid, m in group.members.items():
                m.assignment = full.get(mid, b"")
            group.to(Event.ASSIGNED, self.clock())
            for m in group.members.values():
                fut, m.sync_future = m.sync_future, None
                _resolve(fut, SyncResult(KafkaError.NONE, m.assignment, group.protocol_type, group.protocol))

        def fail(error: KafkaError) -> None:
            if still_waiting():
                self._reset_assignment(group, error)
                self._prepare_rebalance(group)

        # Encoding happens inside the append so an unencodable name is an error answer.
        self._write(lambda: self._append_records([(group_key(group.group_id), group_value(snapshot))]),
                    apply, fail)

    def _store_group_snapshot(self, group: Group) -> None:
        """Persist generation and members (after a group empties or a static member
        is replaced). Memory already changed: a lost snapshot only means the next
        start sees an older one, whose members then expire."""
        snapshot = self._group_record(group)

        def apply(info) -> None:
            group.persisted = True

        self._write(lambda: self._append_records([(group_key(group.group_id), group_value(snapshot))]),
                    apply, lambda error: None)

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[KafkaError, list[KafkaError]]:
        """(top-level error, one error per leaving (member_id, group_instance_id))."""
        err = self._ready_error()
        if not err and not group_id:
            err = KafkaError.INVALID_GROUP_ID
        if err:
            return err, []
        group = self._groups.get(group_id)
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

    # --- DescribeGroups, ListGroups, DeleteGroups --------------------------------------------------

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupSummary]:
        err = self._ready_error()
        out = []
        for gid in group_ids:
            group = self._groups.get(gid)
            if err:
                out.append(GroupSummary(gid, err, "", "", ""))
            elif group is None:
                out.append(GroupSummary(gid, KafkaError.NONE, S.DEAD.value, "", ""))
            else:
                out.append(self._summary(group))
        return out

    def _summary(self, group: Group) -> GroupSummary:
        stable = group.state is S.STABLE
        members = [MemberSummary(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                 m.metadata(group.protocol) if stable else b"",
                                 m.assignment if stable else b"")
                   for m in group.members.values()]
        return GroupSummary(group.group_id, KafkaError.NONE, group.state.value,
                            group.protocol_type or "", (group.protocol or "") if stable else "", members)

    def list_groups(self, states: Iterable[str] | None = None
                    ) -> tuple[KafkaError, list[tuple[str, str, str]]]:
        """(error, [(group_id, protocol_type, state name)]), filtered by state names
        (case-insensitive) when `states` is non-empty."""
        err = self._ready_error()
        if err:
            return err, []
        wanted = {STATE_BY_NAME.get(s.lower()) for s in states or ()}
        return KafkaError.NONE, [
            (g.group_id, g.protocol_type or "", g.state.value)
            for g in self._groups.values()
            if not wanted or g.state in wanted
        ]

    def delete_groups(self, group_ids: Iterable[str]) -> "asyncio.Future[dict[str, KafkaError]]":
        """Delete empty groups: tombstones for the group and all its offsets."""
        err = self._ready_error()
        results: dict[str, KafkaError] = {}
        doomed: list[Group] = []
        for gid in group_ids:
            group = self._groups.get(gid)
            if err:
                results[gid] = err
            elif not gid:
                results[gid] = KafkaError.INVALID_GROUP_ID
            elif group is None or group.state is S.DEAD:
                results[gid] = KafkaError.GROUP_ID_NOT_FOUND
            elif group.state is not S.EMPTY or not group.is_empty():
                results[gid] = KafkaError.NON_EMPTY_GROUP
            elif group not in doomed:
                doomed.append(group)
        if not doomed:
            return _done(results)
        pairs: list[tuple[bytes, bytes | None]] = []
        plan: list[tuple[Group, list[TopicPartition]]] = []
        for group in doomed:
            tps = list(group.offsets.committed)
            pairs += [(offset_key(group.group_id, t, p), None) for t, p in tps]
            pairs.append((group_key(group.group_id), None))
            plan.append((group, tps))

        def apply(info) -> dict[str, KafkaError]:
            at = info.first_offset
            for group, tps in plan:
                for tp in tps:
                    self._apply_offset(group.group_id, tp, None, at)
                    at += 1
                if group.is_empty() and group.state is S.EMPTY:
                    group.persisted = False
                    self._apply_group_record(group.group_id, None)
                at += 1
                results[group.group_id] = KafkaError.NONE
            return results

        def fail(error: KafkaError) -> dict[str, KafkaError]:
            results.update({g.group_id: error for g in doomed})
            return results

        return self._write(lambda: self._append_records(pairs), apply, fail)

    # --- OffsetCommit / OffsetFetch ------------------------------------------------------------

    def commit_offsets(self, group_id: str, generation: int, member_id: str,
                       offsets: dict[TopicPartition, Any], *,
                       group_instance_id: str | None = None
                       ) -> "asyncio.Future[dict[TopicPartition, KafkaError]]":
        """Commit `{(topic, partition): CommittedOffset(offset, leader_epoch, metadata)}`
        (plain (offset, leader_epoch, metadata) tuples work too). Generation -1 with
        an empty member id commits for a group without members (manual assignment)."""
        err = self._ready_error()
        group = self._groups.get(group_id) if not err else None
        if not err:
            err = self._check_commit(group, generation, member_id, group_instance_id)
        if err:
            return _done({tp: err for tp in offsets})
        if group is not None and member_id in group.members:
            self._arm_heartbeat(group, group.members[member_id])   # a commit is a sign of life
        return self._write_offsets(group_id, offsets, producer_id=-1, producer_epoch=-1)

    def _check_commit(self, group: Group | None, generation: int, member_id: str,
                      group_instance_id: str | None) -> KafkaError:
        if group is None:
            # No such group: only a commit outside group management is meaningful.
            return KafkaError.NONE if generation < 0 else KafkaError.ILLEGAL_GENERATION
        if group.state is S.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if group.static_fenced(group_instance_id, member_id):
            return KafkaError.FENCED_INSTANCE_ID
        if generation < 0 and group.state is S.EMPTY:
            return KafkaError.NONE
        if group.state is S.COMPLETING_REBALANCE:
            return KafkaError.REBALANCE_IN_PROGRESS
        if member_id not in group.members:
            return KafkaError.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return KafkaError.ILLEGAL_GENERATION
        return COMMIT_RESULT[group.state]

    def _write_offsets(self, group_id: str, offsets: dict[TopicPartition, Any], *,
                       producer_id: int, producer_epoch: int):
        results: dict[TopicPartition, KafkaError] = {}
        now = self.clock()
        accepted: list[tuple[TopicPartition, CommittedOffset]] = []
        for tp, raw in offsets.items():
            value = _as_committed(raw)
            meta = value.metadata or ""
            if len(meta.encode("utf-8")) > self.config.max_metadata_bytes:
                results[tp] = KafkaError.OFFSET_METADATA_TOO_LARGE
                continue
            accepted.append(((tp[0], int(tp[1])), value._replace(commit_ts=now)))
        if not accepted:
            return _done(results)
        transactional = producer_id >= 0

        def append():
            pairs = [(offset_key(group_id, t, p), offset_value(v)) for (t, p), v in accepted]
            return self._append_records(pairs, producer_id=producer_id, producer_epoch=producer_epoch)

        def apply(info) -> dict[TopicPartition, KafkaError]:
            for i, (tp, value) in enumerate(accepted):
                if transactional:
                    self._apply_pending(producer_id, group_id, tp, value, info.first_offset + i)
                else:
                    self._apply_offset(group_id, tp, value, info.first_offset + i)
                results[tp] = KafkaError.NONE
            return results

        def fail(error: KafkaError) -> dict[TopicPartition, KafkaError]:
            results.update({tp: error for tp, _ in accepted})
            return results

        return self._write(append, apply, fail)

    def fetch_offsets(self, group_id: str, partitions: list[TopicPartition] | None,
                      require_stable: bool = False) -> tuple[KafkaError, list[FetchedOffset]]:
        """Committed offsets of `partitions` (all committed ones when None). With
        `require_stable`, a partition with a transactional offset still pending
        answers UNSTABLE_OFFSET_COMMIT instead of a possibly stale value."""
        err = self._ready_error()
        if err:
            return err, []
        group = self._groups.get(group_id)
        if partitions is None:
            if group is None:
                return KafkaError.NONE, []
            partitions = list(group.offsets.committed)
        out = []
        for topic, part in partitions:
            tp = (topic, part)
            if group is not None and require_stable and group.offsets.has_pending(tp):
                out.append(FetchedOffset(topic, part, -1, -1, "", KafkaError.UNSTABLE_OFFSET_COMMIT))
                continue
            value = group.offsets.committed.get(tp) if group is not None else None
            if value is None:
                out.append(FetchedOffset(topic, part, -1, -1, "", KafkaError.NONE))
            else:
                out.append(FetchedOffset(topic, part, value.offset, value.leader_epoch,
                                         value.metadata, KafkaError.NONE))
        return KafkaError.NONE, out

    # --- transactional offsets (called by the transaction side) --------------------------------

    def txn_commit_offsets(self, producer_id: int, producer_epoch: int, group_id: str,
                           generation: int, member_id: str, group_instance_id: str | None,
                           offsets: dict[TopicPartition, Any]
                           ) -> "asyncio.Future[dict[TopicPartition, KafkaError]]":
        """TxnOffsetCommit: append a transactional batch of offsets under the
        producer's id/epoch; they stay pending (invisible to OffsetFetch) until
        `complete_txn`. KIP-447: member and generation are checked when given."""
        err = self._ready_error()
        if not err:
            err = self._check_txn_commit(self._groups.get(group_id), generation, member_id,
                                         group_instance_id)
        if err:
            return _done({tp: err for tp in offsets})
        return self._write_offsets(group_id, offsets, producer_id=producer_id,
                                   producer_epoch=producer_epoch)

    def _check_txn_commit(self, group: Group | None, generation: int, member_id: str,
                          group_instance_id: str | None) -> KafkaError:
        if group is None:
            # Treated as a new empty group (generation 0, no members).
            if member_id:
                return KafkaError.UNKNOWN_MEMBER_ID
            return KafkaError.ILLEGAL_GENERATION if generation > 0 else KafkaError.NONE
        if group.state is S.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if group.static_fenced(group_instance_id, member_id):
            return KafkaError.FENCED_INSTANCE_ID
        if member_id and member_id not in group.members:
            return KafkaError.UNKNOWN_MEMBER_ID
        if generation >= 0 and generation != group.generation:
            return KafkaError.ILLEGAL_GENERATION
        return KafkaError.NONE

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     commit: bool) -> "asyncio.Future[KafkaError]":
        """Write the producer's COMMIT/ABORT marker to __consumer_offsets, then make
        its pending offsets committed (or drop them). Storage errors come back as
        KAFKA_STORAGE_ERROR, fencing by storage as its error (INVALID_PRODUCER_EPOCH)."""
        err = self._ready_error()
        if err:
            return _done(err)
        kind = rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT

        def apply(info) -> KafkaError:
            self._apply_marker(producer_id, commit)
            return KafkaError.NONE

        return self._write(
            lambda: self._log.append_control(kind, producer_id, producer_epoch, coordinator_epoch),
            apply, lambda error: error, storage_error=KafkaError.KAFKA_STORAGE_ERROR)

    def has_pending_offsets(self, producer_id: int) -> bool:
        return bool(self._producer_groups.get(producer_id))

    def delete_offsets(self, group_id: str, partitions: list[TopicPartition],
                       subscribed: Callable[[bytes], set[str]]
                       ) -> "asyncio.Future[tuple[KafkaError, dict[TopicPartition, KafkaError]]]":
        """OffsetDelete: tombstones for the committed offsets of `partitions`. As in
        Kafka, a consumer group keeps the offsets of topics its members subscribe to
        (GROUP_SUBSCRIBED_TO_TOPIC); `subscribed` reads the topics out of a member's
        protocol metadata. Decided and appended without an await in between."""
        err = self._ready_error() or (KafkaError.NONE if group_id else KafkaError.INVALID_GROUP_ID)
        group = self._groups.get(group_id) if not err else None
        if not err and (group is None or group.state is S.DEAD):
            err = KafkaError.GROUP_ID_NOT_FOUND
        if not err and group.state is not S.EMPTY and group.protocol_type != "consumer":
            err = KafkaError.NON_EMPTY_GROUP
        if err:
            return _done((err, {}))
        busy: set[str] = set()
        if group.state is not S.EMPTY:
            for member in group.members.values():
                busy |= subscribed(member.metadata(group.protocol))
        results = {tp: KafkaError.GROUP_SUBSCRIBED_TO_TOPIC if tp[0] in busy else KafkaError.NONE
                   for tp in partitions}
        doomed = [tp for tp, e in results.items() if not e and tp in group.offsets.committed]
        if not doomed:
            return _done((KafkaError.NONE, results))

        def apply(info):
            for i, tp in enumerate(doomed):
                self._apply_offset(group_id, tp, None, info.first_offset + i)
            return KafkaError.NONE, results

        def fail(error: KafkaError):
            return error, {}

        pairs = [(offset_key(group_id, t, p), None) for t, p in doomed]
        return self._write(lambda: self._append_records(pairs), apply, fail)

    # --- retention of offsets of empty groups ----------------------------------------------------

    def _expire_offsets(self) -> None:
        """Tombstone offsets of empty groups older than the retention, and forget
        groups left with nothing, so memory stays bounded."""
        self.timers.set("expire-offsets", self.config.offsets_retention_check_interval_ms,
                        self._expire_offsets)
        if self._ready_error():
            return
        now = self.clock()
        plan: list[tuple[Group, list[TopicPartition], bool]] = []
        for group in list(self._groups.values()):
            if group.state is not S.EMPTY or not group.is_empty() or group.offsets.pending:
                continue
            since = group.state_ts if group.protocol_type else None
            expired = group.offsets.expired(now, self.config.offsets_retention_ms, since)
            drop = len(expired) == len(group.offsets.committed)
            if drop and not group.persisted and not expired:
                self._maybe_forget(group)   # nothing in the log to tombstone
                continue
            if expired or drop:
                plan.append((group, expired, drop))
        for chunk in _chunks(plan, MAX_RECORDS_PER_BATCH):
            self._write_expiry(chunk)

    def _maybe_compact(self) -> None:
        """Compaction by rewrite, so start-up replay follows the live state, not the
        history: append every group record and committed offset as they stand, and
        once that is durable (applied in log order, like any write) drop the
        segments entirely before it.

        Only at a quiet moment: no write in flight (memory is then exactly what the
        log says), and no pending transactional offsets — their values win over a
        committed one by log position, so they must never sit behind a rewrite."""
        self.timers.set("compact", self.config.compact_check_interval_ms, self._maybe_compact)
        live = sum(len(g.offsets.committed) + 1 for g in self._groups.values())
        if self._ready_error() or self._records_since_compaction < max(self.config.compact_records, 4 * live):
            return
        if self._inflight or self._producer_groups or any(g.offsets.pending for g in self._groups.values()):
            return
        start = self._log.log_end_offset
        pairs: list[tuple[bytes, bytes | None]] = []
        rewritten: list[tuple[Group, TopicPartition | None, Any]] = []   # in record order
        for group in self._groups.values():
            if group.persisted:
                pairs.append((group_key(group.group_id), group_value(self._group_record(group))))
                rewritten.append((group, None, None))
            for (t, p), v in group.offsets.committed.items():
                pairs.append((offset_key(group.group_id, t, p), offset_value(v)))
                rewritten.append((group, (t, p), v))
        if not pairs:
            return

        def apply(info) -> None:
            # The rewritten values now sit at new log positions, as a replay will see them.
            for at, (group, tp, value) in enumerate(rewritten, start=info.first_offset):
                if tp is not None and group.offsets.committed.get(tp) is value:
                    group.offsets.committed[tp] = value._replace(log_offset=at)
            try:
                dropped = self._log.delete_segments_before(start)
            except StorageError as exc:   # nothing lost: the old segments simply stay
                log.warning("compacting %s failed: %s", self.config.offsets_topic, exc)
                return
            self._records_since_compaction = len(pairs)
            log.info("compacted %s: %d record(s) rewritten at offset %d, %d old segment(s) dropped",
                     self.config.offsets_topic, len(pairs), start, dropped)

        self._write(lambda: self._append_records(pairs), apply, lambda error: None)

    def _write_expiry(self, plan: list[tuple[Group, list[TopicPartition], bool]]) -> None:
        pairs: list[tuple[bytes, bytes | None]] = []
        for group, tps, drop in plan:
            pairs += [(offset_key(group.group_id, t, p), None) for t, p in tps]
            if drop:
                pairs.append((group_key(group.group_id), None))

        def apply(info) -> None:
            at = info.first_offset
            for group, tps, drop in plan:
                for tp in tps:
                    self._apply_offset(group.group_id, tp, None, at)
                    at += 1
                if drop:
                    if group.state is S.EMPTY and group.is_empty():
                        self._apply_group_record(group.group_id, None)
                    at += 1

        self._write(lambda: self._append_records(pairs), apply, lambda error: None)


def _chunks(plan, limit: int):
    chunk, size = [], 0
    for item in plan:
        n = len(item[1]) + 1
        if chunk and size + n > limit:
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += n
    if chunk:
        yield chunk


@dataclass(slots=True)
class _JoinRequest:
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]


__all__ = [
    "GroupCoordinator", "GroupConfig", "JoinResult", "SyncResult", "GroupSummary", "MemberSummary",
    "FetchedOffset", "CommittedOffset", "Timers", "OFFSETS_TOPIC", "OffsetsLogError",
]
