"""What a request handler may use: the broker's parts, by name and type.

`Services` is built once, in semel.broker.wiring.build_services, after every part it
names exists and before the first connection is served; each request's
RequestContext carries it as `ctx.services`. A request can be followed by name from
here: EndTxn's handler (handlers/txn.py) calls `ctx.services.txn_coordinator.end_txn`,
the transaction coordinator (semel.coordinator.txn) of the id's partition, which
writes through its PartitionWriter to the `__transaction_state` log that
`ctx.services.logs` (semel.storage.manager.LogManager) opened.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..cluster.broker_configs import BrokerConfigs
from ..coordinator.partition_markers import PartitionMarkers
from ..coordinator.partitioned import GroupCoordinators, TxnCoordinators
from ..coordinator.share_coordinator import ShareCoordinator
from ..storage.committed import Committed
from ..storage.manager import LogManager
from .auth.acl import AclStore, Authorizer
from .auth.cluster_store import ClusterAclStore, ClusterUserStore
from .cluster_admin import ClusterAdmin
from .node_view import CoordinatorPlacement, MetadataView
from .auth.users import UserStore
from .config import BrokerConfig
from .local_replicas import LocalReplicas
from .metrics import BrokerMetrics
from .notify import AppendNotifier

if TYPE_CHECKING:   # the oauth extra
    from .auth.oauth_jwks import SignedValidator

@dataclass(frozen=True, slots=True)
class Services:
    config: BrokerConfig
    logs: LogManager
    # wakes long-polling fetches when a partition gets records
    notifier: AppendNotifier
    metrics: BrokerMetrics
    # one coordinator per internal partition, each seated on it; one of each on a single
    # node (semel.coordinator.partitioned)
    group_coordinator: GroupCoordinators
    txn_coordinator: TxnCoordinators
    authorizer: Authorizer
    users: UserStore | ClusterUserStore
    acls: AclStore | ClusterAclStore
    # dynamic broker configs (a file of the data dir, or etcd in a cluster)
    broker_configs: BrokerConfigs
    # brokers, controller, topics and their partitions' leaders: the cluster view, or on a
    # single node its NodeView (a cluster of one)
    metadata: MetadataView
    # which broker coordinates a group or transactional id: the cluster member, or this
    # node's NodeView
    coordinators_at: CoordinatorPlacement
    # what the admin requests change (topics, partitions, replicas, leaders, cluster-wide
    # settings): in etcd for a cluster member, in the LogManager on a single node
    admin: ClusterAdmin
    # this broker's replicas of its partitions (semel.broker.local_replicas): the replica
    # manager in a cluster, or on a single node its NodeReplicas (a cluster of one)
    replicas: LocalReplicas
    # signed OAUTHBEARER tokens when a JWKS is configured
    oauth_signed: SignedValidator | None
    # when an append is committed (semel.storage.committed): fsynced as the flush policy
    # asks, then past the high watermark (at once on a single node)
    committed: Committed
    # transaction markers written into partitions led here (WriteTxnMarkers from a
    # coordinator on another broker; this broker's coordinators write through it too)
    partition_markers: PartitionMarkers
    # share groups (KIP-932): a single node's share coordinator; None in a cluster,
    # which does not serve share groups
    share_coordinator: ShareCoordinator | None = None
