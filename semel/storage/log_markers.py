"""Transaction markers written into a partition log: COMMIT or ABORT control batches
that end producers' transactions here.

A MarkerAppends works on one PartitionLog (semel.storage.log), given to it as a
MarkedLog: the members below are all it touches. Markers are fenced like data (an
older producer or coordinator epoch is refused) and an abort is recorded in the
active segment's aborted-transaction index.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from semel.protocol.errors import KafkaError
from semel.protocol.records import CONTROL_ABORT, CONTROL_COMMIT, BatchHeader, build_control_batch, split_batches

from ..clock import wall_ms
from .errors import ProducerStateError
from .log_loader import index_abort
from .producer_state import ProducerStateManager
from .segment import Segment
from .types import AppendInfo
from .write_offload import Payload, Placed


class MarkedLog(Protocol):
    """What MarkerAppends needs of its log (PartitionLog)."""
    producers: ProducerStateManager
    segments: list[Segment]

    def check_writable(self) -> None: ...

    def check_leading(self) -> None: ...

    def write_batches(self, data: Payload, batches: list[tuple[int, BatchHeader]],
                      on_success: Callable[[list[Placed]], None] | None = None, assign: bool = True) -> AppendInfo: ...


class MarkerAppends:
    """The markers of one log."""

    def __init__(self, log: MarkedLog) -> None:
        self._log = log

    def append_controls(self, kind: int, producers: list[tuple[int, int]], coordinator_epoch: int,
                        *, timestamp_ms: int | None = None) -> AppendInfo:
        """One marker of `kind` (COMMIT 1, ABORT 0) for each (producer id, epoch), all in
        one write: the transactions they end stop holding back the last stable offset at
        the same instant, so a read_committed reader sees all of them committed or none
        (the branches of one Spark micro-batch). All or nothing: one refused marker
        refuses the write. Fenced like data: an epoch below the producer's current one
        raises ProducerStateError(INVALID_PRODUCER_EPOCH); so does an older coordinator
        epoch (TRANSACTION_COORDINATOR_FENCED)."""
        if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
            raise ValueError(f"control kind must be 0 (abort) or 1 (commit), not {kind!r}")
        producers = list(dict.fromkeys(producers))
        if not producers or any(pid < 0 for pid, _ in producers):
            raise ValueError("a transaction marker needs a producer id")
        plog = self._log
        plog.check_writable()
        plog.check_leading()
        for producer_id, producer_epoch in producers:
            err = plog.producers.check_marker(producer_id, producer_epoch, coordinator_epoch)
            if err is not KafkaError.NONE:
                raise ProducerStateError(err, f"{err.name}: marker for producer {producer_id} refused")
        ts = wall_ms() if timestamp_ms is None else timestamp_ms
        data = b"".join(build_control_batch(kind, producer_id=pid, producer_epoch=epoch,
                                            coordinator_epoch=coordinator_epoch, timestamp_ms=ts)
                        for pid, epoch in producers)
        batches, _ = split_batches(data)

        def apply(placed: list[Placed]) -> None:
            for (producer_id, producer_epoch), (_, marker, _) in zip(producers, placed):
                first = plog.producers.complete_txn(producer_id, producer_epoch, coordinator_epoch, ts)
                if kind == CONTROL_ABORT and first is not None:
                    index_abort(plog.producers, plog.segments[-1], producer_id, first, marker)
        return plog.write_batches(data, batches, on_success=apply)
