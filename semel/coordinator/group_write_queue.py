"""The group coordinator's writes to __consumer_offsets, through the shared
coordinator log (coordinator_log): appended at once (so log order is the order
requests were handled), fsynced, applied (or failed) strictly in log order."""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, TypeVar

from ..protocol import records as rb
from ..protocol.errors import KafkaError
from ..storage.types import AppendInfo
from .coordinator_log import CoordinatorLog, InFlightWrite

T = TypeVar("T")


class GroupWrites:
    """The write path of one group coordinator: its CoordinatorLog, and the clock that
    stamps its record batches."""

    def __init__(self, clog: CoordinatorLog, clock: Callable[[], int]) -> None:
        self._clog = clog
        self._clock = clock

    def write(self, append: Callable[[], Any], apply: Callable[[Any], T], fail: Callable[[KafkaError], T],
              storage_error: KafkaError = KafkaError.COORDINATOR_NOT_AVAILABLE, *,
              unsynced: Callable[[KafkaError], T] | None = None) -> "asyncio.Future[T]":
        """Append now; apply (or fail) once durable, in log order. A failed fsync
        fails the write (`unsynced`, when given, answers it instead): memory stays
        as it was."""
        return self._clog.write(append, apply, fail, storage_error, unsynced=unsynced)

    def batch(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
              producer_epoch: int = -1) -> bytes:
        return rb.build_batch(pairs, timestamp_ms=self._clock(), producer_id=producer_id,
                              producer_epoch=producer_epoch, base_sequence=rb.NO_SEQUENCE,
                              transactional=producer_id >= 0)

    def append_records(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
                       producer_epoch: int = -1) -> AppendInfo:
        return self._clog.append(self.batch(pairs, producer_id=producer_id, producer_epoch=producer_epoch))

    def append_control(self, kind: int, producer_id: int, producer_epoch: int, coordinator_epoch: int) -> Any:
        """A transaction marker in __consumer_offsets (the offsets a transaction committed)."""
        return self._clog.loaded().append_control(kind, producer_id, producer_epoch, coordinator_epoch)

    def rewrite(self, data: bytes, live_records: int, apply: Callable[[Any], None] | None = None
                ) -> "asyncio.Future[bool]":
        """Compaction by rewrite (CoordinatorLog.rewrite)."""
        return self._clog.rewrite(data, live_records, apply)

    @property
    def records_since_compaction(self) -> int:
        return self._clog.records_since_compaction

    @property
    def inflight(self) -> deque[InFlightWrite]:
        """Writes appended whose apply still waits for their fsync."""
        return self._clog.inflight
