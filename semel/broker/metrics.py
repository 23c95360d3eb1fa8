"""Broker metrics (Prometheus). A private registry so several brokers can run in one process (tests).

Names follow seed 000's monitoring section under our prefix:

- semel_transactions_started_total / _committed_total / _aborted_total / _timed_out_total:
  counted by the transaction coordinator through `txn_transition` and `txn_timed_out`
  when a transition is applied after its append (never during replay at start, so a
  restart begins again at zero like any Prometheus counter). A transaction that
  timed out is counted in both timed_out and aborted.
- semel_transactions_active: transactional ids whose transaction is open or being
  completed (Ongoing, PrepareCommit, PrepareAbort), read from the coordinator at scrape.
- semel_idempotent_producers_active: distinct producer ids remembered by the
  producer state of any (non-internal) partition, read at scrape.
- semel_idempotent_duplicates_total: Produce retries answered from producer state.
- semel_not_enough_replicas_total{topic}: acks=all writes refused with NOT_ENOUGH_REPLICAS.

Per API: semel_requests_total{api} (its rate is the request rate), the
semel_request_seconds{api} latency histogram (frame read to response written) and
semel_request_stage_seconds{api,stage}, the same time split by stage
(broker.request_times). semel_bytes_in_total / semel_bytes_out_total count request
and response frames. Per partition, read at
scrape: semel_partition_high_watermark, semel_partition_last_stable_offset and
semel_partition_lso_gap (their difference: records a read_committed reader waits for).
Per partition the broker leads: semel_partition_isr_size and semel_partition_replicas,
and their count semel_under_replicated_partitions (1, 1 and 0 on a single node).

Event loop (broker.watchdog): semel_event_loop_lag_seconds (histogram of how late the
loop woke a sleeping task, sampled continuously) and semel_event_loop_lag_max_seconds
(the largest lag since start); semel_connections_rejected_total{reason} counts
connections refused or dropped by a limit (total, per address, idle, stalled frame).

For the security layer: `failed_logins` (semel_failed_logins_total{mechanism}),
`reauthentications` (semel_successful_reauthentications_total{mechanism}) and
`authorization_denials` (semel_authorization_denials_total{operation,resource_type});
call `.labels(...).inc()` where a login fails or an ACL check denies.
"""
from __future__ import annotations

import logging
from typing import Iterable, Iterator, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..coordinator.partitioned import TxnCoordinators
from ..coordinator.share_coordinator import ShareCoordinator
from ..coordinator.txn_states import PREPARED, TxnState
from ..storage.manager import LogManager
from .local_replicas import NOTHING_LED, LocalReplicas
from .request_times import ApiTimes, RequestTimes

log = logging.getLogger("semel.broker.metrics")

# States in which a transaction is "active" for semel_transactions_active.
ACTIVE_STATES = frozenset({TxnState.ONGOING}) | PREPARED


class BrokerState(Protocol):
    """What the scrape-time gauges read of the broker (semel.broker.server.Broker, which
    imports this module)."""
    @property
    def txn_coordinator(self) -> TxnCoordinators | None: ...

    @property
    def logs(self) -> LogManager: ...

    @property
    def share_coordinator(self) -> ShareCoordinator | None: ...


