"""What a broker is among brokers: a single node (a cluster of one) or a member of a
replicated cluster. `Broker` chooses its role once, from its config (`role_for`), and
everything that differs between the two lives behind `NodeRole`; the broker's start,
its stop and the coordinators' wiring take the same path either way.

A single node (`SingleNode`) leads every partition of every topic: its metadata is its
own NodeView, its coordinators sit on a LocalSeat that always serves, each internal
topic has one partition, markers go into its own logs, producer ids come from a file
and a record fsynced as asked is committed (storage.committed.OneNode).

A cluster member (`ClusterNode`) follows the metadata service (semel.cluster.member):
the cluster view, a seat per coordinator partition that follows its leadership, ids
from the cluster-wide counter, markers sent to other leaders, and a replication data
plane whose high watermarks say what is committed. It joins once its listeners are
bound and leaves, handing its leaderships over, before it stops.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

from ..cluster.broker_configs import BrokerConfigs, FileBrokerConfigs
from ..cluster.coordinator_host import SeatedCoordinator
from ..cluster.member import ClusterMember, InternalTopic
from ..cluster.metadata import ClusterMetadata, EtcdClusterView
from ..cluster.peer import PeerDialer
from ..cluster.producer_ids import ClusterProducerIds
from ..cluster.hw_checkpoint import HW_FILE
from ..cluster.internal_topics import topic_partition_count
from ..cluster.replica_fetcher import FetchSettings
from ..cluster.replica_manager import ReplicaManager, ReplicaSettings
from ..cluster.share_store import EtcdShareStore
from ..cluster.shutdown import controlled_shutdown
from ..cluster.topic_sync import deleted_names
from ..cluster.txn_markers import MarkerChannel
from ..coordinator.group import GroupCoordinator
from ..coordinator.partitioned import GroupCoordinators, TxnCoordinators
from ..coordinator.ports import CoordinatorSeat, LocalMarkers, LocalSeat, MarkerWriter, ProducerIdSource, ShareStore
from ..coordinator.share_coordinator import ShareCoordinator
from ..coordinator.txn import OFFSETS_TOPIC, TXN_TOPIC, TransactionCoordinator
from ..storage.committed import Committed, HighWatermarks, OneNode
from ..storage.flusher import GroupCommitFlusher
from ..storage.fs import FileSystem
from ..storage.manager import LogManager
from .auth.acl import FILE_NAME as ACL_FILE, AclStore, Authorizer
from .auth.cluster_store import ClusterAclStore, ClusterUserStore, cluster_stores
from .auth.users import FILE_NAME as USER_FILE, UserStore
from .cluster_admin import ClusterAdmin, MetadataAdmin, NodeAdmin
from .config import BrokerConfig, Listener
from .local_replicas import LocalReplicas, NodeReplicas
from .metrics import BrokerMetrics
from .notify import AppendNotifier
from .node_view import CoordinatorPlacement, MetadataView, NodeView

if TYPE_CHECKING:   # the oauth extra
    from .auth.oauth_jwks import SignedValidator

log = logging.getLogger("semel.broker")


class BrokerParts(Protocol):
    """What the role and the wiring (semel.broker.wiring) read of the broker as it
    starts: semel.broker.server.Broker, which imports this module."""
    config: BrokerConfig
    fs: FileSystem
    flusher: GroupCommitFlusher
    notifier: AppendNotifier
    metrics: BrokerMetrics
    authorizer: Authorizer
    users: UserStore | ClusterUserStore
    acls: AclStore | ClusterAclStore
    listeners: list[Listener]
    role: NodeRole
    committed: Committed
    oauth_signed: SignedValidator | None

    @property
    def logs(self) -> LogManager: ...

    def coordinators(self) -> tuple[GroupCoordinators, TxnCoordinators]: ...

    def follow_deleted_topics(self, names: set[str]) -> None: ...


class NodeRole(Protocol):
    """What differs between a single node and a cluster member: see the module docstring."""

    @property
    def metadata(self) -> MetadataView:
        """Brokers, controller, topics and their partitions' leaders."""

    @property
    def local_replicas(self) -> LocalReplicas:
        """This broker's replicas as the handlers ask about them (once joined)."""

    @property
    def coordinators_at(self) -> CoordinatorPlacement:
        """Which broker coordinates a group or a transactional id."""

    @property
    def broker_configs(self) -> BrokerConfigs:
        """The dynamic broker configs: a file of the data dir, or etcd."""

    @property
    def high_watermarks(self) -> HighWatermarks | None:
        """What commits wait on past the fsync; None while nothing can commit yet."""

    def open(self, broker: BrokerParts) -> None:
        """Once the logs are open, before the coordinators are built."""

    def coordinator_partitions(self, topic: str) -> int:
        """How many partitions (so coordinators) the internal `topic` has here."""

    def topic_partitions(self, topic: str) -> int | None:
        """The internal topic's partition count as the metadata has it (None: not known)."""

    def seat(self, topic: str, partition: int, configs: dict[str, str]) -> CoordinatorSeat:
        """Where the coordinator of `topic`'s `partition` sits."""

    def producer_ids(self, own: ProducerIdSource) -> ProducerIdSource:
        """Where producer ids come from, given this broker's own id file."""

    def markers(self) -> MarkerWriter:
        """How transaction markers reach their partitions' leaders."""

    def deleted_topics(self) -> Callable[[], set[str]] | None:
        """The names of deleted topics a loading group coordinator drops offsets of."""

    def admin(self, groups: GroupCoordinators, share: ShareCoordinator | None = None) -> ClusterAdmin:
        """What the admin requests change, and where; `groups` drop a deleted topic's
        offsets, `share` its share-partitions (where the node deletes topics itself)."""

    def share_store(self) -> ShareStore | None:
        """Where share-partition state lives when each partition's leader keeps its own
        (None: in the share coordinator's log, every partition being led here)."""

    async def join(self) -> None:
        """Once the listeners are bound: take part, and start what replicates."""

    async def leave(self) -> None:
        """Before the broker stops: hand over what this broker leads."""


