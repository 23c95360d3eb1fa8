"""NOT_COORDINATOR from brokers that do not coordinate.

In a cluster the transaction coordinator of a transactional id is the leader of its
`__transaction_state` partition, the group coordinator of a group id the leader of its
`__consumer_offsets` partition (semel.coordinator.partitioned). Each request is
gated on the seat of its id's partition, whose error value (`error_for`) this module
turns into the API's refusal (semel.broker.refusal): a broker that does not lead that
partition answers NOT_COORDINATOR, one still loading it COORDINATOR_LOAD_IN_PROGRESS,
so a client holding an old coordinator looks it up again instead of splitting a group
or a transactional id across two brokers. A single node's coordinators have one
partition each, on a seat that always serves.
"""
from __future__ import annotations

import functools
from typing import Any

from ..protocol.api_keys import ApiKey
from .refusal import refuse
from .router import Handler, RequestContext

# The APIs served by a coordinator. InitProducerId only with a transactional id:
# idempotent producer ids come from any broker.
GATED = frozenset({
    ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.JOIN_GROUP, ApiKey.HEARTBEAT, ApiKey.LEAVE_GROUP,
    ApiKey.SYNC_GROUP, ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN,
    ApiKey.END_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.CONSUMER_GROUP_HEARTBEAT,
})


# The transaction coordinator's APIs; every other one above is the group coordinator's
# (TxnOffsetCommit included: it writes to __consumer_offsets).
TXN_APIS = frozenset({ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN,
                      ApiKey.END_TXN})


def coordinator_key(api_key: int, body: Any) -> str | None:
    """The id whose partition's coordinator must serve the request."""
    if api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
        key: str | None = body.v3_and_below_transactional_id
    else:
        key = body.transactional_id if api_key in TXN_APIS else body.group_id
    return key


@functools.cache
def coordinator_guard(fn: Handler) -> Handler:
    """The handler `fn`, refusing the coordinator requests this broker must not serve now;
    built once per handler (cached) and given the coordinators by each request's context."""
    async def guarded(ctx: RequestContext, body: Any) -> Any:
        several = ctx.api_key == ApiKey.OFFSET_FETCH and ctx.api_version >= 8   # the handler asks each group's
        if (ctx.api_key in GATED and not several
                and (ctx.api_key != ApiKey.INIT_PRODUCER_ID or body.transactional_id is not None)):
            services = ctx.services
            coordinators = services.txn_coordinator if ctx.api_key in TXN_APIS else services.group_coordinator
            err = coordinators.error_for(coordinator_key(ctx.api_key, body))
            if err:
                return refuse(ctx, body, err)
        return await fn(ctx, body)
    guarded.__name__ = fn.__name__
    return guarded