class BrokerMetrics:
    def __init__(self, broker: BrokerState | None = None) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("semel_requests_total", "Requests handled", ["api"], registry=self.registry)
        self.request_errors = Counter("semel_request_errors_total", "Kafka error codes returned",
                                      ["api", "error"], registry=self.registry)
        self.bad_frames = Counter("semel_bad_frames_total", "Connections closed for malformed input",
                                  registry=self.registry)
        self.produced_bytes = Counter("semel_produced_bytes_total", "Bytes appended by Produce",
                                      registry=self.registry)
        # acks=all writes refused because the ISR is below min.insync.replicas, per topic:
        # a topic whose replication factor is below it counts up on every retry.
        self.not_enough_replicas = Counter("semel_not_enough_replicas_total",
                                           "acks=all writes refused with NOT_ENOUGH_REPLICAS", ["topic"],
                                           registry=self.registry)
        self.duplicate_batches = Counter("semel_idempotent_duplicates_total",
                                         "Produce retries recognised as duplicates", registry=self.registry)
        self.request_times = RequestTimes()
        self.registry.register(self.request_times)
        self.bytes_in = Counter("semel_bytes_in_total", "Bytes of request frames received",
                                registry=self.registry)
        self.bytes_out = Counter("semel_bytes_out_total", "Bytes of response frames sent",
                                 registry=self.registry)
        self.txn_started = Counter("semel_transactions_started_total", "Transactions begun (first partition "
                                   "or offsets added)", registry=self.registry)
        self.txn_committed = Counter("semel_transactions_committed_total", "Transactions committed",
                                     registry=self.registry)
        self.txn_aborted = Counter("semel_transactions_aborted_total", "Transactions aborted (by the client, "
                                   "a fencing instance or a timeout)", registry=self.registry)
        self.txn_timeouts = Counter("semel_transactions_timed_out_total", "Transactions aborted by the "
                                    "coordinator because they outlived their timeout", registry=self.registry)
        self.failed_logins = Counter("semel_failed_logins_total", "SASL authentications that failed",
                                     ["mechanism"], registry=self.registry)
        self.reauthentications = Counter("semel_successful_reauthentications_total", "SASL re-logins on an "
                                         "authenticated connection (KIP-368)", ["mechanism"],
                                         registry=self.registry)
        self.authorization_denials = Counter("semel_authorization_denials_total", "Requests or resources "
                                             "denied by ACLs", ["operation", "resource_type"],
                                             registry=self.registry)
        self.loop_lag = Histogram("semel_event_loop_lag_seconds", "How late the event loop woke a sleeping "
                                  "task (time some handler or task held the loop)", registry=self.registry,
                                  buckets=(.001, .005, .01, .025, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60))
        self.loop_lag_max = Gauge("semel_event_loop_lag_max_seconds", "Largest event loop lag since start",
                                  registry=self.registry)
        self.connections_rejected = Counter("semel_connections_rejected_total", "Connections refused or "
                                            "closed by a limit", ["reason"], registry=self.registry)
        self._loop_lag_max = 0.0
        self._per_api: dict[str, tuple[Counter, ApiTimes]] = {}
        self._state = _BrokerStateCollector(broker)
        self.registry.register(self._state)

    def api(self, name: str) -> tuple[Counter, ApiTimes]:
        """(semel_requests_total, its latency by stage) of one API, labelled once:
        labels() takes a lock and builds its key each time, and every request counts
        itself in both."""
        pair = self._per_api.get(name)
        if pair is None:
            pair = self._per_api[name] = (self.requests.labels(name), self.request_times.api(name))
        return pair

    def report_replicas(self, replicas: LocalReplicas) -> None:
        """Where the replication gauges come from once the broker serves (semel.broker.wiring)."""
        self._state.replicas = replicas

    def observe_loop_lag(self, lag_s: float) -> None:
        self.loop_lag.observe(lag_s)
        if lag_s > self._loop_lag_max:
            self._loop_lag_max = lag_s
            self.loop_lag_max.set(lag_s)

    # --- hooks the transaction coordinator calls after applying a logged transition ---------

    def txn_transition(self, previous: TxnState | None, new: TxnState) -> None:
        if new == TxnState.ONGOING and previous != TxnState.ONGOING:
            self.txn_started.inc()
        elif new == TxnState.COMPLETE_COMMIT and previous != TxnState.COMPLETE_COMMIT:
            self.txn_committed.inc()
        elif new == TxnState.COMPLETE_ABORT and previous != TxnState.COMPLETE_ABORT:
            self.txn_aborted.inc()

    def txn_timed_out(self) -> None:
        self.txn_timeouts.inc()

    def serve(self, host: str, port: int) -> None:
        start_http_server(port, addr=host, registry=self.registry)


