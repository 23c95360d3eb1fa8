"""DeleteRecords (21): move a partition's log start offset (its low watermark) up."""
from __future__ import annotations

from typing import Any

from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.errors import OffsetOutOfRange, StorageError
from ..router import RequestContext, handler

HIGH_WATERMARK = -1  # the request's "up to the high watermark"


@handler(ApiKey.DELETE_RECORDS, 0, 2)
async def delete_records(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    T = cls.DeleteRecordsTopicResult
    topics = []
    for t in req.topics:
        parts = [T.DeleteRecordsPartitionResult(partition_index=p.partition_index,
                                                **_delete_one(ctx, t.name, p.partition_index, p.offset))
                 for p in t.partitions]
        topics.append(T(name=t.name, partitions=parts))
    return ctx.response(throttle_time_ms=0, topics=topics)


def _delete_one(ctx: RequestContext, topic: str, partition: int, offset: int) -> dict[str, Any]:
    """{low_watermark, error_code} for one partition, with Kafka's errors."""
    logs = ctx.services.logs
    info = logs.topics().get(topic)
    plog = logs.get(topic, partition) if info is not None else None
    if plog is None or info is None:
        return _fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
    if "delete" not in info.cleanup_policy.split(","):
        # Kafka: deleting records of a compact-only topic is a policy violation.
        return _fail(KafkaError.POLICY_VIOLATION)
    target = plog.high_watermark if offset == HIGH_WATERMARK else offset
    try:
        low = plog.delete_records_before(target)
    except OffsetOutOfRange:
        return _fail(KafkaError.OFFSET_OUT_OF_RANGE)
    except StorageError:
        return _fail(KafkaError.KAFKA_STORAGE_ERROR)
    return {"low_watermark": low, "error_code": KafkaError.NONE}


def _fail(err: KafkaError) -> dict[str, Any]:
    return {"low_watermark": -1, "error_code": err}