@dataclass(frozen=True)
class _NodeParts:
    """What a single node's role is made of once the broker's logs are open."""
    broker: BrokerParts
    view: NodeView
    replicas: NodeReplicas
    configs: FileBrokerConfigs
    high_watermarks: OneNode


class SingleNode:
    """A cluster of one: see the module docstring."""

    def __init__(self) -> None:
        self._opened: _NodeParts | None = None

    def open(self, broker: BrokerParts) -> None:
        # A damaged dynamic-configs file stops the start here, naming it.
        configs = FileBrokerConfigs(broker, broker.config.node_id, broker.fs, broker.config.data_dir)
        configs.load()
        configs.apply()
        self._opened = _NodeParts(broker, NodeView(broker.config, broker.logs, lambda: broker.listeners),
                                  NodeReplicas(broker.config.node_id, broker.logs, broker.config.min_insync_replicas), configs,
                                  OneNode(broker.notifier.notify))

    def _parts(self) -> _NodeParts:
        assert self._opened is not None, "opened at start"
        return self._opened

    @property
    def metadata(self) -> MetadataView:
        return self._parts().view

    @property
    def coordinators_at(self) -> CoordinatorPlacement:
        return self._parts().view

    @property
    def local_replicas(self) -> LocalReplicas:
        return self._parts().replicas

    @property
    def broker_configs(self) -> BrokerConfigs:
        return self._parts().configs

    @property
    def high_watermarks(self) -> HighWatermarks | None:
        return self._parts().high_watermarks

    def coordinator_partitions(self, topic: str) -> int:
        return 1

    def topic_partitions(self, topic: str) -> int | None:
        return None   # no peer places ids another way

    def seat(self, topic: str, partition: int, configs: dict[str, str]) -> CoordinatorSeat:
        return LocalSeat(self._parts().broker.logs, topic, configs)

    def producer_ids(self, own: ProducerIdSource) -> ProducerIdSource:
        return own

    def markers(self) -> MarkerWriter:
        return LocalMarkers()

    def deleted_topics(self) -> Callable[[], set[str]] | None:
        return None   # a deleted topic's offsets go in DeleteTopics itself

    def admin(self, groups: GroupCoordinators, share: ShareCoordinator | None = None) -> ClusterAdmin:
        broker = self._parts().broker
        return NodeAdmin(self.metadata, broker.logs, groups, broker.config.node_id, share)

    def share_store(self) -> ShareStore | None:
        return None

    async def join(self) -> None:
        return None

    async def leave(self) -> None:
        return None


