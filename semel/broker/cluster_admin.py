"""What the admin requests change: topics, their partitions and replicas, leaders, and
the cluster-wide broker settings; the single node's answer and the cluster's.

A single node is a cluster of one. The handlers (handlers/topics.py, reassign.py,
cluster.py's ElectLeaders, configs.py) validate a request once and then ask a
ClusterAdmin, the same way alone as in a cluster. What differs lives here: where a new
topic's replicas come from (the live brokers, or this one node) and where a change is
written (etcd through the cluster view, or this node's LogManager). Where a single node
refuses because it has one broker (a replication factor above one, a reassignment, the
replication throttle, another broker's configs), that refusal is NodeAdmin's answer.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from ..cluster.broker_configs import DEFAULT_KEY
from ..cluster.controller import assign_replicas
from ..coordinator.partitioned import GroupCoordinators
from ..coordinator.share_coordinator import ShareCoordinator
from ..cluster.elections import elect, run_election
from ..cluster.keys import TopicInfo
from ..cluster.metadata import ClusterMetadata
from ..cluster.topic_catalogue import GrowthDecision
from ..cluster.reassignment import begin, original
from ..protocol.errors import KafkaError
from ..storage.manager import LogManager
from .node_view import MetadataView

Assignment = list[tuple[int, ...]]       # a topic's replica lists, one per partition
Refusal = tuple[KafkaError, str]           # why a request is refused
Answer = tuple[KafkaError, str | None]     # a change's outcome: the message None when it is done

CAS_TRIES = 10        # compare-and-sets of one reassignment before giving up


class ClusterAdmin(Protocol):
    """What a handler asks once it has checked a request; answers as Kafka error values."""

    def live_brokers(self) -> list[int]: ...

    def topics(self) -> dict[str, TopicInfo]: ...

    def assign(self, partitions: int, replication_factor: int) -> Assignment | Refusal:
        """Replicas for a new topic; `replication_factor` -1 means the default."""

    async def create_topic(self, name: str, assignment: Assignment, configs: dict[str, str]) -> Answer: ...

    async def delete_topic(self, name: str, topic_id: str | None) -> Answer:
        """`topic_id`: the incarnation meant when the request named the topic by id."""

    async def add_partitions(self, name: str, decide: GrowthDecision) -> tuple[KafkaError, str]: ...

    async def reassign(self, topic: str, partition: int, target: Sequence[int] | None,
                       allow_rf_change: bool) -> Answer:
        """Move a partition to the replicas `target` (None cancels an ongoing move)."""

    async def elect(self, topic: str, partition: int, election_type: int) -> KafkaError: ...

    def cluster_setting(self, name: str) -> str | None: ...

    async def set_cluster_setting(self, name: str, value: str | None) -> None: ...

    def refuse_cluster_setting(self, name: str) -> str | None:
        """Why `name` cannot be set cluster-wide here; None when it can."""

    def refuse_broker(self, key: str) -> str | None:
        """Why broker `key` (a node id, or the default entity) has no configs to alter here;
        None when it has."""


class NodeAdmin:
    """The cluster of one: every replica is this node, every change a LogManager's."""

    def __init__(self, view: MetadataView, logs: LogManager, groups: GroupCoordinators, node_id: int,
                 share: ShareCoordinator | None = None):
        self.view = view
        self.logs = logs
        self.groups = groups
        self.node_id = node_id
        self.share = share

    def live_brokers(self) -> list[int]:
        return [self.node_id]

    def topics(self) -> dict[str, TopicInfo]:
        return self.view.topics()

    def assign(self, partitions: int, replication_factor: int) -> Assignment | Refusal:
        if replication_factor not in (-1, 1):
            return KafkaError.INVALID_REPLICATION_FACTOR, "a single broker holds one replica"
        return [(self.node_id,)] * partitions

    async def create_topic(self, name: str, assignment: Assignment, configs: dict[str, str]) -> Answer:
        return self._answer(self.logs.create_topic(name, len(assignment), configs))

    async def delete_topic(self, name: str, topic_id: str | None) -> Answer:
        err = self.logs.delete_topic(name)
        if err == KafkaError.NONE:   # as Kafka: the groups' offsets of the topic go with it
            self.groups.drop_topic_offsets([name])
            if self.share is not None:   # and the share groups' partitions (tombstoned, so a restart agrees)
                await self.share.drop_topics([name])
        return self._answer(err)

    def _answer(self, err: KafkaError) -> Answer:
        """A LogManager change's outcome, with its reason when it failed."""
        return err, None if err == 0 else (self.logs.last_error_message or err.name)

    async def add_partitions(self, name: str, decide: GrowthDecision) -> tuple[KafkaError, str]:
        info = self.topics().get(name)
        if info is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
        err, msg, new = decide(info)
        if err:
            return err, msg
        err = self.logs.create_partitions(name, info.partitions + len(new))
        return err, self.logs.last_error_message or ""

    async def reassign(self, topic: str, partition: int, target: Sequence[int] | None,
                       allow_rf_change: bool) -> Answer:
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, "a single node has nothing to reassign"

    async def elect(self, topic: str, partition: int, election_type: int) -> KafkaError:
        """One node leads every partition: nothing to elect (elect() says which error)."""
        st = self.view.partition(topic, partition)
        if st is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        err = elect(st, (self.node_id,), election_type)
        return err if isinstance(err, KafkaError) else KafkaError.NONE

    def cluster_setting(self, name: str) -> str | None:
        return None

    async def set_cluster_setting(self, name: str, value: str | None) -> None:
        """Never asked: refuse_cluster_setting answers first."""
        raise ValueError(self.refuse_cluster_setting(name))

    def refuse_cluster_setting(self, name: str) -> str | None:
        return f"{name} is a cluster's setting: a single node replicates nothing"

    def refuse_broker(self, key: str) -> str | None:
        if key in (DEFAULT_KEY, str(self.node_id)):
            return None
        return f"no broker {key} here: this single node is broker {self.node_id}"


