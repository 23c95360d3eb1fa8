"""The coordinators' internal topics as cluster topics.

`__transaction_state` and `__consumer_offsets` are created in etcd the first time a
coordinator is looked for (FindCoordinator), like any topic but with the replication
factor `internal_replication_factor` picks (min(3, live brokers)), the coordinators'
own retention and segment configs, and the broker's partition count for them
(`transaction_state_partitions`, `offsets_topic_partitions`; Kafka's
transaction.state.log.num.partitions and offsets.topic.num.partitions). Their leaders
spread over the brokers like any topic's (`assign_replicas`). An id's coordinator is
the leader of its partition (semel.protocol.txn_hash.partition_for; the coordinators of
those partitions: semel.coordinator.partitioned).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.errors import KafkaError
from .controller import assign_replicas
from .coordinator_seat import internal_replication_factor
from .state import PartitionState

if TYPE_CHECKING:
    from .metadata import ClusterMetadata


async def ensure_internal_topic(view: ClusterMetadata, name: str, configs: dict[str, str], partitions: int = 1,
                                partition: int = 0) -> PartitionState | KafkaError:
    """Partition `partition` of the internal topic `name`, the topic created first (with
    `partitions` partitions) if the cluster has none. COORDINATOR_NOT_AVAILABLE (the
    client looks again) while no broker is live or a creation by another broker is not
    yet visible here."""
    st = view.partition(name, partition)
    if st is not None:
        return st
    live = view.brokers()
    if not live:
        return KafkaError.COORDINATOR_NOT_AVAILABLE
    assignment = assign_replicas(live, partitions, internal_replication_factor(len(live)))
    err = await view.create_topic(name, assignment, dict(configs))
    if err not in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS):
        return KafkaError.COORDINATOR_NOT_AVAILABLE
    st = view.partition(name, partition)
    return st if st is not None else KafkaError.COORDINATOR_NOT_AVAILABLE


def coordinator_node(view: ClusterMetadata, name: str, partition: int = 0) -> int | None:
    """The broker coordinating for the keys of `name`'s `partition` now: its live leader,
    or None (offline, not created yet: COORDINATOR_NOT_AVAILABLE for FindCoordinator)."""
    st = view.partition(name, partition)
    if st is None or not st.has_leader or st.leader not in view.brokers():
        return None
    return st.leader


def topic_partition_count(view: ClusterMetadata | None, topic: str) -> int | None:
    """The partition count of `topic` in the cluster view (None before it exists, or on
    a single node, which has no cluster view): what a partitioned coordinator checks its
    own count against."""
    info = None if view is None else view.topics().get(topic)
    return None if info is None else int(info.partitions)
