"""NOT_COORDINATOR from brokers that do not coordinate.

In a cluster the transaction coordinator of a transactional id is the leader of its
`__transaction_state` partition, the group coordinator of a group id the leader of its
`__consumer_offsets` partition (semel.cluster.coordinator_partitions). Each request is
gated on the seat of its id's partition, whose error value (`error_for`) this module
turns into the API's refusal: a broker that does not lead that partition
answers NOT_COORDINATOR, one still loading it COORDINATOR_LOAD_IN_PROGRESS,
so a client holding an old coordinator looks it up again instead of splitting a group
or a transactional id across two brokers. Each refusal has its API's response shape:
one top-level error code, or the error on every partition the request named. A single
node's coordinators have one partition each, on a seat that always serves.
"""
from __future__ import annotations

from ..protocol.api_keys import ApiKey
from .responses import by_topic


def _top_level(ctx, body, E):
    return ctx.response(error_code=E)


def _offset_commit(ctx, body, E):
    T = ctx.cls().OffsetCommitResponseTopic
    grouped = by_topic((((t.name, p.partition_index), E) for t in body.topics or () for p in t.partitions or ()),
                       lambda p, err: T.OffsetCommitResponsePartition(partition_index=p, error_code=err))
    return ctx.response(topics=[T(name=n, partitions=ps) for n, ps in grouped.items()])


def _offset_fetch(ctx, body, E):
    T = ctx.cls().OffsetFetchResponseTopic
    wanted = (((t.name, p), E) for t in body.topics or () for p in t.partition_indexes or ())
    grouped = by_topic(wanted, lambda p, err: T.OffsetFetchResponsePartition(
        partition_index=p, committed_offset=-1, committed_leader_epoch=-1, metadata="", error_code=err))
    return ctx.response(topics=[T(name=n, partitions=ps) for n, ps in grouped.items()], error_code=E)


def _add_partitions(ctx, body, E):
    T = ctx.cls().AddPartitionsToTxnTopicResult
    grouped = by_topic((((t.name, p), E) for t in body.v3_and_below_topics for p in t.partitions),
                       lambda p, err: T.AddPartitionsToTxnPartitionResult(partition_index=p,
                                                                          partition_error_code=err))
    return ctx.response(throttle_time_ms=0,
                        results_by_topic_v3_and_below=[T(name=n, results_by_partition=ps) for n, ps in grouped.items()])


def _txn_offset_commit(ctx, body, E):
    T = ctx.cls().TxnOffsetCommitResponseTopic
    grouped = by_topic((((t.name, p.partition_index), E) for t in body.topics for p in t.partitions),
                       lambda p, err: T.TxnOffsetCommitResponsePartition(partition_index=p, error_code=err))
    return ctx.response(throttle_time_ms=0, topics=[T(name=n, partitions=ps) for n, ps in grouped.items()])


def _consumer_group_heartbeat(ctx, body, E):
    return ctx.response(throttle_time_ms=0, error_code=E, member_id=body.member_id or None,
                        member_epoch=-1, heartbeat_interval_ms=0, assignment=None)


# api key -> refusal. InitProducerId only with a transactional id: idempotent
# producer ids come from any broker.
REFUSALS = {
    ApiKey.OFFSET_COMMIT: _offset_commit, ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.JOIN_GROUP: _top_level, ApiKey.HEARTBEAT: _top_level, ApiKey.LEAVE_GROUP: _top_level,
    ApiKey.SYNC_GROUP: _top_level, ApiKey.INIT_PRODUCER_ID: _top_level,
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions, ApiKey.ADD_OFFSETS_TO_TXN: _top_level, ApiKey.END_TXN: _top_level,
    ApiKey.TXN_OFFSET_COMMIT: _txn_offset_commit,
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _consumer_group_heartbeat,
}


# The transaction coordinator's APIs; every other one above is the group coordinator's
# (TxnOffsetCommit included: it writes to __consumer_offsets).
TXN_APIS = frozenset({ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN,
                      ApiKey.END_TXN})


def coordinator_key(api_key: int, body) -> str | None:
    """The id whose partition's coordinator must serve the request."""
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        return body.v3_and_below_transactional_id
    return body.transactional_id if api_key in TXN_APIS else body.group_id


def coordinator_guard(broker, fn):
    """The handler `fn`, refusing the coordinator requests this broker must not serve now."""
    async def guarded(ctx, body):
        refuse = REFUSALS.get(ctx.api_key)
        if refuse is not None and (ctx.api_key != ApiKey.INIT_PRODUCER_ID or body.transactional_id is not None):
            coordinators = broker.txns if ctx.api_key in TXN_APIS else broker.groups
            err = coordinators.error_for(coordinator_key(ctx.api_key, body))
            if err:
                return refuse(ctx, body, err)
        return await fn(ctx, body)
    guarded.__name__ = fn.__name__
    return guarded
