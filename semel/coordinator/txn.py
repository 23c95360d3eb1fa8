"""The transaction coordinator (KIP-98 / KIP-447 semantics): the thin part that hands
the shard's operations to the runtime.

State lives in the internal log `__transaction_state` (one record per transition: key =
transactional id, value = the full new state). Every decision is the shard's
(coordinator.txn_shard.TxnShard: plain functions of state and request returning records
and a response); this module carries each one through the runtime's write path
(`commit`): take the op's locks, append, wait for the commit point (fsync and high
watermark), `replay` the records into the shard, answer. The runtime's load replays the
log through the same `replay`, so memory is the replay of the log.

A PrepareCommit/PrepareAbort record is the decision: once it is on disk the markers are
written to every partition of the transaction (txn_completion.MarkerCompletion, retried
until they succeed, also after a crash) and a Complete record closes the transaction. A
logged decision is never reversed.

A record whose write succeeded but whose fsync failed is in the log (a restart would
replay it), so memory replays it too and the client is told COORDINATOR_NOT_AVAILABLE:
what it asked for may still take effect, which is a legal outcome of an error. Markers
are written only once the decision is durable.

Timeouts, expiry and compaction are txn_housekeeping.TxnHousekeeping, a periodic pass of
the runtime. Its lifecycle (status, load by replay, unload, the write path, background
tasks) is the coordinator runtime's (coordinator.runtime, as for the group coordinator).
"""
from __future__ import annotations

import logging
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from ..protocol import records
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..storage.errors import StorageError
from ..storage.log import PartitionLog
from .runtime import CoordinatorRuntime
from .group_model import OFFSETS_TOPIC
from .ports import CoordinatorSeat, LocalMarkers, MarkerWriter, PartitionWriter, ProducerIdSource
from .txn_states import COMPLETE_OF, TxnMeta, TxnState, encode_value
from .partition_markers import DataLogs, PartitionMarkers
from .txn_completion import MarkerCompletion, OffsetsPartitions, RequestTimeout
from .txn_housekeeping import HousekeepingConfig, TxnHousekeeping
from .txn_shard import TopicPartition, TxnOp, TxnShard, fenced_error

log = logging.getLogger("semel.txn")

TXN_TOPIC = "__transaction_state"


class TxnLogs(DataLogs, Protocol):
    """The broker's partition logs (storage.manager.LogManager), as the coordinator uses them."""

    def topics(self) -> Mapping[str, object]: ...

    def create_topic(self, name: str, partitions: int, config: dict[str, str] | None = None, *,
                     internal: bool = False, topic_id: str | None = None) -> KafkaError: ...


class TxnGroups(OffsetsPartitions, Protocol):
    """The group coordinators, as transactions reach them: each offsets partition's marker,
    and which partition holds a group."""

    def partition_for(self, group_id: str | None) -> int: ...


class TxnConfig(RequestTimeout, HousekeepingConfig, Protocol):
    """The broker settings the transaction coordinator reads (semel.broker.config)."""
    transaction_log_segment_bytes: int
    transaction_max_timeout_ms: int


class TxnStats(Protocol):
    """Counts of applied transitions and timeouts (semel.broker.metrics.BrokerMetrics)."""

    def txn_transition(self, previous: TxnState | None, new: TxnState) -> None: ...

    def txn_timed_out(self) -> None: ...


def _partition_error(tp: TopicPartition, logs: DataLogs) -> KafkaError:
    """Why tp cannot join a transaction (NONE if it can). Internal topics other than
    the offsets partitions (which AddOffsetsToTxn adds) are refused: a marker written
    into the coordinator's own log would make it unreadable at the next start."""
    if tp[0] == OFFSETS_TOPIC and logs.get(*tp) is not None:
        return KafkaError.NONE
    if tp[0].startswith("__"):
        return KafkaError.INVALID_TOPIC_EXCEPTION
    return KafkaError.UNKNOWN_TOPIC_OR_PARTITION if logs.get(*tp) is None else KafkaError.NONE


