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
