"""Transaction administration (KIP-664): DescribeProducers (61), DescribeTransactions (65),
ListTransactions (66), and WriteTxnMarkers (27) in its admin-abort use.

These let Kafka's own tooling (kafka-transactions.sh, kafka-python's admin client)
find hanging transactions: DescribeProducers shows which producers hold a
partition's last stable offset back, the coordinator APIs say whether a live
transaction stands behind them. WriteTxnMarkers is what Kafka's admin abort
sends: an ABORT marker written straight into a partition, so read_committed
readers move past data whose transaction the coordinator no longer knows.

Everything here only reads coordinator and producer state, except the marker,
which is guarded so that it can never contradict a coordinator decision.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from ...cluster.txn_markers import is_coordinator_client
from ...clock import wall_ms
from ...coordinator.txn import OFFSETS_TOPIC
from ...coordinator.txn_states import PREPARED, TxnMeta, TxnState
from ...protocol import records
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.errors import AppendError, StorageError
from ...storage.log import PartitionLog
from ...storage.producer_state import ProducerEntry
from ..responses import by_topic
from ..router import RequestContext, handler

log = logging.getLogger("semel.broker.txn_admin")

# Kafka's wire names of the coordinator states (TransactionState.java).
STATE_NAMES = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
}
_STATE_BY_NAME = {v: k for k, v in STATE_NAMES.items()}
# Kafka's state name that no listed transaction is ever in (Kafka holds it only as a
# pending step; semel.coordinator.txn_states): a filter naming it is known and matches nothing.
_NEVER_LISTED = frozenset({"PrepareEpochFence"})
# States whose transaction still owns its partitions: markers are written or still to come.
LIVE = frozenset({TxnState.ONGOING}) | PREPARED


def _transactions(ctx: RequestContext) -> list[TxnMeta]:
    """A snapshot of the coordinator's transactional ids (TxnMeta objects, never changed here)."""
    return ctx.services.txn_coordinator.transactions()


def _find(ctx: RequestContext, txn_id: str) -> TxnMeta | None:
    return ctx.services.txn_coordinator.transaction(txn_id)


def _now_ms() -> int:
    return wall_ms()


# --- DescribeTransactions ---------------------------------------------------------------

@handler(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0)
async def describe_transactions(ctx: RequestContext, req: Any) -> Any:
    T = ctx.cls().TransactionState
    return ctx.response(throttle_time_ms=0, transaction_states=[
        _describe_one(ctx, T, txn_id) for txn_id in req.transactional_ids or ()])


