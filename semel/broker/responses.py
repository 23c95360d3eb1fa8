"""Shapes that the responses of several APIs share, for the handlers and for the
refusals (semel.broker.refusal)."""
from __future__ import annotations

from typing import Any, Callable, Iterable

from ..protocol.errors import KafkaError


def by_topic(errors: Iterable[tuple[tuple[str, int], int]],
             make_partition: Callable[[int, KafkaError], Any]) -> dict[str, list[Any]]:
    """Per-partition results grouped by topic in first-seen order, as responses
    nest them: {topic: [make_partition(partition, error), ...]}."""
    grouped: dict[str, list[Any]] = {}
    for (topic, partition), err in errors:
        grouped.setdefault(topic, []).append(make_partition(partition, KafkaError(err)))
    return grouped
