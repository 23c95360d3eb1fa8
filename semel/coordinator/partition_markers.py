"""Transaction markers written into a partition this broker leads.

Writing a marker needs no coordinator state: the data log, one append, and the wait
until the marker is committed (semel.storage.committed: fsynced, then past the high
watermark, as Kafka writes markers with acks=all: a transaction is complete only once
every in-sync replica holds its marker, or a new leader would keep it open). One
`PartitionMarkers` per broker serves both of its writers: the completion of this
broker's transaction coordinators (semel.coordinator.txn_completion) and
WriteTxnMarkers from a coordinator on another broker (semel.broker.handlers.txn_admin).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..storage.committed import Committed
from ..storage.log import PartitionLog


class DataLogs(Protocol):
    """The broker's partition logs (storage.manager.LogManager), as markers need them."""

    def get(self, topic: str, partition: int) -> PartitionLog | None: ...


class PartitionMarkers:
    """`committed` is what a marker waits on before it counts; `on_marker` is told of
    every partition a marker was written to (the readers' notifier)."""

    def __init__(self, logs: DataLogs, committed: Committed,
                 on_marker: Callable[[str, int], None] = lambda topic, partition: None) -> None:
        self._logs = logs
        self._committed = committed
        self._on_marker = on_marker

    async def write(self, tp: tuple[str, int], kind: int, producers: list[tuple[int, int]],
                    coordinator_epoch: int) -> None:
        """The markers of `producers` into this broker's log of tp (its leader), in one
        append, returning once they are committed. AppendError when refused or not
        replicated in time."""
        plog = self._logs.get(*tp)
        if plog is None:  # the topic was deleted: nothing left to mark
            return
        info = plog.append_controls(kind, producers, coordinator_epoch)
        await self._committed.wait(*tp, plog, info.last_offset + 1, info.fsync_stamp)
        self._on_marker(*tp)