class MetadataAdmin:
    """A cluster member's: replicas spread over the live brokers, every change a
    compare-and-set in etcd that each broker's logs then follow (semel.cluster.topic_sync).
    An unreachable etcd answers REQUEST_TIMED_OUT."""

    def __init__(self, view: ClusterMetadata, default_replication_factor: int):
        self.view = view
        self.default_replication_factor = default_replication_factor

    def live_brokers(self) -> list[int]:
        return sorted(self.view.brokers())

    def topics(self) -> dict[str, TopicInfo]:
        return self.view.topics()

    def assign(self, partitions: int, replication_factor: int) -> Assignment | Refusal:
        """Kafka's spread over the live brokers."""
        rf = self.default_replication_factor if replication_factor == -1 else replication_factor
        try:
            return assign_replicas(self.live_brokers(), partitions, rf)
        except ValueError as exc:
            return KafkaError.INVALID_REPLICATION_FACTOR, str(exc)

    async def create_topic(self, name: str, assignment: Assignment, configs: dict[str, str]) -> Answer:
        """One create-if-absent transaction; every broker then opens the logs (ClusterMember)."""
        try:
            err = await self.view.create_topic(name, assignment, configs)
        except ConnectionError as exc:
            return KafkaError.REQUEST_TIMED_OUT, str(exc)
        return err, None if err == 0 else "topic exists"

    async def delete_topic(self, name: str, topic_id: str | None) -> Answer:
        """Marked deleted by compare-and-set, its partitions in the same transaction; this
        broker's logs are gone before the answer, the others' as their watch delivers it."""
        try:
            err = await self.view.delete_topic(name, topic_id)
        except ConnectionError as exc:
            return KafkaError.REQUEST_TIMED_OUT, str(exc)
        return err, None if err == 0 else f"topic {name!r} does not exist"

    async def add_partitions(self, name: str, decide: GrowthDecision) -> tuple[KafkaError, str]:
        """Written with the topic's new count in one transaction on the topic's version
        (decided again when it lost)."""
        try:
            return await self.view.add_partitions(name, decide)
        except ConnectionError as exc:
            return KafkaError.REQUEST_TIMED_OUT, str(exc)

    async def reassign(self, topic: str, partition: int, target: Sequence[int] | None,
                       allow_rf_change: bool) -> Answer:
        """semel.cluster.reassignment decides; the partition's new state is a
        compare-and-set, decided again when it loses."""
        view = self.view
        for _ in range(CAS_TRIES):
            st = view.partition(topic, partition)
            if st is None:
                return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{partition}"
            if target is not None and not allow_rf_change and len(target) != len(original(st)):
                return KafkaError.INVALID_REPLICATION_FACTOR, "the request does not allow a replication factor change"
            new = begin(st, target, view.brokers())
            if isinstance(new, tuple):
                return new
            if new == st:
                return KafkaError.NONE, None
            try:
                if await view.write_partition(st, new) is not None:
                    return KafkaError.NONE, None
            except ConnectionError as exc:
                return KafkaError.REQUEST_TIMED_OUT, str(exc)
        return KafkaError.REQUEST_TIMED_OUT, "the partition kept changing; try again"

    async def elect(self, topic: str, partition: int, election_type: int) -> KafkaError:
        return await run_election(self.view, topic, partition, election_type)

    def cluster_setting(self, name: str) -> str | None:
        return self.view.config(name)

    async def set_cluster_setting(self, name: str, value: str | None) -> None:
        await self.view.set_config(name, value)

    def refuse_cluster_setting(self, name: str) -> str | None:
        return None

    def refuse_broker(self, key: str) -> str | None:
        return None