class Membership(CoordinatorPlacement, Protocol):
    """A cluster member's control plane (semel.cluster.member.ClusterMember)."""

    @property
    def view(self) -> ClusterMetadata: ...

    @property
    def configs(self) -> BrokerConfigs: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


# Builds a broker's Membership, given what reads its replica manager (None until joined).
MembershipFactory = Callable[["BrokerParts", Callable[[], "ReplicaManager | None"]], Membership]


class ClusterNode:
    """A member of a replicated cluster: see the module docstring. `membership` builds its
    control plane (by default `etcd_membership`)."""

    def __init__(self, membership: MembershipFactory | None = None) -> None:
        self._make_member = membership or etcd_membership
        self.dialer = PeerDialer()
        self._member: Membership | None = None
        self._broker: BrokerParts | None = None
        self._view: ClusterMetadata | None = None
        # The replication data plane, built once this member joined.
        self.replicas: ReplicaManager | None = None

    def open(self, broker: BrokerParts) -> None:
        self._broker = broker
        self._member = self._make_member(broker, lambda: self.replicas)
        self._view = self._member.view
        # How followers and the coordinators reach other brokers.
        self.dialer = PeerDialer.from_config(broker.config)
        who = self.dialer.principal
        if who and broker.authorizer.enabled and who not in broker.config.super_users:
            log.warning("inter-broker login %s is no --super-user: peers refuse its fetches and "
                        "markers unless an ACL grants it ClusterAction on the cluster", who)

    @property
    def member(self) -> Membership:
        assert self._member is not None, "opened at start"
        return self._member

    @property
    def view(self) -> ClusterMetadata:
        assert self._view is not None, "opened at start"
        return self._view

    @property
    def metadata(self) -> MetadataView:
        return self.view

    @property
    def coordinators_at(self) -> CoordinatorPlacement:
        return self.member

    @property
    def local_replicas(self) -> LocalReplicas:
        assert self.replicas is not None, "joined before the services are built"
        return self.replicas

    @property
    def broker_configs(self) -> BrokerConfigs:
        return self.member.configs

    @property
    def high_watermarks(self) -> HighWatermarks | None:
        return self.replicas   # until replication runs nothing is committed

    def coordinator_partitions(self, topic: str) -> int:
        cfg = self._opened().config
        return cfg.transaction_state_partitions if topic == TXN_TOPIC else cfg.offsets_topic_partitions

    def topic_partitions(self, topic: str) -> int | None:
        return topic_partition_count(self.view, topic)

    def seat(self, topic: str, partition: int, configs: dict[str, str]) -> CoordinatorSeat:
        broker = self._opened()
        return SeatedCoordinator(self.view, broker.config.node_id, broker.logs, lambda: self.replicas,
                                 topic, partition)

    def producer_ids(self, own: ProducerIdSource) -> ProducerIdSource:
        return ClusterProducerIds(own, self.view)   # ids from the cluster-wide counter

    def markers(self) -> MarkerWriter:
        broker = self._opened()
        return MarkerChannel(self.view, broker.config.node_id, broker.config.request_timeout_ms / 1000,
                             self.dialer)

    def deleted_topics(self) -> Callable[[], set[str]] | None:
        view = self.view
        return lambda: deleted_names(view)

    def admin(self, groups: GroupCoordinators, share: ShareCoordinator | None = None) -> ClusterAdmin:
        return MetadataAdmin(self.view, self._opened().config.default_replication_factor)

    def share_store(self) -> ShareStore | None:
        view = self.view   # etcd's: a membership of another kind keeps no share state
        return EtcdShareStore(view.etcd, view.keys.share) if isinstance(view, EtcdClusterView) else None

    async def join(self) -> None:
        await self.member.start()   # registers with the bound ports
        self.replicas = build_replicas(self._opened(), self.view, self.dialer)
        await self.replicas.start()

    async def leave(self) -> None:
        if self._broker is None:   # never opened: nothing joined
            return
        broker = self._broker
        if self.replicas is not None:   # joined: leaderships and coordinators to in-sync peers first
            await controlled_shutdown(self.view, self.replicas, broker.config.controlled_shutdown_timeout_ms / 1000)
            await self.replicas.stop()   # no more fetching or ISR changes from here on
        await self.member.stop()   # leave first: others take over without waiting out the lease

    def _opened(self) -> BrokerParts:
        assert self._broker is not None, "opened at start"
        return self._broker


