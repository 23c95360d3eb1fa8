"""Admin-client helpers for tests that check which Kafka error an operation ends in."""
from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


def error_code(fut, timeout_s: float = 30) -> int:
    """The Kafka error code a confluent-kafka admin future ends in (NO_ERROR on success)."""
    try:
        fut.result(timeout_s)
    except KafkaException as exc:
        return exc.args[0].code()
    return KafkaError.NO_ERROR


def commit_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit {partition: offset} for `group` outside group management (confluent-kafka)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def committed_offsets(bootstrap: str, group: str, topic: str, parts: int) -> dict[int, int]:
    """{partition: committed offset} of `group` as OffsetFetch answers it to confluent-kafka
    (OFFSET_INVALID, -1001, where the broker answers -1: nothing committed)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(parts)], 30)}
    finally:
        c.close()
