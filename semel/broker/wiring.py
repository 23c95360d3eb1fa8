"""Builds the coordinators and the replica manager, choosing what they are given: the
one place that does.

A coordinator depends only on the interfaces of semel.coordinator.ports. The
coordinators have one shape (semel.coordinator.partitioned): one coordinator per
partition of __transaction_state and __consumer_offsets, a single node having one
partition of each. On a single node the ports are the broker's own: the producer-id
file as ProducerIdSource, a LocalSeat (the coordinator loads its log when the seat
starts and always serves) and LocalMarkers as MarkerWriter (every partition is led
here). In a cluster each partition's coordinator gets the cluster's implementations: a
SeatedCoordinator as its seat, producer ids from etcd and markers sent to other leaders
through one MarkerChannel. Either way a coordinator's log and its markers are written through
semel.storage.committed (fsynced, then past the high watermark, which a single node,
a cluster of one, reaches at once).

The replication data plane (semel.cluster.replica_manager) is built here too, given
only what it uses of the broker: the cluster view, the logs, the FileSystem, the
readers' notifier, the peer dialer and the replica settings.
"""
from __future__ import annotations

from dataclasses import replace

from ..cluster.coordinator_host import SeatedCoordinator
from ..cluster.hw_checkpoint import HW_FILE
from ..cluster.internal_topics import topic_partition_count
from ..cluster.member import ClusterMember, InternalTopic
from ..cluster.producer_ids import ClusterProducerIds
from ..cluster.replica_fetcher import FetchSettings
from ..cluster.replica_manager import ReplicaManager, ReplicaSettings
from ..cluster.topic_sync import deleted_names
from ..cluster.txn_markers import MarkerChannel
from ..coordinator.group import GroupCoordinator
from ..coordinator.group_model import GroupConfig
from ..coordinator.partitioned import GroupCoordinators, TxnCoordinators
from ..coordinator.ports import CoordinatorSeat, LocalMarkers, LocalSeat, MarkerWriter, ProducerIdSource
from ..coordinator.producer_ids import ProducerIdManager
from ..coordinator.txn import OFFSETS_TOPIC, TXN_TOPIC, TransactionCoordinator
from ..protocol.errors import KafkaError
from ..storage.committed import Committed, PartitionCommit
from ..storage.flusher import GroupCommitFlusher
from .config import BrokerConfig
from .services import Services


def group_config(c: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        initial_rebalance_delay_ms=c.group_initial_rebalance_delay_ms,
        min_session_timeout_ms=c.group_min_session_timeout_ms,
        max_session_timeout_ms=c.group_max_session_timeout_ms,
        consumer_heartbeat_interval_ms=c.group_consumer_heartbeat_interval_ms,
        consumer_session_timeout_ms=c.group_consumer_session_timeout_ms,
        consumer_migration_policy=c.group_consumer_migration_policy,
        offsets_retention_ms=c.offsets_retention_ms,
        compact_records=c.offsets_log_compact_records,
        segment_bytes=c.offsets_log_segment_bytes,
    )


def replica_settings(c: BrokerConfig) -> ReplicaSettings:
    return ReplicaSettings(
        lag_time_max_ms=c.replica_lag_time_max_ms,
        min_insync_replicas=c.min_insync_replicas,
        hw_checkpoint=c.data_dir / HW_FILE,
        fetch=FetchSettings(wait_ms=c.replica_fetch_wait_max_ms, max_bytes=c.replica_fetch_max_bytes,
                            write_thread_bytes=c.replica_write_thread_bytes,
                            request_timeout_s=c.request_timeout_ms / 1000),
    )


def build_replicas(broker) -> ReplicaManager:
    """The replication data plane of a cluster member (after it joined the cluster)."""
    durable = broker.flusher.sync_each if broker.config.log.flush_mode == "always" else None
    return ReplicaManager(broker.cluster, broker.logs, broker.fs, broker.notifier.notify, broker.peer_dialer,
                          replica_settings(broker.config), durable=durable)


def build_groups(broker) -> GroupCoordinators:
    """The group coordinators, one per __consumer_offsets partition
    (semel.coordinator.partitioned.GroupCoordinators; one on a single node)."""
    config = group_config(broker.config)
    view, topic = broker.cluster, config.offsets_topic
    # Every write waits until committed (semel.storage.committed); sync_writes says only
    # whether the local fsync comes first.
    inner = broker.flusher if config.sync_writes else None
    seated = replace(config, sync_writes=True)
    deleted = None if view is None else (lambda: deleted_names(view))
    count = 1 if view is None else broker.config.offsets_topic_partitions
    parts = [GroupCoordinator(broker.logs, _committed(broker, inner, topic, p), seated,
                              seat=_seat(broker, topic, p, GroupCoordinator.log_configs(config)),
                              deleted_topics=deleted)
             for p in range(count)]
    return GroupCoordinators(parts, lambda: topic_partition_count(view, topic))