class _BrokerStateCollector(Collector):
    """Gauges read from broker state when Prometheus scrapes (in the HTTP server's
    thread: it only reads, and copies containers before iterating them)."""

    def __init__(self, broker: BrokerState | None) -> None:
        self.broker = broker
        # This broker's replicas (BrokerMetrics.report_replicas); before it serves, none.
        self.replicas: LocalReplicas = NOTHING_LED

    def describe(self) -> Iterable[Metric]:
        return []   # gauges appear once a broker is bound; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        if broker is None:
            return
        try:
            yield from self._collect(broker)
        except RuntimeError as exc:   # a dict changed size under us: skip this scrape's gauges
            log.debug("metrics scrape skipped broker gauges: %s", exc)

    def _collect(self, broker: BrokerState) -> Iterator[Metric]:
        active = GaugeMetricFamily("semel_transactions_active", "Transactions open or being completed")
        txns = broker.txn_coordinator   # None until the coordinators are built
        metas = txns.transactions() if txns is not None else []
        active.add_metric([], sum(1 for m in metas if m.state in ACTIVE_STATES))
        yield active
        # (the metrics port opens once the logs are: Broker.logs is never unset here)
        parts = list(broker.logs.all_logs())
        hw = GaugeMetricFamily("semel_partition_high_watermark", "High watermark", labels=["topic", "partition"])
        lso = GaugeMetricFamily("semel_partition_last_stable_offset", "Last stable offset",
                                labels=["topic", "partition"])
        gap = GaugeMetricFamily("semel_partition_lso_gap", "High watermark minus last stable offset",
                                labels=["topic", "partition"])
        producers: set[int] = set()
        for (topic, partition), plog in parts:
            if topic.startswith("__"):
                continue
            labels = [topic, str(partition)]
            h, s = plog.high_watermark, plog.last_stable_offset
            hw.add_metric(labels, h)
            lso.add_metric(labels, s)
            gap.add_metric(labels, h - s)
            producers.update(plog.producers.producer_ids())
        idem = GaugeMetricFamily("semel_idempotent_producers_active",
                                 "Distinct producer ids with state in some partition")
        idem.add_metric([], len(producers))
        yield from (hw, lso, gap, idem)
        yield from self._share_groups(broker.share_coordinator)
        yield from self._replication()

    @staticmethod
    def _share_groups(share: ShareCoordinator | None) -> Iterator[Metric]:
        """Per share group, its records by state over the window of every share-partition
        (finished ones count until the start offset passes them)."""
        records = GaugeMetricFamily("semel_share_group_records",
                                    "Records of a share group's windows by state (in_flight: the whole window)",
                                    labels=["group", "state"])
        if share is None:
            return
        for group in share.groups():
            totals: dict[str, int] = {}
            for part in share.describe(group)["partitions"]:
                for state in ("in_flight", "available", "acquired", "acknowledged", "archived"):
                    totals[state] = totals.get(state, 0) + part[state]
            for state, n in sorted(totals.items()):
                records.add_metric([group, state], n)
        yield records

    def _replication(self) -> Iterator[Metric]:
        """Per partition this broker leads: its ISR and replica counts, and how many of
        them are under-replicated (each leader reports its own, so a cluster's total is
        the sum over brokers; a single node leads every partition with an ISR of one)."""
        leading = self.replicas.led()
        isr = GaugeMetricFamily("semel_partition_isr_size", "In-sync replicas of a partition led here",
                                labels=["topic", "partition"])
        size = GaugeMetricFamily("semel_partition_replicas", "Replicas of a partition led here",
                                 labels=["topic", "partition"])
        under = GaugeMetricFamily("semel_under_replicated_partitions",
                                  "Partitions led here whose ISR is smaller than their replica set")
        for st in leading:
            isr.add_metric([st.topic, str(st.partition)], len(st.isr))
            size.add_metric([st.topic, str(st.partition)], len(st.replicas))
        under.add_metric([], sum(1 for st in leading if len(st.isr) < len(st.replicas)))
        yield from (isr, size, under)