def _describe_one(ctx: RequestContext, T: Any, txn_id: str) -> Any:
    if not ctx.authorize("DESCRIBE", "TRANSACTIONAL_ID", txn_id):
        return _not_described(T, txn_id, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    # Kafka: only the id's coordinator describes it (NOT_COORDINATOR elsewhere).
    err = ctx.services.txn_coordinator.error_for(txn_id)
    if err:
        return _not_described(T, txn_id, err)
    meta = _find(ctx, txn_id) if txn_id else None
    if meta is None:
        return _not_described(T, txn_id, KafkaError.TRANSACTIONAL_ID_NOT_FOUND)
    grouped: dict[str, list[int]] = {}
    for topic, partition in sorted(meta.parts()):
        # Kafka leaves out the partitions of topics the caller may not describe.
        if ctx.authorize("DESCRIBE", "TOPIC", topic):
            grouped.setdefault(topic, []).append(partition)
    return T(error_code=KafkaError.NONE, transactional_id=txn_id, transaction_state=STATE_NAMES[meta.state],
             transaction_timeout_ms=meta.timeout_ms,
             transaction_start_time_ms=meta.start_ms if meta.state in LIVE else -1,
             producer_id=meta.producer_id, producer_epoch=meta.epoch,
             topics=[T.TopicData(topic=t, partitions=ps) for t, ps in grouped.items()])


def _not_described(T: Any, txn_id: str, err: KafkaError) -> Any:
    return T(error_code=err, transactional_id=txn_id, transaction_state="", transaction_timeout_ms=0,
             transaction_start_time_ms=-1, producer_id=-1, producer_epoch=-1, topics=[])


# --- ListTransactions -------------------------------------------------------------------

@handler(ApiKey.LIST_TRANSACTIONS, 0, 2)
async def list_transactions(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    wanted_states = set(req.state_filters or ())
    unknown = sorted(s for s in wanted_states if s not in _STATE_BY_NAME and s not in _NEVER_LISTED)
    states = {_STATE_BY_NAME[s] for s in wanted_states if s in _STATE_BY_NAME}
    pids = set(req.producer_id_filters or ())
    min_age = req.duration_filter if v >= 1 else -1
    pattern = None
    if v >= 2 and req.transactional_id_pattern:
        try:
            pattern = re.compile(req.transactional_id_pattern)
        except re.error:
            return ctx.response(throttle_time_ms=0, error_code=KafkaError.INVALID_REGULAR_EXPRESSION,
                                unknown_state_filters=unknown, transaction_states=[])
    if wanted_states and not states:
        # Only states no transaction here is in asked for: none can match (Kafka answers the same way).
        rows = []
    else:
        now = _now_ms()
        rows = [m for m in _transactions(ctx)
                if (not states or m.state in states)
                and (not pids or m.producer_id in pids)
                and (min_age < 0 or (m.state in LIVE and m.start_ms >= 0 and now - m.start_ms > min_age))
                and (pattern is None or pattern.search(m.txn_id))
                and ctx.authorize("DESCRIBE", "TRANSACTIONAL_ID", m.txn_id)]   # only ids the caller may see
    T = ctx.cls().TransactionState
    return ctx.response(throttle_time_ms=0, error_code=KafkaError.NONE, unknown_state_filters=unknown,
                        transaction_states=[T(transactional_id=m.txn_id, producer_id=m.producer_id,
                                              transaction_state=STATE_NAMES[m.state])
                                            for m in sorted(rows, key=lambda m: m.txn_id)])


# --- DescribeProducers ------------------------------------------------------------------

@handler(ApiKey.DESCRIBE_PRODUCERS, 0, 0)
async def describe_producers(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    T = cls.TopicResponse
    P = T.PartitionResponse
    topics = []
    for topic in req.topics or ():
        parts = []
        for index in topic.partition_indexes or ():
            if not ctx.authorize("READ", "TOPIC", topic.name):
                parts.append(P(partition_index=index, error_code=KafkaError.TOPIC_AUTHORIZATION_FAILED,
                               error_message=None, active_producers=[]))
                continue
            plog = ctx.services.logs.get(topic.name, index)
            if plog is None or topic.name.startswith("__"):
                parts.append(P(partition_index=index, error_code=KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                               error_message=None, active_producers=[]))
                continue
            parts.append(P(partition_index=index, error_code=KafkaError.NONE, error_message=None,
                           active_producers=[_producer_row(P.ProducerState, e)
                                             for e in _producer_entries(plog)]))
        topics.append(T(name=topic.name, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)


def _producer_entries(plog: PartitionLog) -> list[ProducerEntry]:
    """Producers a partition remembers, in producer id order."""
    state = plog.producers
    found = (state.entry(pid) for pid in state.producer_ids())
    return sorted((e for e in found if e is not None), key=lambda e: e.producer_id)


def _producer_row(S: Any, e: ProducerEntry) -> Any:
    return S(producer_id=e.producer_id, producer_epoch=e.epoch, last_sequence=e.last_seq,
             last_timestamp=e.last_timestamp, coordinator_epoch=e.coordinator_epoch,
             current_txn_start_offset=-1 if e.txn_first_offset is None else e.txn_first_offset)


# --- WriteTxnMarkers (admin abort) ----------------------------------------------------------

@handler(ApiKey.WRITE_TXN_MARKERS, 0, 1)
async def write_txn_markers(ctx: RequestContext, req: Any) -> Any:
    R = ctx.cls().WritableTxnMarkerResult
    T = R.WritableTxnMarkerTopicResult
    # Kafka: markers are a cluster action (brokers write them; an admin abort needs the same right).
    allowed = ctx.authorize("CLUSTER_ACTION", "CLUSTER", "kafka-cluster")
    markers = list(req.markers or ())
    wanted = [[(t.name, p) for t in m.topics or () for p in t.partition_indexes or ()] for m in markers]
    if not allowed:
        errs = [[KafkaError.CLUSTER_AUTHORIZATION_FAILED] * len(w) for w in wanted]
    elif is_coordinator_client(ctx.client_id):
        errs = await _coordinator_markers(ctx, markers, wanted)
    else:
        # All partitions of a marker at once, as the coordinator writes its own: one fsync round.
        errs = [await asyncio.gather(*(_abort_partition(ctx, m, tp) for tp in w)) for m, w in zip(markers, wanted)]
    out = []
    for marker, w, e in zip(markers, wanted, errs):
        grouped = by_topic(list(zip(w, e)), lambda p, err: T.WritableTxnMarkerPartitionResult(
            partition_index=p, error_code=err))
        out.append(R(producer_id=marker.producer_id,
                     topics=[T(name=name, partitions=ps) for name, ps in grouped.items()]))
    return ctx.response(markers=out)


async def _coordinator_markers(ctx: RequestContext, markers: list[Any],
                               wanted: list[list[tuple[str, int]]]) -> list[list[KafkaError]]:
    """Markers sent by the transaction coordinator on another broker (Kafka's use of
    WriteTxnMarkers), written as decided by the partitions' leader and answered once
    durable and replicated; the coordinator retries any error. Every marker of one
    partition (a decision's parent and branches) goes in one append, so a read_committed
    reader there sees them all or none; the partitions are written at once."""
    groups: dict[tuple[tuple[str, int], bool, int], list[tuple[int, int]]] = {}   # (tp, result, coordinator epoch) -> (marker, position)
    for i, (marker, tps) in enumerate(zip(markers, wanted)):
        for j, tp in enumerate(tps):
            groups.setdefault((tp, bool(marker.transaction_result), marker.coordinator_epoch), []).append((i, j))
    keys = list(groups)
    results = await asyncio.gather(*(_coordinator_partition(ctx, tp, commit, cepoch,
                                                            [markers[i] for i, _ in groups[(tp, commit, cepoch)]])
                                     for tp, commit, cepoch in keys))
    errs = [[KafkaError.NONE] * len(w) for w in wanted]
    for key, got in zip(keys, results):
        for (i, j), err in zip(groups[key], got):
            errs[i][j] = err
    return errs


async def _coordinator_partition(ctx: RequestContext, tp: tuple[str, int], commit: bool, coordinator_epoch: int,
                                 markers: list[Any]) -> list[KafkaError]:
    """The markers of one partition (one result and coordinator epoch): one error each."""
    topic, partition = tp
    if topic == OFFSETS_TOPIC:
        return [await _offsets_marker(ctx, m, partition) for m in markers]
    if topic.startswith("__"):
        return [KafkaError.INVALID_TOPIC_EXCEPTION] * len(markers)   # no transaction spans the transaction log
    err = ctx.services.replicas.leader_error(topic, partition)
    if not err:
        kind = records.CONTROL_COMMIT if commit else records.CONTROL_ABORT
        try:
            await ctx.services.partition_markers.write(tp, kind, [(m.producer_id, m.producer_epoch) for m in markers],
                                                       coordinator_epoch)
        except StorageError as exc:
            log.error("markers on %s-%d for %d producer(s) failed: %s", topic, partition, len(markers), exc)
            err = KafkaError.KAFKA_STORAGE_ERROR
        except AppendError as exc:   # not the leader any more, fenced, or not replicated in time
            err = exc.error
    return [err] * len(markers)


async def _offsets_marker(ctx: RequestContext, marker: Any, partition: int) -> KafkaError:
    """The offsets "marker" of a transaction whose coordinator sits on another broker:
    the group coordinator of that __consumer_offsets partition here (its leader) writes
    it and makes the transaction's offsets committed or drops them, answering once
    replicated."""
    groups = ctx.services.group_coordinator.for_partition(partition)
    if groups is None:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    err = groups.seat.error()
    if err:
        return err
    return await groups.complete_txn(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                      bool(marker.transaction_result))


async def _abort_partition(ctx: RequestContext, marker: Any, tp: tuple[str, int]) -> KafkaError:
    """Write an ABORT marker for a transaction nobody else will end.

    Refused (nothing written) when it would contradict the coordinator: a COMMIT
    (only the coordinator decides commits), or an abort of a transaction the
    coordinator still owns in this partition (it will write that marker itself,
    possibly a COMMIT already decided; the admin must fence the transactional id
    instead). A producer with no open transaction here needs no marker."""
    if marker.transaction_result:
        return KafkaError.INVALID_REQUEST
    topic, partition = tp
    plog = ctx.services.logs.get(topic, partition)
    if plog is None or topic.startswith("__"):
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    owner = _coordinator_owner(ctx, marker.producer_id, tp)
    if owner is not None:
        log.warning("refusing admin abort of %s-%d producer %d: transaction %r is %s at the coordinator",
                    topic, partition, marker.producer_id, owner.txn_id, owner.state.name)
        return KafkaError.CONCURRENT_TRANSACTIONS
    entry = plog.producers.entry(marker.producer_id)
    if entry is None or entry.txn_first_offset is None:
        return KafkaError.NONE
    try:
        info = plog.append_control(records.CONTROL_ABORT, marker.producer_id, marker.producer_epoch,
                                   marker.coordinator_epoch)
        await ctx.services.committed.wait(topic, partition, plog, info.last_offset + 1, info.fsync_stamp)
    except StorageError as exc:
        log.error("admin abort marker on %s-%d failed: %s", topic, partition, exc)
        return KafkaError.KAFKA_STORAGE_ERROR
    except AppendError as exc:   # fenced: an older epoch or coordinator epoch
        return exc.error
    log.warning("admin abort: wrote an ABORT marker for producer %d (epoch %d) in %s-%d at offset %d",
                marker.producer_id, marker.producer_epoch, topic, partition, info.first_offset)
    ctx.services.notifier.notify(topic, partition)
    return KafkaError.NONE


def _coordinator_owner(ctx: RequestContext, producer_id: int, tp: tuple[str, int]) -> TxnMeta | None:
    """The coordinator's live transaction of producer_id that includes tp, if any."""
    for meta in _transactions(ctx):
        if meta.producer_id == producer_id and meta.state in LIVE and tp in meta.parts():
            return meta
    return None