def build_txns(broker) -> TxnCoordinators:
    """The transaction coordinators, one per __transaction_state partition
    (semel.coordinator.partitioned.TxnCoordinators; one on a single node), sharing
    the producer-id pool and the marker writer. Needs `broker.group_coordinator` built."""
    cfg = broker.config
    view = broker.cluster
    pids: ProducerIdSource = ProducerIdManager(cfg.data_dir / "producer_ids", broker.fs)
    markers: MarkerWriter = LocalMarkers()
    count = 1
    if view is not None:
        pids = ClusterProducerIds(pids, view)   # ids from the cluster-wide counter
        markers = MarkerChannel(view, cfg.node_id, cfg.request_timeout_ms / 1000, broker.peer_dialer)
        count = cfg.transaction_state_partitions
    # Markers are always fsynced, whatever the flush policy, then replicated.
    markers_committed = Committed(broker.flusher, lambda: broker.high_watermarks, cfg.request_timeout_ms / 1000)
    configs = TransactionCoordinator.log_configs(cfg)
    parts = [TransactionCoordinator(broker.logs, _committed(broker, broker.flusher, TXN_TOPIC, p), broker.group_coordinator,
                                    cfg, pids, broker.notifier.notify, broker.metrics,
                                    markers=markers, seat=_seat(broker, TXN_TOPIC, p, configs),
                                    markers_committed=markers_committed, txn_partitions=count)
             for p in range(count)]
    return TxnCoordinators(parts, lambda: topic_partition_count(view, TXN_TOPIC))


def cluster_member(broker):
    """The broker's membership in its cluster (needs the cluster extra)."""

    def topics_deleted(names: set[str]) -> None:
        if broker.group_coordinator is not None:   # topics sync before the coordinators are built
            broker.group_coordinator.follow_deleted_topics(names)

    return ClusterMember(broker.config, broker.logs, listeners=lambda: broker.listeners,
                         replicas=lambda: broker.replicas,
                         internal_topic=lambda key_type: internal_topic(broker, key_type),
                         topics_deleted=topics_deleted)


def internal_topic(broker, key_type: int):
    """FindCoordinator's internal topic for `key_type` (1 transactions, else groups)."""
    if key_type == 1:
        return InternalTopic(TXN_TOPIC, TransactionCoordinator.log_configs(broker.config), broker.txn_coordinator)
    return InternalTopic(OFFSETS_TOPIC, GroupCoordinator.log_configs(broker.group_coordinator.config), broker.group_coordinator)


def _seat(broker, topic: str, partition: int, configs: dict[str, str]) -> CoordinatorSeat:
    """A single node leads every partition (LocalSeat, creating the topic with `configs`);
    a cluster member follows its partition's leadership."""
    if broker.cluster is None:
        return LocalSeat(broker.logs, topic, configs)
    return SeatedCoordinator(broker.cluster, broker.config.node_id, broker.logs, lambda: broker.replicas,
                             topic, partition)


def _committed(broker, inner: GroupCommitFlusher | None, topic: str, partition: int) -> PartitionCommit:
    """The writer of a coordinator partition's log: `inner`'s local fsync (None: none),
    then the high watermark (the replica manager starts after the coordinators: until
    then nothing is committed, NOT_COORDINATOR)."""
    return Committed(inner, lambda: broker.high_watermarks, broker.config.request_timeout_ms / 1000,
                     KafkaError.NOT_COORDINATOR).writer(topic, partition)


def build_services(broker) -> Services:
    """What handlers use, once every part exists (semel.broker.services)."""
    return Services(
        config=broker.config, logs=broker.logs, flusher=broker.flusher, notifier=broker.notifier,
        metrics=broker.metrics, group_coordinator=broker.group_coordinator, txn_coordinator=broker.txn_coordinator,
        authorizer=broker.authorizer, users=broker.users, acls=broker.acls, broker_configs=broker.broker_configs,
        cluster=broker.cluster, metadata=broker.metadata_view, coordinators_at=broker.coordinators_at, replicas=broker.replicas,
        oauth_signed=broker.oauth_signed, committed=broker.committed)
