"""Broker metrics (Prometheus). A private registry so several brokers can run in one process (tests)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("semel_requests_total", "Requests handled", ["api"], registry=self.registry)
        self.request_errors = Counter("semel_request_errors_total", "Kafka error codes returned",
                                      ["api", "error"], registry=self.registry)
        self.bad_frames = Counter("semel_bad_frames_total", "Connections closed for malformed input",
                                  registry=self.registry)
        self.produced_bytes = Counter("semel_produced_bytes_total", "Bytes appended by Produce",
                                      registry=self.registry)
        self.duplicate_batches = Counter("semel_idempotent_duplicates_total",
                                         "Produce retries recognised as duplicates", registry=self.registry)
        self.request_seconds = Histogram("semel_request_seconds", "Request latency", ["api"],
                                         registry=self.registry)

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)
