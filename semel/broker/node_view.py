"""What the Metadata handlers read of the cluster, and the single node's answer to it.

A single node is a cluster of one: it is the only live broker and the controller, and
it leads every partition with itself as the only replica and in-sync replica. NodeView
says so from the node's own logs and listeners, in the shape the cluster view
(semel.cluster.metadata.EtcdClusterView) gives a cluster member, so a handler that reads a
MetadataView answers the same way alone as in a cluster.
"""
from __future__ import annotations

from typing import Callable, Protocol, Sequence

from ..cluster.keys import TopicInfo
from ..cluster.state import BrokerInfo, PartitionState
from ..protocol.errors import KafkaError
from ..storage.manager import LogManager
from .config import BrokerConfig, Listener

# The leader epoch of every partition of a single node, which never hands one over.
LEADER_EPOCH = 0


class MetadataView(Protocol):
    """Brokers, controller and topics with their partitions' leaders, replicas and ISR;
    create_topic as auto-creation asks for it."""

    def brokers(self) -> dict[int, BrokerInfo]: ...

    def controller_id(self) -> int | None: ...

    def topics(self) -> dict[str, TopicInfo]: ...

    def topic_partitions(self, name: str) -> list[PartitionState]: ...

    def partition(self, topic: str, partition: int) -> PartitionState | None: ...

    def partitions(self) -> list[PartitionState]: ...

    async def create_topic(self, name: str, assignment: list[tuple[int, ...]], configs: dict[str, str]) -> KafkaError: ...


class CoordinatorPlacement(Protocol):
    """Where FindCoordinator sends a client: the cluster member (the leader of the key's
    internal partition), or NodeView (this node coordinates every key)."""

    async def coordinator_for(self, key_type: int, key: str | None) -> int | None: ...


class NodeView:
    """The cluster of one: this node, its topics (from the LogManager), every partition
    led here at LEADER_EPOCH with replicas and ISR [this node]."""

    def __init__(self, config: BrokerConfig, logs: LogManager, listeners: Callable[[], Sequence[Listener]]):
        self.config = config
        self.node_id = config.node_id
        self.logs = logs
        self.listeners = listeners

    def brokers(self) -> dict[int, BrokerInfo]:
        """This node, at its advertised host on every listener (the first is the default)."""
        cfg = self.config
        endpoints = tuple((lst.name, cfg.advertised, lst.port) for lst in self.listeners()[1:])
        return {cfg.node_id: BrokerInfo(cfg.node_id, cfg.advertised, cfg.port, endpoints=endpoints)}

    def controller_id(self) -> int | None:
        return self.node_id

    async def coordinator_for(self, key_type: int, key: str | None) -> int | None:
        return self.node_id

    def topics(self) -> dict[str, TopicInfo]:
        return {name: TopicInfo(name, t.partitions, 1, dict(t.config), t.topic_id)
                for name, t in self.logs.topics().items()}

    def topic_partitions(self, name: str) -> list[PartitionState]:
        info = self.logs.topic(name)
        me = (self.node_id,)
        return [] if info is None else [PartitionState(name, p, me, self.node_id, LEADER_EPOCH, me)
                                         for p in range(info.partitions)]

    def partition(self, topic: str, partition: int) -> PartitionState | None:
        """The partition led here, None when this node has no such partition."""
        if self.logs.get(topic, partition) is None:
            return None
        me = (self.node_id,)
        return PartitionState(topic, partition, me, self.node_id, LEADER_EPOCH, me)

    def partitions(self) -> list[PartitionState]:
        return [st for name in self.logs.topics() for st in self.topic_partitions(name)]

    async def create_topic(self, name: str, assignment: list[tuple[int, ...]], configs: dict[str, str]) -> KafkaError:
        return self.logs.create_topic(name, len(assignment), configs)
