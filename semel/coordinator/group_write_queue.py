"""The durable write queue of the group coordinator: every change to durable
state is appended to __consumer_offsets at once (so log order is the order
requests were handled), waits for the group-committed fsync, and is applied
(or failed) strictly in log order."""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, TypeVar

from ..protocol import records as rb
from ..protocol.errors import KafkaError
from ..storage.errors import AppendError, StorageError

log = logging.getLogger("semel.coordinator.group")

T = TypeVar("T")

_WAITING, _SYNCED, _FAILED = 0, 1, 2


class InFlightWrite:
    """A write appended to the log and not yet applied to memory."""
    __slots__ = ("info", "apply", "fail", "future", "state", "error")

    def __init__(self, info, apply, fail, future, error):
        self.info, self.apply, self.fail, self.future = info, apply, fail, future
        self.state, self.error = _WAITING, error


def done_future(value: T) -> "asyncio.Future[T]":
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(value)
    return fut


def resolve_future(fut: asyncio.Future | None, value: Any) -> None:
    if fut is not None and not fut.done():
        fut.set_result(value)


class GroupWriteQueue:
    """Mixin of GroupCoordinator: the write path (uses self._log, self.flusher,
    self.config, self.clock, self._inflight, self._spawn)."""

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
        entry = InFlightWrite(info, apply, fail, fut, storage_error)
        self._inflight.append(entry)
        if self.flusher is None or not self.config.sync_writes:
            entry.state = _SYNCED
            self._drain()
        else:
            self._spawn(self._await_durable(entry))
        return fut

    async def _await_durable(self, entry: InFlightWrite) -> None:
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
            resolve_future(entry.future, result)

    def _append_records(self, pairs: list[tuple[bytes, bytes | None]], *, producer_id: int = -1,
                        producer_epoch: int = -1):
        data = rb.build_batch(pairs, timestamp_ms=self.clock(), producer_id=producer_id,
                              producer_epoch=producer_epoch, base_sequence=rb.NO_SEQUENCE,
                              transactional=producer_id >= 0)
        info = self._log.append(data, [(0, rb.parse_header(data))])
        self._records_since_compaction += len(pairs)
        return info
