"""Broker configuration: one dataclass, defaults close to Kafka's where they matter."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..storage.log import LogConfig


@dataclass
class BrokerConfig:
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 9092
    advertised_host: str | None = None
    node_id: int = 0
    cluster_id: str = "semel-cluster"
    # Requests larger than this close the connection (Kafka: socket.request.max.bytes).
    max_request_bytes: int = 100 * 1024 * 1024
    # A single produce payload per partition larger than this: MESSAGE_TOO_LARGE.
    max_message_bytes: int = 8 * 1024 * 1024
    # Largest Fetch response (the first partition may still exceed it by one batch).
    max_fetch_response_bytes: int = 4 * 1024 * 1024
    auto_create_topics: bool = False
    default_partitions: int = 1
    log: LogConfig = field(default_factory=LogConfig)
    retention_check_interval_ms: int = 60_000
    # Consumer groups
    group_initial_rebalance_delay_ms: int = 300
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_log_compact_records: int = 50_000
    offsets_log_segment_bytes: int = 8 * 1024 * 1024
    # Transactions
    transaction_max_timeout_ms: int = 900_000
    transactional_id_expiration_ms: int = 7 * 24 * 3600 * 1000
    # (idle idempotent producers expire per partition: log.producer_id_expiration_ms,
    #  checked with retention every retention_check_interval_ms)
    transaction_abort_check_interval_ms: int = 1_000
    # Coordinator log compaction: rewrite live state once this many records piled up
    # (or 4x the live ids), in segments of this size so old ones can be dropped.
    transaction_log_compact_records: int = 50_000
    transaction_log_segment_bytes: int = 8 * 1024 * 1024
    metrics_port: int | None = None
    # --- limits on what one client can take (issue 14) ---
    # Kafka's max.connections and max.connections.per.ip (both unlimited there by
    # default; over the limit the new connection is closed at once).
    max_connections: int = 2**31 - 1
    max_connections_per_ip: int = 2**31 - 1
    # Kafka's connections.max.idle.ms: a connection with no request for this long is closed.
    connections_max_idle_ms: int = 600_000
    # A frame whose bytes stop arriving half-way is dropped after this (Kafka's request.timeout.ms).
    request_timeout_ms: int = 30_000
    # Partitions one request may name (Produce, Fetch, ListOffsets, ...): more is INVALID_REQUEST
    # (or the connection closed for APIs without a per-partition error). Bounds the CPU one
    # request takes; far above what any client sends.
    max_partitions_per_request: int = 10_000
    # Event loop watchdog: log the holder past warn, log STALL_MARKER past stall.
    loop_lag_warn_ms: int = 200
    loop_stall_ms: int = 2_000

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host
