"""Committed: the one rule for when an append counts as done.

A record is committed once it is on this broker's disk as asked (`fsync`, a
GroupCommitFlusher; None: nothing asks for an fsync) and the partition's high watermark
has passed it, so every in-sync replica holds it. Produce with acks=all, a
coordinator's own log and transaction markers all wait through `Committed`, on a
single node as in a cluster; what differs is only where the high watermark comes from
(`HighWatermarks`): the replica manager in a cluster (semel.cluster.replica_manager),
`OneNode` below on a single node, a cluster of one. There this broker is the whole ISR,
so what is fsynced here is committed and the wait returns at once. Under flush_mode
"always" a broker counts only its fsynced records as its own (PartitionLog.durable_end),
alone or in an ISR, so readers, bounded by the high watermark, see nothing a power cut
could take.

The fsync comes first, then the high-watermark wait: followers fetch from the page cache
meanwhile, and the leader's finished fsync (`flushed`) may itself move the watermark.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Protocol, runtime_checkable

from ..protocol.errors import KafkaError
from .errors import AppendError
from .flusher import Begun, GroupCommitFlusher
from .log import PartitionLog

log = logging.getLogger("semel.storage.committed")

# One partition of a commit: (topic, partition, its log, one past the last offset to commit,
# the AppendInfo.fsync_stamp of that append or None).
Target = tuple[str, int, PartitionLog, int, int | None]


@runtime_checkable
class HighWatermarks(Protocol):
    async def wait_for_hw(self, topic: str, partition: int, upto_offset: int, timeout_s: float) -> KafkaError:
        """NONE once the partition's high watermark reached `upto_offset` (every in-sync
        replica holds what is before it); the reason otherwise."""

    def flushed(self, topic: str, partition: int) -> None:
        """This broker's fsync of the partition completed: its high watermark may move."""

    def reached(self, topic: str, partition: int, upto_offset: int) -> bool:
        """Would `wait_for_hw` answer NONE now, without waiting?"""


class OneNode:
    """The high watermark of a single node, a cluster of one: every partition's ISR is
    this broker, so a record fsynced as asked is committed (the wait returns at once),
    and an fsync moves what readers may see (`notify` wakes them)."""

    def __init__(self, notify: Callable[[str, int], None]):
        self.notify = notify

    async def wait_for_hw(self, topic: str, partition: int, upto_offset: int, timeout_s: float) -> KafkaError:
        return KafkaError.NONE

    def flushed(self, topic: str, partition: int) -> None:
        self.notify(topic, partition)

    def reached(self, topic: str, partition: int, upto_offset: int) -> bool:
        return True


class Committed:
    """Waits until appends are committed: fsynced here (by `fsync`, None: no fsync asked
    for), then past the high watermark of `high_watermarks()` within `timeout_s`. While
    that is None (replication not running yet) nothing is committed: `unavailable`
    (NOT_COORDINATOR for a coordinator's log: the client looks for it again)."""

    def __init__(self, fsync: GroupCommitFlusher | None, high_watermarks: Callable[[], HighWatermarks | None],
                 timeout_s: float, unavailable: KafkaError = KafkaError.NOT_LEADER_OR_FOLLOWER):
        self.fsync = fsync
        self.high_watermarks = high_watermarks
        self.timeout_s = timeout_s
        self.unavailable = unavailable

    async def wait(self, topic: str, partition: int, plog: PartitionLog, upto: int,
                   stamp: int | None = None) -> None:
        """Return once plog's records before `upto` are committed. StorageError when the
        fsync failed, AppendError with the reason when the high watermark did not get there.
        `stamp`: the append's AppendInfo.fsync_stamp (GroupCommitFlusher.sync)."""
        if self.fsync is not None:
            await self.fsync.sync(plog, upto, stamp=stamp)
        err = await self._replicated(topic, partition, plog, upto, self.timeout_s)
        if err:
            raise AppendError(err, f"{topic}-{partition} up to {upto} not committed: {err.name}")

    def begin(self, targets: list[Target]) -> Begun | None:
        """Start the fsyncs `targets` need now (GroupCommitFlusher.start_each), for a
        wait_each that comes later; None when no fsync is asked for."""
        return None if self.fsync is None else self.fsync.start_each(_logs(targets))

    async def wait_each(self, targets: list[Target], timeout_s: float | None = None,
                        begun: Begun | None = None) -> list[KafkaError]:
        """`wait` for several partitions, the error of each as a value (NONE: committed):
        their fsyncs in flight together (GroupCommitFlusher.sync_each, no task per
        partition; `begun`: the rounds begin() started for them), then each
        high-watermark wait, all within one `timeout_s`."""
        failures = (await self.fsync.sync_each(_logs(targets), begun, [t[4] for t in targets])
                    if self.fsync is not None else [None] * len(targets))
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        out = []
        for (topic, partition, plog, upto, _), exc in zip(targets, failures):
            if exc is not None:
                log.error("fsync of %s-%d failed: %s", topic, partition, exc)
                out.append(exc.error)
            else:
                out.append(await self._replicated(topic, partition, plog, upto,
                                                  max(deadline - time.monotonic(), 0.0)))
        return out

    def already(self, targets: list[Target]) -> bool:
        """Is every target committed now (fsynced as asked and past the high watermark)?
        A large append is fsynced by its own write (write-through,
        PartitionLog.append_async), so most single-node Produce requests are answered
        without waiting at all."""
        hws = self.high_watermarks()
        return hws is not None and all(
            (self.fsync is None or (plog.flushed_offset >= min(upto, plog.log_end_offset)
                                    and (stamp is None or not plog.fsync_repair.lost(stamp, upto))))
            and hws.reached(topic, partition, upto) for topic, partition, plog, upto, stamp in targets)

    def writer(self, topic: str, partition: int) -> "PartitionCommit":
        """The PartitionWriter of one partition's log (a coordinator's)."""
        return PartitionCommit(self, topic, partition)

    async def _replicated(self, topic: str, partition: int, plog: PartitionLog, upto: int,
                          timeout_s: float) -> KafkaError:
        hws = self.high_watermarks()
        if hws is None:
            return self.unavailable
        if self.fsync is not None:
            hws.flushed(topic, partition)
        return await hws.wait_for_hw(topic, partition, min(upto, plog.log_end_offset), timeout_s)


def _logs(targets: list[Target]) -> list[tuple[PartitionLog, int]]:
    return [(plog, upto) for _, _, plog, upto, _ in targets]


class PartitionCommit:
    """`Committed` for one partition, as a coordinator's PartitionWriter (`sync`)."""

    def __init__(self, committed: Committed, topic: str, partition: int):
        self.committed = committed
        self.topic, self.partition = topic, partition

    async def sync(self, plog: PartitionLog, upto_offset: int, stamp: int | None = None) -> None:
        await self.committed.wait(self.topic, self.partition, plog, upto_offset, stamp)
