"""Completing a logged decision: markers on every partition, then the Complete record.

A PrepareCommit/PrepareAbort record is the decision: once it is on disk the markers
are written to every partition of the transaction (retried until they succeed, also
after a crash) and a Complete record closes the transaction. Markers are written only
once the decision is durable.

A MarkerCompletion belongs to one TransactionCoordinator (semel.coordinator.txn): it
is given the coordinator as a CompletingCoordinator (its shard, which decides each
record, and `commit`, the write path), the coordinator's own log, and what markers go
through (the broker's PartitionMarkers for partitions led here, the MarkerWriter for
those led elsewhere, the group coordinators). Only the markers are written here; every
record is an op of the shard.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Coroutine
from typing import Any, Protocol

from ..backoff import Backoff, FailureLog
from ..protocol import records
from ..protocol.errors import KafkaError
from ..storage.errors import AppendError, StorageError
from .coordinator_log import CoordinatorLog
from .group_model import OFFSETS_TOPIC
from .partition_markers import PartitionMarkers
from .ports import MarkerWriter
from .txn_branches import branch_of
from .txn_shard import TxnOp, TxnShard
from .txn_states import COMPLETE_OF, PREPARED, TxnMeta, TxnState

log = logging.getLogger("semel.txn")

TopicPartition = tuple[str, int]


class CompletingCoordinator(Protocol):
    """What MarkerCompletion needs of its transaction coordinator."""
    shard: TxnShard

    @property
    def coordinator_epoch(self) -> int: ...

    async def commit(self, op: TxnOp[Any]) -> tuple[KafkaError, bool]: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...


class OffsetsMarkers(Protocol):
    """The group coordinator of one __consumer_offsets partition, as a marker reaches it."""

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     commit: bool) -> KafkaError | Awaitable[KafkaError]: ...


class OffsetsPartitions(Protocol):
    """The group coordinators of this broker, one per __consumer_offsets partition it leads."""

    def for_partition(self, partition: int) -> OffsetsMarkers | None: ...


class RequestTimeout(Protocol):
    request_timeout_ms: int


class MarkerCompletion:
    """Carries out decisions: markers into data, offsets and branch partitions.

    `clog` is the coordinator's own log (a decision is made durable there before any
    marker), `local` writes the markers of partitions led here (and waits until they
    are committed), `markers` those of partitions led by another broker."""

    def __init__(self, coordinator: CompletingCoordinator, clog: CoordinatorLog, *,
                 local: PartitionMarkers, groups: OffsetsPartitions, markers: MarkerWriter) -> None:
        self._coordinator = coordinator
        self._shard = coordinator.shard
        self._clog = clog
        self._local = local
        self._groups = groups
        self._markers = markers

    async def roll_forward(self) -> None:
        """Carry out every decision the log holds (the coordinator starts serving). A
        prepared branch of a prepared parent is its parent's to complete, with the
        parent's other branches in the same appends: completed on its own it would show
        its rows of the batch before theirs."""
        for meta in [m for m in self._shard.txns.values() if m.state in PREPARED and m.txn_id not in self._shard.joined]:
            log.info("rolling forward %s of %s (producer %d epoch %d)", meta.state.name, meta.txn_id,
                     meta.producer_id, meta.epoch)
            await self.complete(meta)

    async def complete_if_prepared(self, txn_id: str) -> None:
        """A Prepare record in the log is the decision even when its fsync failed."""
        meta = self._shard.txns.get(txn_id)
        if meta is not None and meta.state in PREPARED and meta.pending is None:
            await self.complete(meta)

    async def complete(self, meta: TxnMeta) -> None:
        """Carry out a logged decision. If markers cannot be written now, keep
        retrying in the background; the transaction stays pending until done."""
        if self._shard.begin(meta, COMPLETE_OF[meta.state]):
            return   # already being completed (an EndTxn retry met a roll-forward), or superseded
        done: set[TopicPartition] = set()
        failing: dict[TopicPartition, FailureLog] = {}
        if await self._try_complete(meta, done, failing):
            return
        self._coordinator.spawn(self._retry_complete(meta, done, failing))

    async def _retry_complete(self, meta: TxnMeta, done: set[TopicPartition],
                              failing: dict[TopicPartition, FailureLog]) -> None:
        # No deadline: a logged decision is carried out however long the disk or the
        # partition leaders stay away.
        pace = Backoff(math.inf, first_s=0.1, max_s=5.0)
        while True:
            await asyncio.sleep(pace.step())
            if await self._try_complete(meta, done, failing):
                return

    async def _try_complete(self, meta: TxnMeta, done: set[TopicPartition],
                            failing: dict[TopicPartition, FailureLog]) -> bool:
        """One try at the markers not yet `done`; `failing` holds the log lines of the
        partitions refusing them (one line at the first refusal, then a count)."""
        if self._shard.txns.get(meta.txn_id) is not meta:
            return True   # superseded (never expected): a stale retry must not overwrite newer state
        commit = meta.state == TxnState.PREPARE_COMMIT
        kind = records.CONTROL_COMMIT if commit else records.CONTROL_ABORT
        try:
            # Markers only for a durable decision: a crash must not leave markers
            # whose Prepare record could still vanish from the coordinator log.
            await self._clog.durable()
        except AppendError as exc:
            log.warning("transaction log fsync before markers for %s failed (%s); will retry", meta.txn_id, exc)
            return False
        # The branches this decision carries (the Spark sink's tasks) are prepared in one
        # coordinator record batch, then every partition gets the markers of the parent and
        # of all its branches in one append: a read_committed reader of a partition sees
        # the whole decision there or none of it, never one branch before another.
        branches = await self._prepare_branches(meta, commit)
        if branches is None:
            return False
        marks: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for tp in meta.parts() - done:
            if branch_of(tp) is None:
                marks.setdefault(tp, []).append((meta.producer_id, meta.epoch))
        for branch in branches:
            for tp in branch.parts() - done:
                marks.setdefault(tp, []).append((branch.producer_id, branch.epoch))
        # All partitions at once: each partition's markers are appended, then their fsyncs
        # run together, so EndTxn costs one fsync round however many partitions it spans.
        todo = sorted(marks)
        results = await asyncio.gather(*(self._write_markers(tp, kind, marks[tp], meta.txn_id) for tp in todo),
                                       return_exceptions=True)
        failed = False
        for tp, result in zip(todo, results):
            if isinstance(result, AppendError):  # disk failure, a refusal by the partition's producer state,
                # or by its leader (NOT_ENOUGH_REPLICAS below min.insync.replicas, for as long as that lasts)
                what = f"marker write to {tp[0]}-{tp[1]} for {meta.txn_id}"
                failing.setdefault(tp, FailureLog(log, what)).failed(result)
                failed = True
            elif isinstance(result, BaseException):
                raise result
            else:
                done.add(tp)
                if tp in failing:
                    failing.pop(tp).succeeded()
        if failed:
            return False
        if branches:
            # Like the parent's, the branches' Complete records need not wait for their fsync.
            err, _ = await self._coordinator.commit(self._shard.complete_branches(branches))
            if err:
                log.warning("completing the branches of %s failed (%s); will retry", meta.txn_id, err.name)
                return False
        if self._shard.txns.get(meta.txn_id) is not meta:
            return True   # unloaded while the markers were written: the next coordinator completes it
        # The Complete record need not wait for its own fsync: every marker is
        # already durable, and if the record is lost the Prepare is replayed and
        # rolled forward again (markers written twice are harmless).
        _, replayed = await self._coordinator.commit(self._shard.complete(meta))
        # A Complete record that reached the log (even unsynced) is done: a crash
        # before it is durable replays the Prepare record and rolls forward again.
        return replayed

    async def _prepare_branches(self, parent: TxnMeta, commit: bool) -> list[TxnMeta] | None:
        """The parent's decision carried to its branches (prepared in one record batch: one
        append, one fsync); returns them, prepared, for their markers. Idempotent (a
        roll-forward after a crash finds them ongoing, prepared or complete); None: not
        now, the completion retries."""
        op, live = self._shard.prepare_branches(parent, commit)
        err = op.response
        if not err:
            err, _ = await self._coordinator.commit(op)
        target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        prepared = None if err else self._shard.prepared(live, target)
        if prepared is None:
            log.warning("preparing the branches of %s failed (%s); will retry", parent.txn_id,
                        (err or KafkaError.COORDINATOR_NOT_AVAILABLE).name)
        return prepared

    async def _write_markers(self, tp: tuple[str, int], kind: int, producers: list[tuple[int, int]],
                             txn_id: str) -> None:
        """The markers of `producers` (a decision's parent and branches) on tp, in one append."""
        commit = kind == records.CONTROL_COMMIT
        if tp[0] == OFFSETS_TOPIC and self._markers.leads_here(tp):
            groups = self._groups.for_partition(tp[1])
            if groups is None:
                raise AppendError(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no group coordinator for {tp}")
            for producer_id, epoch in producers:
                result = groups.complete_txn(producer_id, epoch, self._coordinator.coordinator_epoch, commit)
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    raise StorageError(f"offsets marker for {txn_id}: {KafkaError(result).name}")
            return
        if not self._markers.leads_here(tp):
            # Led by another broker (or by nobody right now): the current leader writes
            # them, all of this partition's in one WriteTxnMarkers request and one append.
            err = await self._markers.write(tp, commit, producers, self._coordinator.coordinator_epoch)
            if err:
                raise AppendError(err, f"markers for {txn_id} on {tp[0]}-{tp[1]} via its leader: {err.name}")
            return
        await self._local.write(tp, kind, producers, self._coordinator.coordinator_epoch)
