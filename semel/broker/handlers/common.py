"""Small pieces shared by handler modules."""
from __future__ import annotations

from ...protocol.errors import KafkaError

def lookup(ctx, topic: str, partition: int):
    """(log, error): the partition's log, auto-creating the topic when configured."""
    logs = ctx.broker.logs
    plog = logs.get(topic, partition)
    if plog is not None:
        return plog, KafkaError.NONE
    if topic not in logs.topics() and ctx.broker.config.auto_create_topics and not topic.startswith("__"):
        err = logs.create_topic(topic, ctx.broker.config.default_partitions, {})
        if err not in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS):
            return None, err
        plog = logs.get(topic, partition)
        if plog is not None:
            return plog, KafkaError.NONE
    return None, KafkaError.UNKNOWN_TOPIC_OR_PARTITION