class _Uncounted:
    """Transition statistics when no metrics are wired in (unit tests)."""
    def txn_transition(self, previous: TxnState | None, new: TxnState) -> None:
        pass

    def txn_timed_out(self) -> None:
        pass


class TransactionCoordinator:
    """One transaction coordinator: of the single node, or of one __transaction_state
    partition in a cluster. What it needs from around it is given here
    (semel.coordinator.ports; semel.broker.wiring chooses the implementations):

    `writer`     the PartitionWriter of its own log (semel.storage.committed: fsynced,
                 then past the high watermark)
    `pid_manager` the ProducerIdSource
    `markers`    the MarkerWriter for partitions led by other brokers (LocalMarkers:
                 every partition is led here, as on a single node)
    `seat`       the CoordinatorSeat that loads, serves and drops it (on a single node
                 semel.coordinator.ports.LocalSeat: loaded when started, always serving)
    `local_markers` the broker's PartitionMarkers: markers written into partitions
                 led here, which wait until committed (fsynced, then past the high
                 watermark, as Kafka writes markers with acks=all)
    `txn_partitions`   the partition count of __transaction_state
    """

    def __init__(self, logs: TxnLogs, writer: PartitionWriter, groups: TxnGroups, config: TxnConfig,
                 pid_manager: ProducerIdSource, stats: TxnStats | None = None, *, seat: CoordinatorSeat,
                 local_markers: PartitionMarkers, markers: MarkerWriter = LocalMarkers(),
                 txn_partitions: int = 1) -> None:
        self.logs = logs
        self.groups = groups
        self.config = config
        self.pids = pid_manager
        # Counts applied transitions for the metrics (semel.broker.metrics.BrokerMetrics).
        self.stats: TxnStats = stats or _Uncounted()
        # A parent and its branches must share one coordinator: with several partitions a
        # branch whose id maps to another partition than its parent's is refused as a
        # Kafka broker refuses the pseudo-topic (the Spark sink names branches that hash
        # like their parent, semel.protocol.txn_hash.aligned, so they always land here).
        self.shard = TxnShard(txn_partitions)
        self.log: PartitionLog | None = None
        self.runtime = CoordinatorRuntime(TXN_TOPIC, writer)
        self._clog = self.runtime.log
        self.markers = markers
        # Nothing is appended to the log unless `serving()`. Only the coordinator's state
        # can verify a transactional produce; a leader that is not the coordinator relies
        # on producer state (epochs, sequences) as Kafka did before KIP-890.
        self.seat = seat
        self.serving = self.runtime.serving
        self.is_coordinator = self.serving
        self._completion = MarkerCompletion(self, self._clog, local=local_markers, groups=groups, markers=markers)
        self.housekeeping = TxnHousekeeping(self, self._clog, config, self.stats)

    @property
    def txns(self) -> dict[str, TxnMeta]:
        """The last state of every transactional id (the shard's)."""
        return self.shard.txns

    @staticmethod
    def log_configs(config: TxnConfig) -> dict[str, str]:
        # Coordinator state must never age out: no time or size retention.
        # Small segments so compaction can hand old ones back (see maybe_compact).
        return {"retention.ms": "-1", "retention.bytes": "-1",
                "segment.bytes": str(config.transaction_log_segment_bytes)}

    @property
    def coordinator_epoch(self) -> int:
        # The leader epoch served at (cluster), else the ProducerIdSource's counter.
        epoch = self.runtime.epoch
        return self.pids.coordinator_epoch if epoch is None else epoch

    # --- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Start the housekeeping; the transactions are loaded when the seat loads the log."""
        self.runtime.start(run_timers=False)
        self.runtime.every(self.config.transaction_abort_check_interval_ms / 1000, "housekeeping",
                           self.housekeeping.run_once)

    # --- the seat loads, serves and drops this coordinator ---------------------------------

    def unload(self) -> None:
        """Not the coordinator (any more): forget every transactional id, stop completing,
        answer writes still waiting NOT_COORDINATOR. Coroutines of requests in flight find
        their state objects gone (identity checks) and `serving()` false, so they append
        nothing more."""
        self.runtime.unload(cancel_tasks=True)
        self.shard.clear()

    def load(self, plog: PartitionLog, epoch: int | None) -> None:
        """Replay the log (synchronously) as the coordinator at `epoch` (None: the
        ProducerIdSource's coordinator epoch, on a single node)."""
        self.log = plog
        self.runtime.load(self, plog, epoch)
        log.info("transaction coordinator loaded %d transactional id(s) (coordinator epoch %d)",
                 len(self.txns), self.coordinator_epoch)

    def serve(self, epoch: int | None) -> None:
        """Serving at `epoch`: carry out every decision the log holds, in the background."""
        self.runtime.serve()
        self.spawn(self._completion.roll_forward())

    async def stop(self) -> None:
        await self.seat.stop()
        # Writes whose commit wait is cancelled here are answered NOT_COORDINATOR.
        await self.runtime.stop(cancel_tasks=True)
        self.markers.close()

    # --- what the runtime loads: the shard, one batch of the log at a time -----------------

    def clear(self) -> None:
        self.shard.clear()

    def replay(self, buf: bytes | memoryview, pos: int, hdr: records.BatchHeader) -> None:
        self.shard.replay_batch(buf, pos, hdr)

    # --- the write path: locks, append, commit point, replay, answer --------------------------

    async def commit(self, op: TxnOp[Any]) -> tuple[KafkaError, bool]:
        """Write `op`'s records through the runtime: (error, replayed). replayed is False
        only when nothing reached the log (or `op` writes nothing: (NONE, False)); after a
        failed commit wait the records are in the log and memory follows them."""
        if not op.records:
            return KafkaError.NONE, False
        err = self.shard.lock(op)
        if err:
            return err, False
        try:
            if not self.serving():
                # Lost the seat while this op was being decided: the log is not ours.
                return KafkaError.NOT_COORDINATOR, False
            batch = records.build_batch([(txn_id.encode(), None if meta is None else encode_value(meta))
                                         for txn_id, meta in op.records])
            what = "transaction log record for " + ", ".join(txn_id for txn_id, _ in op.records)
            return await self.runtime.write(batch, lambda: self._replay_live(op), durable=op.durable, what=what)
        finally:
            self.shard.unlock(op)

    def _replay_live(self, op: TxnOp[Any]) -> None:
        for txn_id, meta in op.records:
            previous = self.shard.state_of(txn_id)
            self.shard.replay((txn_id, meta))
            if meta is not None:
                self.stats.txn_transition(previous, meta.state)

    def busy(self) -> bool:
        """Is a record appended whose replay still waits for its commit point, or an id's
        first record being written?"""
        return bool(self._clog.inflight or self.shard.initializing)

    def begin(self, current: TxnMeta | None, target: TxnState) -> KafkaError:
        return self.shard.begin(current, target)

    # --- InitProducerId ---------------------------------------------------------

    async def init_producer_id(self, txn_id: str | None, timeout_ms: int, producer_id: int,
                               producer_epoch: int, version: int) -> tuple[KafkaError, int, int]:
        try:
            await self.pids.reserve()   # cluster ids: fetched before deciding
            if txn_id is None:
                return KafkaError.NONE, self.pids.next_id(), 0
            if not txn_id:   # Kafka: an empty transactional id is a bad request, not "none"
                return KafkaError.INVALID_REQUEST, -1, -1
            if not 0 < timeout_ms <= self.config.transaction_max_timeout_ms:
                return KafkaError.INVALID_TRANSACTION_TIMEOUT, -1, -1
            # Every decision is taken on the state as it is now: when the fence first has
            # to abort something (an await), the shard decides again on what that left.
            for _ in range(3):
                op = self.shard.init_producer_id(txn_id, timeout_ms, producer_id, producer_epoch, version,
                                                 self.pids.next_id)
                if op.fence is not None:
                    if await self.abort_with_bump(op.fence):
                        return KafkaError.CONCURRENT_TRANSACTIONS, -1, -1
                    continue
                err, _ = await self.commit(op)
                return (err, -1, -1) if err else op.response
            return KafkaError.CONCURRENT_TRANSACTIONS, -1, -1
        except (StorageError, ConnectionError) as exc:   # the producer-id block could not be reserved on disk
            log.error("InitProducerId for %r failed: %s", txn_id, exc)
            return KafkaError.COORDINATOR_NOT_AVAILABLE, -1, -1

    # --- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------

    async def add_partitions(self, txn_id: str, producer_id: int, epoch: int,
                             partitions: list[TopicPartition], version: int,
                             api_key: int = ApiKey.ADD_PARTITIONS_TO_TXN) -> dict[TopicPartition, KafkaError]:
        op = self.shard.add_partitions(txn_id, producer_id, epoch, partitions, version, api_key,
                                       lambda tp: _partition_error(tp, self.logs))
        err, _ = await self.commit(op)
        return {tp: err for tp in partitions} if err else op.response

    async def add_offsets(self, txn_id: str, producer_id: int, epoch: int, group_id: str,
                          version: int) -> KafkaError:
        if not group_id:
            return KafkaError.INVALID_GROUP_ID
        tp = self._offsets_partition(group_id)
        result = await self.add_partitions(txn_id, producer_id, epoch, [tp], version, api_key=ApiKey.ADD_OFFSETS_TO_TXN)
        return result[tp]

    def _offsets_partition(self, group_id: str | None) -> TopicPartition:
        """The __consumer_offsets partition holding `group_id` (Kafka: the group's partition
        joins the transaction, so its coordinator gets the marker)."""
        return (OFFSETS_TOPIC, self.groups.partition_for(group_id))

    # --- checks used by Produce and TxnOffsetCommit (KIP-890 part 1) -------------------

    def verify_produce(self, txn_id: str, producer_id: int, epoch: int, topic: str,
                       partition: int) -> KafkaError:
        if not self.is_coordinator():
            # A partition leader that is not the coordinator: this broker's transaction
            # state is not the transaction's (it may be empty or stale), so it decides
            # nothing; the partition's producer state fences old epochs and checks sequences.
            return KafkaError.NONE
        return self.shard.verify(txn_id, producer_id, epoch, (topic, partition))

    def verify_offsets(self, txn_id: str, producer_id: int, epoch: int, version: int,
                       group_id: str | None = None) -> KafkaError:
        if not self.is_coordinator():
            # The group coordinator on another broker than the transaction's: the offsets
            # log's producer state fences older epochs (as in Kafka before KIP-890).
            return KafkaError.NONE
        err = self.shard.verify(txn_id, producer_id, epoch, self._offsets_partition(group_id))
        if err == KafkaError.INVALID_PRODUCER_EPOCH:
            return fenced_error(ApiKey.TXN_OFFSET_COMMIT, version)
        return err

    # --- EndTxn and the fence: a Prepare record, then its markers -------------------------

    async def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool,
                      version: int) -> KafkaError:
        op = self.shard.end_txn(txn_id, producer_id, epoch, commit, version)
        if not op.records:
            return op.response
        err = await self._decide(txn_id, op)
        decision = op.records[0][1]
        if err and decision is not None and self.shard.state_of(txn_id) == COMPLETE_OF[decision.state]:
            return KafkaError.NONE  # the Prepare fsync failed, yet the decision is now carried out
        return err

    async def abort_with_bump(self, meta: TxnMeta) -> KafkaError:
        """Abort `meta`'s transaction under the next epoch (the shard's `fence`)."""
        return await self._decide(meta.txn_id, self.shard.fence(meta))

    async def _decide(self, txn_id: str, op: TxnOp[KafkaError]) -> KafkaError:
        """Write a Prepare record, then carry the decision out if it reached the log."""
        err, _ = await self.commit(op)
        await self._completion.complete_if_prepared(txn_id)
        return err

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` in the background; unload cancels it, stop waits for it."""
        self.runtime.spawn(coro)
