"""Transactions: InitProducerId (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25),
EndTxn (26), TxnOffsetCommit (28). Thin: decode, call the coordinator, encode."""
from __future__ import annotations

import logging
from typing import Any

from ...coordinator.partitioned import TxnCoordinators
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..refusal import refuse
from ..responses import by_topic
from ..router import RequestContext, handler
from .common import first_error

log = logging.getLogger("semel.broker.txn")


def _debug(api: str, txn_id: str | None, err: KafkaError) -> None:
    """One DEBUG line per refused transactional request (what chaos runs need to explain stalls)."""
    if err and log.isEnabledFor(logging.DEBUG):
        log.debug("%s txn=%s: %s", api, txn_id, KafkaError(err).name)


def _txns(ctx: RequestContext) -> TxnCoordinators:
    return ctx.services.txn_coordinator


@handler(ApiKey.INIT_PRODUCER_ID, 0, 4)
async def init_producer_id(ctx: RequestContext, req: Any) -> Any:
    pid = req.producer_id if ctx.api_version >= 3 else -1
    epoch = req.producer_epoch if ctx.api_version >= 3 else -1
    err, pid, epoch = await _txns(ctx).init_producer_id(req.transactional_id, req.transaction_timeout_ms,
                                                        pid, epoch, ctx.api_version)
    _debug("InitProducerId", req.transactional_id, err)
    return ctx.response(throttle_time_ms=0, error_code=err, producer_id=pid, producer_epoch=epoch)


@handler(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 3)
async def add_partitions_to_txn(ctx: RequestContext, req: Any) -> Any:
    wanted = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
    result = await _txns(ctx).add_partitions(req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
                                             req.v3_and_below_producer_epoch, wanted, ctx.api_version)
    _debug("AddPartitionsToTxn", req.v3_and_below_transactional_id, first_error(result))
    T = ctx.cls().AddPartitionsToTxnTopicResult
    grouped = by_topic(result.items(), lambda p, err: T.AddPartitionsToTxnPartitionResult(
        partition_index=p, partition_error_code=err))
    topics = [T(name=name, results_by_partition=parts) for name, parts in grouped.items()]
    return ctx.response(throttle_time_ms=0, results_by_topic_v3_and_below=topics)


@handler(ApiKey.ADD_OFFSETS_TO_TXN, 0, 3)
async def add_offsets_to_txn(ctx: RequestContext, req: Any) -> Any:
    err = await _txns(ctx).add_offsets(req.transactional_id, req.producer_id, req.producer_epoch,
                                       req.group_id, ctx.api_version)
    _debug("AddOffsetsToTxn", req.transactional_id, err)
    return ctx.response(throttle_time_ms=0, error_code=err)


@handler(ApiKey.END_TXN, 0, 3)
async def end_txn(ctx: RequestContext, req: Any) -> Any:
    err = await _txns(ctx).end_txn(req.transactional_id, req.producer_id, req.producer_epoch,
                                   req.committed, ctx.api_version)
    _debug("EndTxn", req.transactional_id, err)
    return ctx.response(throttle_time_ms=0, error_code=err)


@handler(ApiKey.TXN_OFFSET_COMMIT, 0, 3)
async def txn_offset_commit(ctx: RequestContext, req: Any) -> Any:
    offsets = {(t.name, p.partition_index): (p.committed_offset,
                                             p.committed_leader_epoch if ctx.api_version >= 2 else -1,
                                             p.committed_metadata)
               for t in req.topics for p in t.partitions}
    err = _txns(ctx).verify_offsets(req.transactional_id, req.producer_id, req.producer_epoch, ctx.api_version,
                                    group_id=req.group_id)
    if err:
        _debug("TxnOffsetCommit", req.transactional_id, err)
        return refuse(ctx, req, err)
    generation = req.generation_id if ctx.api_version >= 3 else -1
    member = req.member_id if ctx.api_version >= 3 else ""
    instance = req.group_instance_id if ctx.api_version >= 3 else None
    result = await ctx.services.group_coordinator.txn_commit_offsets(
        req.producer_id, req.producer_epoch, req.group_id, generation, member, instance, offsets)
    _debug("TxnOffsetCommit", req.transactional_id, first_error(result))
    T = ctx.cls().TxnOffsetCommitResponseTopic
    grouped = by_topic(result.items(), lambda p, err: T.TxnOffsetCommitResponsePartition(
        partition_index=p, error_code=err))
    return ctx.response(throttle_time_ms=0, topics=[T(name=n, partitions=ps) for n, ps in grouped.items()])
