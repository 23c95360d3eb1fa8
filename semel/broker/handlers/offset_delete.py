"""OffsetDelete (47): drop a group's committed offsets for some partitions, through
the group coordinator's offsets API (tombstones in __consumer_offsets)."""
from __future__ import annotations

from typing import Any

from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..refusal import refuse
from ..responses import by_topic
from ..router import RequestContext, handler
from .groups import answer_when_done


def subscribed_topics(metadata: bytes) -> set[str]:
    """Topics in a consumer member's subscription; unreadable metadata subscribes to
    nothing we can name (Kafka treats it the same way: no topic is protected)."""
    try:
        return set(ConsumerProtocolSubscription.decode(metadata).topics or ())
    except Exception:  # a client's bytes: anything may be in them
        return set()


@handler(ApiKey.OFFSET_DELETE, 0, 0)
async def offset_delete(ctx: RequestContext, req: Any) -> Any:
    order = [(t.name, p.partition_index) for t in req.topics for p in t.partitions]
    fut = ctx.services.group_coordinator.delete_offsets(req.group_id, list(dict.fromkeys(order)), subscribed_topics)

    def build(result: Any) -> Any:
        err, per_partition = result
        T = ctx.cls().OffsetDeleteResponseTopic
        P = T.OffsetDeleteResponsePartition
        if err:  # a group-level error leaves the partition list empty, as in Kafka
            return refuse(ctx, req, err)
        grouped = by_topic(((tp, per_partition.get(tp, KafkaError.NONE)) for tp in dict.fromkeys(order)),
                           lambda p, e: P(partition_index=p, error_code=e))
        return ctx.response(error_code=KafkaError.NONE, throttle_time_ms=0,
                            topics=[T(name=n, partitions=ps) for n, ps in grouped.items()])
    return answer_when_done(fut, build)
