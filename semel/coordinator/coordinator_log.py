"""The coordinator log, shared by the transaction and group coordinators.

Every transition of coordinator state takes the same path:

  append the transition record now (synchronously, so log order is the order
  requests were decided in)  ->  wait for its commit point through the partition's
  writer (semel.storage.committed: fsynced, then past the high watermark)
  ->  apply it to memory (or fail it) strictly in log order.

Each coordinator partition's runtime (coordinator.runtime) owns one; the runtime's
load replays the log through the coordinator's own apply functions, so memory is the
replay of the log. Compaction is a rewrite: append every live
record as it stands and, once that is applied like any write, drop the
segments entirely before it.

What happens when a record reached the log but its fsync failed is the
caller's choice (`unsynced`): the group coordinator answers with an error and
leaves memory as it was; the runtime's `write` (the transaction coordinator's
path) replays it, so memory follows the log. A record the log cuts back after the
failed fsync (single node, storage.fsync_repair) is not in the log any more: it is
answered by `fail`, as one that never reached it.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Callable, TypeVar

from ..protocol import records as rb
from ..protocol.errors import KafkaError
from ..storage.errors import AppendError, StorageError
from ..storage.log import PartitionLog
from ..storage.types import AppendInfo
from .ports import PartitionWriter

log = logging.getLogger("semel.coordinator.log")

T = TypeVar("T")

_WAITING, _SYNCED, _FAILED = 0, 1, 2

# Why a durability wait fails when this broker stops leading the coordinator's partition
# (a reassignment, a controlled shutdown, an election). The coordinator that takes the
# partition over answers the clients, so such a record left unanswered here is an
# expected hand-over, not a fault.
HAND_OVER_ERRORS = frozenset({KafkaError.NOT_LEADER_OR_FOLLOWER, KafkaError.NOT_COORDINATOR,
                              KafkaError.FENCED_LEADER_EPOCH})


def sync_failure_level(exc: BaseException) -> int:
    """The log level of a failed durability wait: INFO for a hand-over of the partition,
    ERROR for anything else (the disk failed, too few in-sync replicas, a timeout)."""
    if isinstance(exc, AppendError) and not isinstance(exc, StorageError) and exc.error in HAND_OVER_ERRORS:
        return logging.INFO
    return logging.ERROR


class InFlightWrite:
    """A record appended to the log and not yet applied to memory."""
    __slots__ = ("info", "apply", "fail", "unsynced", "future", "state", "error", "failure_level", "cut")

    def __init__(self, info: Any, apply: Callable[[Any], object], fail: Callable[[KafkaError], object],
                 unsynced: Callable[[KafkaError], object], future: asyncio.Future[Any], error: KafkaError):
        self.info, self.apply, self.fail, self.future = info, apply, fail, future
        self.unsynced = unsynced
        self.state, self.error = _WAITING, error
        self.failure_level = logging.ERROR
        self.cut = False    # its fsync failed and the log cuts it back: memory must not follow it


def done_future(value: T) -> "asyncio.Future[T]":
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


def resolve_future(fut: asyncio.Future[T] | None, value: T) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


class CoordinatorLog:
    """Append -> fsync -> apply in log order, on one coordinator partition.

    `spawn` runs the background fsync waits (the coordinator owns its tasks, so
    it can wait for or cancel them); `plog` is set once the coordinator opened
    its partition."""

    def __init__(self, topic: str, writer: PartitionWriter | None, spawn: Callable[[Any], Any], *,
                 sync_writes: bool = True, clock: Callable[[], int] | None = None):
        self.topic = topic
        # Stamps the record batches `batch` builds (None: the wall clock).
        self._clock = clock
        # What waits for a record's commit point (None: the coordinator's own tests
        # write without one, and a write counts at once).
        self.writer = writer
        self.sync_writes = sync_writes
        self._spawn = spawn
        self.plog: PartitionLog | None = None
        self.inflight: deque[InFlightWrite] = deque()
        self.records_since_compaction = 0
        # While an `unsynced` callback runs: the level its own line about the failure takes.
        self.failure_level = logging.ERROR

    def loaded(self) -> PartitionLog:
        """The partition log, once the coordinator opened it (RuntimeError before)."""
        if self.plog is None:
            raise RuntimeError(f"{self.topic}: no partition log loaded")
        return self.plog

    def append(self, data: bytes) -> AppendInfo:
        """Append well-formed batches (built by the coordinator) now; returns the append info."""
        batches, _ = rb.split_batches(data)
        info = self.loaded().append(data, batches)
        self.records_since_compaction += sum(hdr.record_count for _, hdr in batches)
        return info

    def batch(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
              producer_epoch: int = -1) -> bytes:
        """One batch of `pairs` (key, value; None a tombstone), transactional when a
        producer id is given."""
        return rb.build_batch(pairs, timestamp_ms=None if self._clock is None else self._clock(),
                              producer_id=producer_id, producer_epoch=producer_epoch,
                              base_sequence=rb.NO_SEQUENCE, transactional=producer_id >= 0)

    def append_records(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
                       producer_epoch: int = -1) -> AppendInfo:
        return self.append(self.batch(pairs, producer_id=producer_id, producer_epoch=producer_epoch))

    def append_control(self, kind: int, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> Any:
        """A transaction marker in this log (the group coordinator's: the offsets a
        transaction committed)."""
        return self.loaded().append_control(kind, producer_id, producer_epoch, coordinator_epoch)

    def write(self, append: Callable[[], Any], apply: Callable[[Any], T],
              fail: Callable[[KafkaError], T],
              storage_error: KafkaError = KafkaError.COORDINATOR_NOT_AVAILABLE, *,
              unsynced: Callable[[KafkaError], T] | None = None,
              durable: bool = True) -> "asyncio.Future[T]":
        """Append now; apply (or fail) once durable, in log order. Returns the future
        of what `apply`/`fail`/`unsynced` return. `fail` answers a record that never
        reached the log, `unsynced` (default `fail`) one whose fsync failed."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        try:
            info = append()
        except StorageError as exc:
            log.error("append to %s failed: %s", self.topic, exc)
            fut.set_result(fail(storage_error))
            return fut
        except AppendError as exc:   # producer fencing (ProducerStateError) and the like
            fut.set_result(fail(exc.error))
            return fut
        except ValueError as exc:  # a name that cannot be encoded
            log.warning("refused a write to %s: %s", self.topic, exc)
            fut.set_result(fail(KafkaError.INVALID_REQUEST))
            return fut
        entry = InFlightWrite(info, apply, fail, unsynced or fail, fut, storage_error)
        self.inflight.append(entry)
        if not durable or self.writer is None or not self.sync_writes:
            entry.state = _SYNCED
            self._drain()
        else:
            self._spawn(self._await_durable(entry, self.writer, self.loaded()))
        return fut

    async def durable(self) -> None:
        """Wait until the whole log is durable (fsynced and replicated); at once where
        the coordinator writes without a writer."""
        own = self.loaded()
        if self.writer is not None:
            await self.writer.sync(own, own.log_end_offset)

    async def _await_durable(self, entry: InFlightWrite, writer: PartitionWriter, plog: PartitionLog) -> None:
        try:
            await writer.sync(plog, entry.info.last_offset + 1, stamp=entry.info.fsync_stamp)
            entry.state = _SYNCED
        except Exception as exc:
            entry.failure_level = sync_failure_level(exc)
            stamp = entry.info.fsync_stamp
            entry.cut = stamp is not None and plog.fsync_repair.lost(stamp, entry.info.last_offset + 1)
            if entry.failure_level == logging.INFO:
                log.info("%s: a write stays unanswered here, its partition moved to another broker: %s",
                         self.topic, exc)
            else:
                log.error("fsync of %s failed: %s", self.topic, exc)
            entry.state = _FAILED
        self._drain()

    def _drain(self) -> None:
        """Apply finished writes from the head of the queue: log order is apply order."""
        while self.inflight and self.inflight[0].state != _WAITING:
            entry = self.inflight.popleft()
            try:
                if entry.state == _SYNCED:
                    result = entry.apply(entry.info)
                else:
                    self.failure_level = entry.failure_level
                    result = (entry.fail if entry.cut else entry.unsynced)(entry.error)
            except Exception as exc:  # a bug: report it to the waiter, keep draining
                log.exception("applying a write to %s failed", self.topic)
                if not entry.future.done():
                    entry.future.set_exception(exc)
                continue
            resolve_future(entry.future, result)

    def fail_all(self, error: KafkaError) -> None:
        """Answer every write still waiting (the coordinator is stopping)."""
        while self.inflight:
            entry = self.inflight.popleft()
            resolve_future(entry.future, entry.fail(error))

    def rewrite(self, data: bytes, live_records: int,
                apply: Callable[[Any], None] | None = None) -> "asyncio.Future[bool]":
        """Compaction by rewrite: append `data` (every live record as it stands);
        once it is applied in log order (`apply` moves memory to the new
        positions), drop the segments entirely before it. Only call at a quiet
        moment (no write in flight), so memory is exactly what the log says."""
        plog = self.loaded()
        start = plog.log_end_offset

        def done(info: AppendInfo | None) -> bool:
            if apply is not None and info is not None:
                apply(info)
            try:
                dropped = plog.delete_segments_before(start)
            except StorageError as exc:   # nothing lost: the old segments simply stay
                log.warning("compacting %s failed: %s", self.topic, exc)
                return False
            self.records_since_compaction = live_records
            log.info("compacted %s: %d record(s) rewritten at offset %d, %d old segment(s) dropped",
                     self.topic, live_records, start, dropped)
            return True

        if not data:
            return done_future(done(None))
        return self.write(lambda: self.append(data), done, lambda error: False)
