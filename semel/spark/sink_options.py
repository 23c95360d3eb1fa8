"""The exactly-once sink's resolved options and its one error type.

Parsed from Spark's options by semel.spark.sink.parse_options; every module of the
sink (routing, decision, branch writer) takes a SinkOptions.
"""
from __future__ import annotations

from dataclasses import dataclass

from semel.spark import options as opt
from semel.spark.security import PLAINTEXT, Security

TP = tuple[str, int]

# Bytes of records per produce request: under Kafka's default message.max.bytes (1 MiB + 12).
MAX_REQUEST_BYTES = 1000 * 1000
DEFAULT_RESTART_WINDOW_MS = 15 * 60 * 1000  # Kafka's default transaction.max.timeout.ms


class SinkError(Exception):
    """A sink failure with one readable line (bad option, bad schema, broker refusal)."""


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    group: str
    parent: str
    topic: str | None
    checkpoint: str | None
    restart_window_ms: int
    request_timeout_ms: int
    batch_rows: int
    atomic_mode: str = "auto"
    atomic: bool = False  # mode (a), resolved against the broker at query start (probe)
    # Spark's query id (`<checkpoint>/metadata`), read on the driver side: the lineage the
    # batch numbers of a decision belong to (see _decision_in)
    query: str | None = None
    # Hadoop `fs.*` settings to open the checkpoint with (driver side; never sent to tasks)
    fs: tuple[tuple[str, str], ...] = ()
    security: Security = PLAINTEXT  # TLS and SASL of every connection (semel/spark/security.py)
    producer: opt.ProducerOptions = opt.ProducerOptions()

    @property
    def batch_bytes(self) -> int:
        """Bytes of keys and values per record batch: kafka.batch.size, within a request's cap."""
        return min(self.producer.batch_bytes or MAX_REQUEST_BYTES, MAX_REQUEST_BYTES)
