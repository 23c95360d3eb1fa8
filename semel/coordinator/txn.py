"""The transaction coordinator (KIP-98 / KIP-447 semantics).

State lives in the internal log `__transaction_state` (one record per
transition: key = transactional id, value = the full new state). Each request
validates against memory, appends the new state, waits for its fsync, and only
then applies it to memory with `_apply` — the same function replay uses.
A PrepareCommit/PrepareAbort record is the decision: once it is on disk the
markers are written to every partition of the transaction (retried until they
succeed, also after a crash) and a Complete record closes the transaction. A
logged decision is never reversed.

A record whose write succeeded but whose fsync failed is in the log (a restart
would replay it), so memory applies it too and the client is told
COORDINATOR_NOT_AVAILABLE: what it asked for may still take effect, which is a
legal outcome of an error. Markers are written only once the decision is durable.

The coordinator is composed of parts along its seams, each made in __init__ with what
it works on: carrying out a decision (markers, then the Complete record) is
txn_completion.MarkerCompletion; the branch extension for the Spark sink's atomic
micro-batches is txn_branches.TxnBranches; InitProducerId (new ids, epoch bumps, fencing)
is txn_init.ProducerIdInit; timeouts, expiry and compaction are
txn_housekeeping.TxnHousekeeping. Each reaches back to the coordinator only through the
Protocol it declares (its states `txns`, and begin / transition / log_state /
transition_all / abort_with_bump / spawn, the transition steps below).

Its lifecycle (status, load by replay, unload, the write path, background tasks and the
periodic housekeeping) is the coordinator runtime's (coordinator.runtime, as for the
group coordinator): the coordinator is the shard the runtime loads (`clear`, `replay`).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from ..protocol import records
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..storage.log import PartitionLog
from .runtime import CoordinatorRuntime
from .group_model import OFFSETS_TOPIC
from .ports import CoordinatorSeat, LocalMarkers, MarkerWriter, PartitionWriter, ProducerIdSource
from .txn_states import (
    COMPLETE_OF, PREPARED, TxnMeta, TxnState, can_transition, decode_value, encode_value,
    end_txn_outcome, now_ms,
)
from .txn_branches import BRANCH_PREFIX, TxnBranches, branch_of
from .partition_markers import DataLogs, PartitionMarkers
from .txn_completion import MarkerCompletion, OffsetsPartitions, RequestTimeout
from .txn_housekeeping import HousekeepingConfig, TxnHousekeeping
from .txn_init import MAX_EPOCH, InitConfig, ProducerIdInit, fenced_error

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


class TxnConfig(RequestTimeout, HousekeepingConfig, InitConfig, Protocol):
    """The broker settings the transaction coordinator reads (semel.broker.config)."""
    transaction_log_segment_bytes: int


class TxnStats(Protocol):
    """Counts of applied transitions and timeouts (semel.broker.metrics.BrokerMetrics)."""

    def txn_transition(self, previous: TxnState | None, new: TxnState) -> None: ...

    def txn_timed_out(self) -> None: ...


def _partition_error(tp: tuple[str, int], logs: DataLogs) -> KafkaError:
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



def timeout_deadline(prev: TxnMeta | None, meta: TxnMeta) -> float:
    """When (time.monotonic()) the ONGOING transaction `meta` times out. The same
    transaction growing by a partition keeps its deadline; a new one gets its whole
    timeout. One replayed from the log (a restart, a failover) gets what its wall-clock
    start leaves, between nothing and the whole timeout, so a clock stepped meanwhile
    can neither end it early by more than that nor keep it open for longer."""
    if (prev is not None and prev.state == TxnState.ONGOING and prev.start_ms == meta.start_ms
            and (prev.producer_id, prev.epoch) == (meta.producer_id, meta.epoch)):
        return prev.deadline
    left_ms = min(max(meta.start_ms + meta.timeout_ms - now_ms(), 0), meta.timeout_ms)
    return time.monotonic() + left_ms / 1000

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
        self.txns: dict[str, TxnMeta] = {}
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
        # A parent and its branches must share one coordinator: with several partitions a
        # branch whose id maps to another partition than its parent's is refused as a
        # Kafka broker refuses the pseudo-topic (the Spark sink names branches that hash
        # like their parent, semel.protocol.txn_hash.aligned, so they always land here).
        self.txn_partitions = txn_partitions
        self._branches = TxnBranches(self, txn_partitions)
        self._completion = MarkerCompletion(
            self, self._branches, self._clog, local=local_markers, groups=groups, markers=markers)
        self._init = ProducerIdInit(self, self._branches, pid_manager, config)
        self.housekeeping = TxnHousekeeping(self, self._clog, self._branches, config, self.stats)

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
        self.txns.clear()
        self._branches.joined.clear()
        self._init.reset()

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
        self.spawn(self._roll_forward_prepared())

    async def stop(self) -> None:
        await self.seat.stop()
        # Writes whose commit wait is cancelled here are answered NOT_COORDINATOR.
        await self.runtime.stop(cancel_tasks=True)
        self.markers.close()

    # --- the shard the runtime loads: memory := the last state of every id in the log ---

    def clear(self) -> None:
        self.txns.clear()

    def replay(self, buf: bytes | memoryview, pos: int, hdr: records.BatchHeader) -> None:
        if hdr.is_control:   # never written here since AddPartitionsToTxn refuses internal topics
            log.warning("ignoring a control batch at offset %d of %s", hdr.base_offset, TXN_TOPIC)
            return
        for rec in records.iter_records(buf, pos):
            self._apply_record(rec.key, rec.value)

    def _apply_record(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        txn_id = key.decode()
        if value is None:
            self.txns.pop(txn_id, None)
        else:
            self._apply(decode_value(txn_id, value))

    def _apply(self, meta: TxnMeta) -> None:
        if meta.state == TxnState.ONGOING:
            meta.deadline = timeout_deadline(self.txns.get(meta.txn_id), meta)
        self._branches.index(self.txns.get(meta.txn_id), meta)
        if meta.state == TxnState.DEAD:
            self.txns.pop(meta.txn_id, None)
        else:
            self.txns[meta.txn_id] = meta

    async def _roll_forward_prepared(self) -> None:
        # A prepared branch of a prepared parent is its parent's to complete, with the
        # parent's other branches in the same appends: completed on its own it would
        # show its rows of the batch before theirs.
        for meta in [m for m in self.txns.values() if m.state in PREPARED and m.txn_id not in self._branches.joined]:
            log.info("rolling forward %s of %s (producer %d epoch %d)", meta.state.name, meta.txn_id,
                     meta.producer_id, meta.epoch)
            await self._completion.complete(meta)

    # --- the append-then-apply step ---------------------------------------------

    async def log_state(self, meta: TxnMeta, tombstone: bool = False,
                         durable: bool = True) -> tuple[KafkaError, bool]:
        """(error, applied): append, wait for the commit point, then apply in log order
        (the runtime's log, shared with the group coordinator). applied is False only
        when nothing reached the log; after a failed commit wait the record is in the
        log and memory follows it (replaying the whole log instead would swap the
        objects that in-flight transitions hold, and a stale one could later overwrite
        newer state)."""
        return await self._log_states([meta], tombstone=tombstone, durable=durable)

    async def _log_states(self, metas: list[TxnMeta], *, tombstone: bool = False,
                          durable: bool = True) -> tuple[KafkaError, bool]:
        """log_state of several transactional ids in one record batch: one append, one
        commit wait, applied together (a decision's branches)."""
        if not self.serving():
            # Lost the seat while this transition was being decided: the log is not ours.
            return KafkaError.NOT_COORDINATOR, False
        batch = records.build_batch([(m.txn_id.encode(), None if tombstone else encode_value(m)) for m in metas])

        def apply(_info: object = None) -> tuple[KafkaError, bool]:
            for meta in metas:
                previous = self.txns.get(meta.txn_id)
                if tombstone:
                    self.txns.pop(meta.txn_id, None)
                    continue
                self._apply(meta)
                self.stats.txn_transition(previous.state if previous is not None else None, meta.state)
            return KafkaError.NONE, True

        def unsynced(error: KafkaError) -> tuple[KafkaError, bool]:
            log.log(self._clog.failure_level, "transaction log record for %s not made durable here; it stays in the log",
                    ", ".join(m.txn_id for m in metas))
            apply()
            return error, True

        return await self._clog.write(lambda: self._clog.append(batch), apply, lambda error: (error, False),
                                      unsynced=unsynced, durable=durable)

    async def transition_all(self, currents: list[TxnMeta], news: list[TxnMeta], durable: bool = True) -> KafkaError:
        """transition of several ids at once: all begun, one record batch, or none."""
        begun: list[TxnMeta] = []
        try:
            for current, new in zip(currents, news):
                err = self.begin(current, new.state)
                if err:
                    return err
                begun.append(current)
            err, _ = await self._log_states(news, durable=durable)
            return err
        finally:
            for current in begun:
                current.pending = None

    def busy(self) -> bool:
        """Is a record appended whose apply still waits for its fsync, or an id's first
        record being written?"""
        return bool(self._clog.inflight or self._init.initializing)

    def begin(self, current: TxnMeta | None, target: TxnState) -> KafkaError:
        """The one place a transactional id's state change starts (Kafka's
        prepareTransitionTo): refused when the table forbids it or another change of
        that id is in flight; otherwise `pending` holds the target until the record
        is appended and applied (the caller clears it if it gives up). None: an id
        with no record yet, whose in-flight guard is ProducerIdInit.initializing."""
        if current is not None and (self.txns.get(current.txn_id) is not current or current.pending is not None):
            # The caller looked before an await and the state moved on since.
            return KafkaError.CONCURRENT_TRANSACTIONS
        if not can_transition(None if current is None else current.state, target):
            return KafkaError.INVALID_TXN_STATE
        if current is not None:
            current.pending = target
        return KafkaError.NONE

    async def transition(self, current: TxnMeta | None, new: TxnMeta) -> KafkaError:
        err = self.begin(current, new.state)
        if err:
            return err
        try:
            err, _ = await self.log_state(new)
            return err
        finally:
            if current is not None:
                current.pending = None

    # --- InitProducerId ---------------------------------------------------------

    async def init_producer_id(self, txn_id: str | None, timeout_ms: int, producer_id: int,
                               producer_epoch: int, version: int) -> tuple[KafkaError, int, int]:
        return await self._init.init_producer_id(txn_id, timeout_ms, producer_id, producer_epoch, version)

    # --- AddPartitionsToTxn / AddOffsetsToTxn -------------------------------------

    def _validate(self, txn_id: str, producer_id: int, epoch: int, api_key: int,
                  version: int) -> tuple[TxnMeta | None, KafkaError]:
        if not txn_id:
            return None, KafkaError.INVALID_REQUEST
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return None, KafkaError.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.epoch:
            return None, fenced_error(api_key, version)
        if meta.pending is not None or meta.state in PREPARED or txn_id in self._branches.joined:
            return None, KafkaError.CONCURRENT_TRANSACTIONS
        return meta, KafkaError.NONE

    async def add_partitions(self, txn_id: str, producer_id: int, epoch: int,
                             partitions: list[tuple[str, int]], version: int,
                             api_key: int = ApiKey.ADD_PARTITIONS_TO_TXN) -> dict[tuple[str, int], KafkaError]:
        meta, err = self._validate(txn_id, producer_id, epoch, api_key, version)
        if meta is None:
            return {tp: err for tp in partitions}

        def refusal(tp: tuple[str, int]) -> KafkaError:
            branch = branch_of(tp)
            if branch is None:
                return _partition_error(tp, self.logs)
            if not self._branches.coordinated_here(txn_id, branch):
                return KafkaError.INVALID_TOPIC_EXCEPTION
            return self._branches.join_error(meta, branch)
        refused = {tp: refusal(tp) for tp in partitions}
        if any(refused.values()):  # all or nothing
            return {tp: err or KafkaError.OPERATION_NOT_ATTEMPTED for tp, err in refused.items()}
        wanted = meta.parts() | frozenset(partitions)
        if meta.state == TxnState.ONGOING and wanted == meta.parts():
            return {tp: KafkaError.NONE for tp in partitions}
        now = now_ms()
        start = meta.start_ms if meta.state == TxnState.ONGOING else now
        new = meta.copy(state=TxnState.ONGOING, partitions=wanted, start_ms=start, update_ms=now)
        # Reserve the new branches before the await, so no timeout, EndTxn or fence
        # can end them while the join is being logged; undone if it never applied.
        joining = [b for b in map(branch_of, partitions) if b is not None and b not in self._branches.joined]
        for b in joining:
            self._branches.joined[b] = txn_id
        try:
            err = await self.transition(meta, new)
        finally:
            mine = self.txns.get(txn_id)
            for b in joining:
                if self._branches.joined.get(b) == txn_id and (mine is None or (BRANCH_PREFIX + b, 0) not in mine.parts()):
                    del self._branches.joined[b]
        return {tp: err for tp in partitions}

    async def add_offsets(self, txn_id: str, producer_id: int, epoch: int, group_id: str,
                          version: int) -> KafkaError:
        if not group_id:
            return KafkaError.INVALID_GROUP_ID
        tp = self._offsets_partition(group_id)
        result = await self.add_partitions(txn_id, producer_id, epoch, [tp], version, api_key=ApiKey.ADD_OFFSETS_TO_TXN)
        return result[tp]

    def _offsets_partition(self, group_id: str | None) -> tuple[str, int]:
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
        return self._verify(txn_id, producer_id, epoch, (topic, partition))

    def verify_offsets(self, txn_id: str, producer_id: int, epoch: int, version: int,
                       group_id: str | None = None) -> KafkaError:
        if not self.is_coordinator():
            # The group coordinator on another broker than the transaction's: the offsets
            # log's producer state fences older epochs (as in Kafka before KIP-890).
            return KafkaError.NONE
        err = self._verify(txn_id, producer_id, epoch, self._offsets_partition(group_id))
        if err == KafkaError.INVALID_PRODUCER_EPOCH:
            return fenced_error(ApiKey.TXN_OFFSET_COMMIT, version)
        return err

    def _verify(self, txn_id: str, producer_id: int, epoch: int, tp: tuple[str, int]) -> KafkaError:
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return KafkaError.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.epoch:
            return KafkaError.INVALID_PRODUCER_EPOCH
        if (meta.state != TxnState.ONGOING or meta.pending in PREPARED or tp not in meta.parts()
                or txn_id in self._branches.joined):
            return KafkaError.INVALID_TXN_STATE
        return KafkaError.NONE

    # --- EndTxn -------------------------------------------------------------------

    async def end_txn(self, txn_id: str, producer_id: int, epoch: int, commit: bool,
                      version: int) -> KafkaError:
        if not txn_id:
            return KafkaError.INVALID_REQUEST
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != producer_id:
            return KafkaError.INVALID_PRODUCER_ID_MAPPING
        if epoch != meta.epoch:
            return fenced_error(ApiKey.END_TXN, version)
        if meta.pending is not None or txn_id in self._branches.joined:
            return KafkaError.CONCURRENT_TRANSACTIONS   # a joined branch ends with its parent
        target = end_txn_outcome(meta.state, commit)
        if isinstance(target, KafkaError):
            return target
        prepared = meta.copy(state=target, update_ms=now_ms())
        err = await self.transition(meta, prepared)
        await self._completion.complete_if_prepared(txn_id)
        if err and self._state(txn_id) == COMPLETE_OF[target]:
            return KafkaError.NONE  # the Prepare fsync failed, yet the decision is now carried out
        return err

    def _state(self, txn_id: str) -> TxnState | None:
        meta = self.txns.get(txn_id)
        return None if meta is None else meta.state

    async def abort_with_bump(self, meta: TxnMeta) -> KafkaError:
        # Never a new producer id here: the markers must carry the id the transaction's
        # data was written with, or its partitions stay unstable for ever. Epochs handed
        # to clients stop below MAX_EPOCH, which is kept for this fence; the next
        # InitProducerId then moves on to a new producer id.
        epoch = min(meta.epoch + 1, MAX_EPOCH)
        prepared = meta.copy(state=TxnState.PREPARE_ABORT, epoch=epoch,
                             last_producer_id=meta.producer_id, last_epoch=meta.epoch, update_ms=now_ms())
        err = await self.transition(meta, prepared)
        await self._completion.complete_if_prepared(meta.txn_id)
        return err

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` in the background; unload cancels it, stop waits for it."""
        self.runtime.spawn(coro)