def replica_settings(c: BrokerConfig) -> ReplicaSettings:
    return ReplicaSettings(
        lag_time_max_ms=c.replica_lag_time_max_ms,
        min_insync_replicas=c.min_insync_replicas,
        hw_checkpoint=c.data_dir / HW_FILE,
        fetch=FetchSettings(wait_ms=c.replica_fetch_wait_max_ms, max_bytes=c.replica_fetch_max_bytes,
                            write_thread_bytes=c.replica_write_thread_bytes,
                            request_timeout_s=c.request_timeout_ms / 1000),
    )


def build_replicas(broker: BrokerParts, view: ClusterMetadata, dialer: PeerDialer) -> ReplicaManager:
    """The replication data plane of a cluster member (after it joined the cluster)."""
    durable = broker.flusher.sync_each if broker.config.log.flush_mode == "always" else None
    return ReplicaManager(view, broker.logs, broker.fs, broker.notifier.notify, dialer,
                          replica_settings(broker.config), durable=durable)


def role_for(broker_has_metadata_service: bool) -> NodeRole:
    """A cluster member when a metadata service is configured, else a single node."""
    return ClusterNode() if broker_has_metadata_service else SingleNode()


def etcd_membership(broker: BrokerParts, replicas: Callable[[], ReplicaManager | None]) -> ClusterMember:
    """The broker's membership in its cluster through etcd (needs the cluster extra). Users
    and ACLs live in etcd then, the same on every broker (auth/cluster_store.py); files
    under the data dir are not read."""

    member = ClusterMember(broker.config, broker.logs, listeners=lambda: broker.listeners, replicas=replicas,
                           internal_topic=lambda key_type: internal_topic(broker, key_type),
                           topics_deleted=broker.follow_deleted_topics)
    broker.users, broker.acls = cluster_stores(member.view)
    broker.authorizer.store = broker.acls
    for name in (USER_FILE, ACL_FILE):
        if (broker.config.data_dir / name).exists():
            log.warning("%s is ignored in a cluster: users and ACLs are kept in etcd "
                        "(semel user|acl --metadata ENDPOINTS)", broker.config.data_dir / name)
    return member


def internal_topic(broker: BrokerParts, key_type: int) -> InternalTopic:
    """FindCoordinator's internal topic for `key_type` (1 transactions, else groups)."""
    groups, txns = broker.coordinators()
    if key_type == 1:
        return InternalTopic(TXN_TOPIC, TransactionCoordinator.log_configs(broker.config), txns)
    return InternalTopic(OFFSETS_TOPIC, GroupCoordinator.log_configs(groups.config), groups)
