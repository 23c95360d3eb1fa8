"""A broker's membership in a cluster: what `Broker` holds when it has a metadata service.

`ClusterMember` owns the EtcdClusterView (the broker's `cluster`), the controller shell
that acts while this broker holds the seat, and the local side of topic creation:
a topic that appears in etcd gets its partition logs on every broker, so any of
them can become a replica or leader without another round trip.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, NamedTuple, Protocol, Sequence

from ..protocol.errors import KafkaError
from ..storage.log_config import LogConfig
from ..storage.manager import NEW, UNCLEAN, LogManager
from .broker_configs import EtcdBrokerConfigs
from .controller import Controller
from .elections import leave_isr
from .etcd import Etcd
from .internal_topics import coordinator_node, ensure_internal_topic
from .metadata import EtcdClusterView
from .state import BrokerInfo, PartitionState
from .topic_sync import deleted_names, sync_local_topics

if TYPE_CHECKING:
    from .replica_manager import ReplicaManager

log = logging.getLogger("semel.cluster.member")
CAS_TRIES = 5


class MemberConfig(Protocol):
    """What the membership reads of the broker's configuration (semel.broker.config.BrokerConfig),
    and the flags its dynamic configs change in place (broker_configs.DynamicFlags)."""
    node_id: int
    cluster_id: str
    port: int
    metadata_endpoints: str | None
    cluster_lease_ttl_s: int
    auto_leader_rebalance_enable: bool
    leader_imbalance_per_broker_percentage: int
    leader_imbalance_check_interval_seconds: int
    auto_create_topics: bool
    connections_max_idle_ms: int
    log: LogConfig

    @property
    def advertised(self) -> str: ...


class MemberListener(Protocol):
    """A bound listener as peers reach it (semel.broker.config.Listener)."""
    name: str
    host: str
    port: int


class PlacedCoordinators(Protocol):
    """The coordinators of one internal topic as FindCoordinator places a key on them
    (semel.coordinator.partitioned.PartitionedCoordinators)."""

    @property
    def partitions(self) -> int: ...

    def partition_for(self, key: str | None) -> int: ...

    def misplaced(self) -> bool: ...


class InternalTopic(NamedTuple):
    """What FindCoordinator needs of one coordinator's internal topic: its name, the
    configs it is created with, and its coordinators."""
    name: str
    configs: dict[str, str]
    coordinators: PlacedCoordinators


class ClusterMember:
    """`config` is the BrokerConfig, `logs` the LogManager; the rest is read when used,
    as the broker builds it after the member: `listeners()` the bound listeners,
    `replicas()` the ReplicaManager (None before it runs), `internal_topic(key_type)`
    FindCoordinator's InternalTopic (0 groups, 1 transactions), and
    `topics_deleted(names)` tells the group coordinators which topics the cluster holds
    deleted."""

    def __init__(self, config: MemberConfig, logs: LogManager, *, listeners: Callable[[], Sequence[MemberListener]],
                 replicas: Callable[[], ReplicaManager | None],
                 internal_topic: Callable[[int], InternalTopic], topics_deleted: Callable[[set[str]], None]):
        cfg = self.config = config
        self.logs = logs
        self.listeners = listeners
        self.replicas = replicas
        self.internal_topic = internal_topic
        self.topics_deleted = topics_deleted
        # (No endpoints: Etcd refuses to start, as it does an empty list.)
        self.view = EtcdClusterView(Etcd(cfg.metadata_endpoints or []), cfg.cluster_id, cfg.node_id,
                                    BrokerInfo(cfg.node_id, cfg.advertised, cfg.port), cfg.cluster_lease_ttl_s)
        self.configs = EtcdBrokerConfigs(self, self.view)   # dynamic broker configs (reads .config, .logs)
        self.controller = Controller(self.view, rebalance=cfg.auto_leader_rebalance_enable,
                                     imbalance_percentage=cfg.leader_imbalance_per_broker_percentage,
                                     imbalance_check_interval_s=cfg.leader_imbalance_check_interval_seconds)

    async def start(self) -> None:
        """Register (after the listener is bound: the port may have been 0) and follow."""
        cfg = self.config
        self.view.info = BrokerInfo(cfg.node_id, cfg.advertised, cfg.port, endpoints=self._endpoints())
        try:
            await self.view.start(before_register=self._leave_isrs_if_lossy)
        except BaseException:
            await self.view.etcd.close()
            raise
        self.view.add_change_listener(self.sync_topics)
        self.sync_topics()
        self.configs.apply()
        self.controller.start()
        log.info("broker %d joined cluster %s (metadata %s)", cfg.node_id, cfg.cluster_id,
                 ",".join(self.view.etcd.endpoints))

    def may_have_lost_records(self) -> bool:
        """Whether this broker's logs may lack records it reported to a leader: its disk
        came back without a catalogue (new or wiped), or its last run ended without a
        clean stop while followers report unsynced writes (a flush mode other than
        always: semel.cluster.replica_fetcher)."""
        last_stop = self.logs.last_stop
        return last_stop == NEW or (last_stop == UNCLEAN and self.config.log.flush_mode != "always")

    async def _leave_isrs_if_lossy(self) -> None:
        """Before registering, a broker that may have lost records leaves every ISR it
        is in (elections.leave_isr), by compare-and-set while no other broker sees it
        live, so no election picks it over a replica that holds what was acknowledged."""
        if not self.may_have_lost_records():
            return
        for st in await self.view.read_partitions():
            await self._leave_isr(st, self.config.node_id)

    async def _leave_isr(self, state: PartitionState, me: int) -> None:
        st: PartitionState | None = state
        for _ in range(CAS_TRIES):
            if st is None:
                return
            want = leave_isr(st, me)
            if want is None:
                if st.isr == (me,):
                    log.warning("%s-%d: this broker is its only in-sync replica and its last run "
                                "ended %s; records it reported may be lost", st.topic, st.partition,
                                self.logs.last_stop)
                return
            if await self.view.write_partition(st, want) is not None:
                log.info("%s-%d: left the ISR (last run ended %s); back once caught up",
                         st.topic, st.partition, self.logs.last_stop)
                return
            st = await self.view.read_partition(st.topic, st.partition)

    def _endpoints(self) -> tuple[tuple[str, str, int], ...]:
        """The broker's other listeners as peers reach them (one bound to every address is
        advertised under the broker's advertised host)."""
        cfg = self.config
        return tuple((lst.name, cfg.advertised if lst.host in ("", "0.0.0.0", "::") else lst.host, lst.port)
                     for lst in self.listeners()[1:])

    async def stop(self) -> None:
        await self.controller.stop()
        await self.view.stop()

    def sync_topics(self) -> None:
        """Local logs follow the cluster's topics: created, grown, and removed when deleted
        (semel.cluster.topic_sync; internal topics are created like any other); the group
        coordinator, where it serves, drops the offsets of deleted topics."""
        sync_local_topics(self.logs, self.replicas(), self.view)
        self.topics_deleted(deleted_names(self.view))

    async def coordinator_for(self, key_type: int, key: str | None) -> int | None:
        """FindCoordinator: the broker leading the internal partition of `key` (`key_type`
        0 a group id, 1 a transactional id), creating the topic in etcd at its first use;
        None while there is none (COORDINATOR_NOT_AVAILABLE, the client looks again)."""
        name, configs, coordinators = self.internal_topic(key_type)
        partition = coordinators.partition_for(key)
        st = await ensure_internal_topic(self.view, name, configs, coordinators.partitions, partition)
        if isinstance(st, KafkaError) or coordinators.misplaced():
            return None
        return coordinator_node(self.view, name, partition)

