"""Small pieces shared by handler modules."""
from __future__ import annotations

from typing import Callable, Iterable

from ...protocol.errors import KafkaError


def by_topic(errors: Iterable[tuple[tuple[str, int], int]], make_partition: Callable) -> dict[str, list]:
    """Per-partition results grouped by topic in first-seen order, as responses
    nest them: {topic: [make_partition(partition, error), ...]}."""
    grouped: dict[str, list] = {}
    for (topic, partition), err in errors:
        grouped.setdefault(topic, []).append(make_partition(partition, KafkaError(err)))
    return grouped


def first_error(errors: dict) -> KafkaError:
    return next((KafkaError(e) for e in errors.values() if e), KafkaError.NONE)


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
