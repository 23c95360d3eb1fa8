"""The group coordinator's writes to __consumer_offsets, through the shared
coordinator log (coordinator_log): appended at once (so log order is the order
requests were handled), fsynced, applied (or failed) strictly in log order."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, TypeVar

from ..protocol import records as rb
from ..protocol.errors import KafkaError

T = TypeVar("T")


class GroupWriteQueue:
    """Mixin of GroupCoordinator: the write path (uses self._clog, self.clock)."""

    def _write(self, append: Callable[[], Any], apply: Callable[[Any], T],
               fail: Callable[[KafkaError], T],
               storage_error: KafkaError = KafkaError.COORDINATOR_NOT_AVAILABLE) -> "asyncio.Future[T]":
        """Append now; apply (or fail) once durable, in log order. A failed fsync
        fails the write: memory stays as it was."""
        return self._clog.write(append, apply, fail, storage_error)

    def _batch(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
               producer_epoch: int = -1) -> bytes:
        return rb.build_batch(pairs, timestamp_ms=self.clock(), producer_id=producer_id,
                              producer_epoch=producer_epoch, base_sequence=rb.NO_SEQUENCE,
                              transactional=producer_id >= 0)

    def _append_records(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
                        producer_epoch: int = -1):
        return self._clog.append(self._batch(pairs, producer_id=producer_id, producer_epoch=producer_epoch))

    @property
    def _inflight(self):
        return self._clog.inflight
