"""Builds the coordinators and the replica manager, choosing what they are given: the
one place that does.

A coordinator depends only on the interfaces of semel.coordinator.ports. On a single
node they are the broker's own: the group-commit flusher as PartitionWriter, the
producer-id file as ProducerIdSource, no seat (the coordinator loads its one log at
start and always serves) and LocalMarkers as MarkerWriter (every partition is led
here). In a
cluster each partition of __transaction_state and __consumer_offsets gets its own
coordinator with the cluster's implementations: a SeatedCoordinator as its seat, a
ReplicatedFlusher (acks=all) as the writer of its log, producer ids from etcd and
markers sent to other leaders through one MarkerChannel.

The replication data plane (semel.cluster.replica_manager) is built here too, given
only what it uses of the broker: the cluster view, the logs, the FileSystem, the
readers' notifier, the peer dialer and the replica settings.
"""
from __future__ import annotations

from dataclasses import replace

from ..cluster.coordinator_host import SeatedCoordinator
from ..cluster.coordinator_partitions import GroupCoordinators, TxnCoordinators, topic_partition_count
from ..cluster.hw_checkpoint import HW_FILE
from ..cluster.member import ClusterMember, InternalTopic
from ..cluster.producer_ids import ClusterProducerIds
from ..cluster.replica_fetcher import FetchSettings
from ..cluster.replica_manager import ReplicaManager, ReplicaSettings
from ..cluster.replicated_flusher import ReplicatedFlusher
from ..cluster.topic_sync import deleted_names
from ..cluster.txn_markers import MarkerChannel
from ..coordinator.group import GroupCoordinator
from ..coordinator.group_model import GroupConfig
from ..coordinator.ports import LocalMarkers
from ..coordinator.producer_ids import ProducerIdManager
from ..coordinator.txn import OFFSETS_TOPIC, TXN_TOPIC, TransactionCoordinator
from .config import BrokerConfig
from .services import Services


def group_config(c: BrokerConfig) -> GroupConfig:
    return GroupConfig(
        initial_rebalance_delay_ms=c.group_initial_rebalance_delay_ms,
        min_session_timeout_ms=c.group_min_session_timeout_ms,
        max_session_timeout_ms=c.group_max_session_timeout_ms,
        consumer_heartbeat_interval_ms=c.group_consumer_heartbeat_interval_ms,
        consumer_session_timeout_ms=c.group_consumer_session_timeout_ms,
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


def build_groups(broker):
    """The group coordinator: the single node's one, or one per __consumer_offsets
    partition (semel.cluster.coordinator_partitions.GroupCoordinators)."""
    config = group_config(broker.config)
    if broker.cluster is None:
        return GroupCoordinator(broker.logs, broker.flusher, config)
    view, topic = broker.cluster, config.offsets_topic
    # Every write waits for the replicated high watermark (acks=all); sync_writes says
    # only whether the local fsync comes first.
    inner = broker.flusher if config.sync_writes else None
    seated = replace(config, sync_writes=True)
    parts = [GroupCoordinator(broker.logs, _replicated(broker, inner, topic, p), seated,
                              seat=_seat(broker, topic, p), deleted_topics=lambda: deleted_names(view))
             for p in range(broker.config.offsets_topic_partitions)]
    return GroupCoordinators(parts, lambda: topic_partition_count(view, topic))


def build_txns(broker):
    """The transaction coordinator: the single node's one, or one per __transaction_state
    partition (semel.cluster.coordinator_partitions.TxnCoordinators), sharing the
    producer-id pool and the marker channel. Needs `broker.groups` built."""
    cfg = broker.config
    pids = ProducerIdManager(cfg.data_dir / "producer_ids", broker.fs)
    if broker.cluster is None:
        return TransactionCoordinator(broker.logs, broker.flusher, broker.groups, cfg, pids,
                                      broker.notifier.notify, broker.metrics, markers=LocalMarkers())
    view = broker.cluster
    shared_pids = ClusterProducerIds(pids, view)   # ids from the cluster-wide counter
    markers = MarkerChannel(view, cfg.node_id, cfg.request_timeout_ms / 1000, broker.peer_dialer)
    count = cfg.transaction_state_partitions
    parts = [TransactionCoordinator(broker.logs, _replicated(broker, broker.flusher, TXN_TOPIC, p), broker.groups,
                                    cfg, shared_pids, broker.notifier.notify, broker.metrics,
                                    markers=markers, seat=_seat(broker, TXN_TOPIC, p),
                                    high_watermarks=lambda: broker.replicas, data_flusher=broker.flusher,
                                    txn_partitions=count)
             for p in range(count)]
    return TxnCoordinators(parts, lambda: topic_partition_count(view, TXN_TOPIC))


def cluster_member(broker):
    """The broker's membership in its cluster (needs the cluster extra)."""

    def topics_deleted(names: set[str]) -> None:
        if broker.groups is not None:   # topics sync before the coordinators are built
            broker.groups.follow_deleted_topics(names)

    return ClusterMember(broker.config, broker.logs, listeners=lambda: broker.listeners,
                         replicas=lambda: broker.replicas,
                         internal_topic=lambda key_type: internal_topic(broker, key_type),
                         topics_deleted=topics_deleted)


def internal_topic(broker, key_type: int):
    """FindCoordinator's internal topic for `key_type` (1 transactions, else groups)."""
    if key_type == 1:
        return InternalTopic(TXN_TOPIC, TransactionCoordinator.log_configs(broker.config), broker.txns)
    return InternalTopic(OFFSETS_TOPIC, GroupCoordinator.log_configs(broker.groups.config), broker.groups)


def _seat(broker, topic: str, partition: int):
    return SeatedCoordinator(broker.cluster, broker.config.node_id, broker.logs, lambda: broker.replicas,
                             topic, partition)


def _replicated(broker, inner, topic: str, partition: int):
    """The writer of a coordinator partition's log: `inner`'s local fsync (None: none),
    then the replicated high watermark (the replica manager starts after the coordinators)."""
    return ReplicatedFlusher(inner, lambda: broker.replicas, topic, partition,
                             broker.config.request_timeout_ms / 1000)


def build_services(broker) -> Services:
    """What handlers use, once every part exists (semel.broker.services)."""
    return Services(
        config=broker.config, logs=broker.logs, flusher=broker.flusher, notifier=broker.notifier,
        metrics=broker.metrics, group_coordinator=broker.groups, txn_coordinator=broker.txns,
        authorizer=broker.authorizer, users=broker.users, acls=broker.acls, broker_configs=broker.broker_configs,
        cluster=broker.cluster, cluster_member=broker.cluster_member, replicas=broker.replicas,
        oauth_signed=broker.oauth_signed)
