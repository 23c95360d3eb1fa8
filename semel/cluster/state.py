"""What one broker knows about the cluster, and the one way it may change it.

The control plane (etcd.py, controller.py) keeps this view current from the
consensus service; the data plane (replica_manager.py, replica_fetcher.py, the
produce and fetch handlers) reads it and changes only the ISR of partitions it
leads, by compare-and-set on `PartitionState.version` (Kafka's AlterPartition with
its partition epoch), so a deposed leader can never shrink or expand an ISR it no
longer owns.

`MemoryClusterView` is the same contract over a dict shared by several Broker
objects in one process: the data plane's tests and model tests run on it; the
real cluster runs on `semel.cluster.etcd`.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Protocol

from .session import OutageLog

NO_LEADER = -1


@dataclass(frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None
    # The broker's other listeners as (name, host, port), so peers can reach the one
    # named as the inter-broker listener (host/port is the main listener, "DEFAULT").
    endpoints: tuple[tuple[str, str, int], ...] = ()

    def address(self, listener: str) -> tuple[str, int] | None:
        """Where this broker's listener `listener` is, None when it has none of that name."""
        if listener == "DEFAULT":
            return self.host, self.port
        return next(((h, p) for name, h, p in self.endpoints if name == listener), None)


@dataclass(frozen=True)
class PartitionState:
    """One partition's replication state as the consensus service holds it.

    leader_epoch grows by one on every leader change (never on ISR changes);
    version grows on every change of any field and is what a CAS compares.
    """
    topic: str
    partition: int
    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    version: int = 0
    # An ongoing reassignment (KIP-455): `replicas` is then the union of the target and
    # the original replicas; `adding` are target replicas catching up as followers,
    # `removing` original replicas that leave once every target replica is in the ISR.
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    # The replicas before it, in their order (a cancel restores them, preferred leader too).
    origin: tuple[int, ...] = ()

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)


PartitionListener = Callable[[PartitionState], None]


class CataloguedTopic(Protocol):
    """A topic as the view's catalogue holds it (semel.cluster.keys.TopicInfo in etcd)."""

    @property
    def partitions(self) -> int: ...


@dataclass(frozen=True)
class TableTopic:
    """A topic of the in-memory table: its name and how many partitions it has."""
    name: str
    partitions: int


class ClusterView(Protocol):
    node_id: int

    @property
    def outage(self) -> OutageLog | None:
        """The broker's log of metadata-service outages (one line per outage), None where
        the view has no service to lose (the in-memory table)."""

    @property
    def fenced(self) -> bool:
        """May this broker's registration have lapsed? Then it decides nothing (its view
        may be stale). Never for the in-memory table."""

    @property
    def lease_ttl_s(self) -> int | None:
        """The TTL of the brokers' registrations, None where registrations are not
        sessions (the in-memory table: every broker always looks registered)."""

    def topics(self) -> Mapping[str, CataloguedTopic]:
        """The topic catalogue: every live topic by name."""

    def brokers(self) -> dict[int, BrokerInfo]:
        """Live brokers (those holding a session/lease), by node id."""

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        """The latest state seen for a partition, None when the topic is unknown."""

    def partitions(self) -> list[PartitionState]:
        """Every partition of every topic."""

    def controller_id(self) -> int | None:
        """Node id of the broker holding the controller lease, None while vacant."""

    async def alter_isr(self, state: PartitionState, isr: tuple[int, ...]) -> PartitionState | None:
        """Set the ISR of a partition this broker leads if `state.version` is still current.

        Returns the new state, or None when the CAS lost (someone changed the partition
        first: re-read with partition() and decide again). Refuses (None) when this broker
        is not `state.leader` or the new ISR is empty or not a subset of the replicas.
        """

    async def write_partition(self, old: PartitionState, new: PartitionState) -> PartitionState | None:
        """Store `new` if `old.version` is still current (leadership hand-overs, elections);
        the stored state, or None when the CAS lost."""

    async def read_partition(self, topic: str, partition: int) -> PartitionState | None:
        """The partition as the metadata service holds it now (after a lost CAS)."""

    def deleted_topics(self) -> Mapping[str, object]:
        """Deletion markers by name: topics deleted and not created again since."""

    def config(self, name: str) -> str | None:
        """A cluster-wide dynamic broker config (e.g. the replication throttle), None when unset."""

    async def allocate_producer_ids(self, block_size: int) -> int:
        """First id of a block of `block_size` producer ids unique cluster-wide, forever."""

    def add_listener(self, fn: PartitionListener) -> None:
        """Call fn(state) on the event loop whenever a partition's state changes."""


