"""Builds the coordinators and the services handlers use: the one place that does.

A coordinator depends only on the interfaces of semel.coordinator.ports. The
coordinators have one shape (semel.coordinator.partitioned): one coordinator per
partition of __transaction_state and __consumer_offsets, a single node having one
partition of each. On a single node the ports are the broker's own: the producer-id
file as ProducerIdSource, a LocalSeat (the coordinator loads its log when the seat
starts and always serves) and LocalMarkers as MarkerWriter (every partition is led
here). In a cluster each partition's coordinator gets the cluster's implementations: a
SeatedCoordinator as its seat, producer ids from etcd and markers sent to other leaders
through one MarkerChannel. The broker's NodeRole (semel.broker.node_role) says which;
the coordinators are built the same way from it. Either way a coordinator's log and its markers are written through
semel.storage.committed (fsynced, then past the high watermark, which a single node,
a cluster of one, reaches at once).
"""
from __future__ import annotations

from dataclasses import replace

from ..coordinator.group import GroupCoordinator
from ..coordinator.group_model import GroupConfig
from ..coordinator.partition_markers import PartitionMarkers
from ..coordinator.partitioned import GroupCoordinators, TxnCoordinators
from ..coordinator.producer_ids import ProducerIdManager
from ..coordinator.share_coordinator import SHARE_TOPIC, ShareCoordinator
from ..coordinator.share_leaders import LeaderShareCoordinator
from ..coordinator.txn import TXN_TOPIC, TransactionCoordinator
from ..protocol.errors import KafkaError
from ..storage.committed import Committed, PartitionCommit
from ..storage.flusher import GroupCommitFlusher
from .config import BrokerConfig
from .node_role import BrokerParts, SingleNode
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


def build_groups(broker: BrokerParts) -> GroupCoordinators:
    """The group coordinators, one per __consumer_offsets partition
    (semel.coordinator.partitioned.GroupCoordinators; one on a single node)."""
    config = group_config(broker.config)
    role, topic = broker.role, config.offsets_topic
    # Every write waits until committed (semel.storage.committed); sync_writes says only
    # whether the local fsync comes first.
    inner = broker.flusher if config.sync_writes else None
    seated = replace(config, sync_writes=True)
    parts = [GroupCoordinator(broker.logs, _committed(broker, inner, topic, p), seated,
                              seat=role.seat(topic, p, GroupCoordinator.log_configs(config)),
                              deleted_topics=role.deleted_topics())
             for p in range(role.coordinator_partitions(topic))]
    return GroupCoordinators(parts, lambda: role.topic_partitions(topic))


def build_share(broker: BrokerParts) -> ShareCoordinator | None:
    """The share coordinator: on a single node, on its own internal topic (one
    partition); in a cluster, each partition's leader keeps its share-partitions and
    writes them to the role's share store (semel.coordinator.share_leaders)."""
    role = broker.role
    if not isinstance(role, SingleNode):
        store = role.share_store()
        return LeaderShareCoordinator(store) if store is not None else None
    return ShareCoordinator(_committed(broker, broker.flusher, SHARE_TOPIC, 0),
                            seat=role.seat(SHARE_TOPIC, 0, ShareCoordinator.log_configs()))


def build_partition_markers(broker: BrokerParts) -> PartitionMarkers:
    """The markers written into partitions led here, by this broker's transaction
    coordinators and for WriteTxnMarkers (semel.coordinator.partition_markers). They are
    always fsynced, whatever the flush policy, then replicated."""
    role = broker.role
    committed = Committed(broker.flusher, lambda: role.high_watermarks, broker.config.request_timeout_ms / 1000)
    return PartitionMarkers(broker.logs, committed, broker.notifier.notify)


def build_txns(broker: BrokerParts, groups: GroupCoordinators, local_markers: PartitionMarkers) -> TxnCoordinators:
    """The transaction coordinators, one per __transaction_state partition
    (semel.coordinator.partitioned.TxnCoordinators; one on a single node), sharing
    the producer-id pool and the marker writers; they write offset markers through `groups`."""
    cfg, role = broker.config, broker.role
    pids = role.producer_ids(ProducerIdManager(cfg.data_dir / "producer_ids", broker.fs))
    count = role.coordinator_partitions(TXN_TOPIC)
    configs = TransactionCoordinator.log_configs(cfg)
    markers = role.markers()
    parts = [TransactionCoordinator(broker.logs, _committed(broker, broker.flusher, TXN_TOPIC, p), groups,
                                    cfg, pids, broker.metrics, markers=markers, seat=role.seat(TXN_TOPIC, p, configs),
                                    local_markers=local_markers, txn_partitions=count)
             for p in range(count)]
    return TxnCoordinators(parts, lambda: role.topic_partitions(TXN_TOPIC))


def _committed(broker: BrokerParts, inner: GroupCommitFlusher | None, topic: str, partition: int) -> PartitionCommit:
    """The writer of a coordinator partition's log: `inner`'s local fsync (None: none),
    then the high watermark (a cluster member's replica manager starts after the
    coordinators: until then nothing is committed, NOT_COORDINATOR)."""
    role = broker.role
    return Committed(inner, lambda: role.high_watermarks, broker.config.request_timeout_ms / 1000,
                     KafkaError.NOT_COORDINATOR).writer(topic, partition)


def build_services(broker: BrokerParts, groups: GroupCoordinators, txns: TxnCoordinators,
                   partition_markers: PartitionMarkers, share: ShareCoordinator | None = None) -> Services:
    """What handlers use, once every part exists (semel.broker.services); the metrics
    report the partitions led here from then on."""
    replicas = broker.role.local_replicas
    broker.metrics.report_replicas(replicas)
    return Services(
        config=broker.config, logs=broker.logs, notifier=broker.notifier,
        metrics=broker.metrics, group_coordinator=groups, txn_coordinator=txns,
        authorizer=broker.authorizer, users=broker.users, acls=broker.acls, broker_configs=broker.role.broker_configs,
        metadata=broker.role.metadata, coordinators_at=broker.role.coordinators_at,
        admin=broker.role.admin(groups, share), replicas=replicas,
        oauth_signed=broker.oauth_signed, committed=broker.committed, partition_markers=partition_markers,
        share_coordinator=share)