class MemoryClusterView:
    """ClusterView over a shared in-process table: `MemoryClusterView.table(...)` once,
    then one view per node id. Elect and kill by hand (set_leader, remove_broker)."""

    class Table:
        def __init__(self) -> None:
            self.brokers: dict[int, BrokerInfo] = {}
            self.parts: dict[tuple[str, int], PartitionState] = {}
            self.next_pid = 1000
            self.views: list[MemoryClusterView] = []
            self.controller: int | None = None

        def _publish(self, st: PartitionState) -> None:
            self.parts[(st.topic, st.partition)] = st
            for v in self.views:
                for fn in list(v._listeners):
                    fn(st)

        def create_topic(self, topic: str, assignment: list[tuple[int, ...]]) -> None:
            for p, replicas in enumerate(assignment):
                self._publish(PartitionState(topic, p, tuple(replicas), replicas[0], 0, tuple(replicas)))

        def set_leader(self, topic: str, partition: int, leader: int) -> PartitionState:
            """A leader election: new leader, epoch + 1 (the controller's job in a real cluster)."""
            st = self.parts[(topic, partition)]
            new = replace(st, leader=leader, leader_epoch=st.leader_epoch + 1, version=st.version + 1)
            self._publish(new)
            return new

        def set_isr(self, topic: str, partition: int, isr: tuple[int, ...]) -> PartitionState:
            st = self.parts[(topic, partition)]
            new = replace(st, isr=tuple(isr), version=st.version + 1)
            self._publish(new)
            return new

    @classmethod
    def table(cls) -> "MemoryClusterView.Table":
        return cls.Table()

    # No metadata service to lose, and no lease: never fenced, every broker registered.
    outage: OutageLog | None = None
    lease_ttl_s: int | None = None

    def __init__(self, table: "MemoryClusterView.Table", node_id: int, info: BrokerInfo | None = None):
        self.node_id = node_id
        self._t = table
        self._listeners: list[PartitionListener] = []
        table.views.append(self)
        if info is not None:
            table.brokers[node_id] = info

    def brokers(self) -> dict[int, BrokerInfo]:
        return dict(self._t.brokers)

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        return self._t.parts.get((topic, partition))

    def partitions(self) -> list[PartitionState]:
        return list(self._t.parts.values())

    @property
    def fenced(self) -> bool:
        return False

    def topics(self) -> Mapping[str, TableTopic]:
        counts: dict[str, int] = {}
        for topic, _ in self._t.parts:
            counts[topic] = counts.get(topic, 0) + 1
        return {name: TableTopic(name, n) for name, n in counts.items()}

    def controller_id(self) -> int | None:
        return self._t.controller

    async def alter_isr(self, state: PartitionState, isr: tuple[int, ...]) -> PartitionState | None:
        await asyncio.sleep(0)   # a real CAS is a round trip: let others interleave
        cur = self._t.parts.get((state.topic, state.partition))
        if (cur is None or cur.version != state.version or cur.leader != self.node_id
                or not isr or not set(isr) <= set(cur.replicas)):
            return None
        new = replace(cur, isr=tuple(isr), version=cur.version + 1)
        self._t._publish(new)
        return new

    async def write_partition(self, old: PartitionState, new: PartitionState) -> PartitionState | None:
        await asyncio.sleep(0)   # a real CAS is a round trip: let others interleave
        cur = self._t.parts.get((old.topic, old.partition))
        if cur is None or cur.version != old.version:
            return None
        stored = replace(new, version=cur.version + 1)
        self._t._publish(stored)
        return stored

    async def read_partition(self, topic: str, partition: int) -> PartitionState | None:
        return self._t.parts.get((topic, partition))

    def deleted_topics(self) -> Mapping[str, object]:
        return {}   # the table has no topic deletion

    def config(self, name: str) -> str | None:
        return None   # the table has no dynamic configs

    async def allocate_producer_ids(self, block_size: int) -> int:
        first = self._t.next_pid
        self._t.next_pid += block_size
        return first

    def add_listener(self, fn: PartitionListener) -> None:
        self._listeners.append(fn)
