"""The coordinators' internal topics as cluster topics (issue 13, item 3, step 1; not
wired yet).

`__transaction_state` and `__consumer_offsets` are created in etcd the first time a
coordinator is looked for (FindCoordinator), like any topic but with the replication
factor `internal_replication_factor` picks (min(3, live brokers)) and the coordinators'
own retention and segment configs. One partition each: the coordinators address a
single partition. The coordinator of each is the leader of partition 0.
"""
from __future__ import annotations

from ..protocol.errors import KafkaError
from .controller import assign_replicas
from .coordinator_seat import internal_replication_factor
from .state import PartitionState

PARTITION = 0


async def ensure_internal_topic(view, name: str, configs: dict) -> PartitionState | KafkaError:
    """Partition 0 of the internal topic `name`, created first if the cluster has none.
    COORDINATOR_NOT_AVAILABLE (the client looks again) while no broker is live or a
    creation by another broker is not yet visible here."""
    st = view.partition(name, PARTITION)
    if st is not None:
        return st
    live = view.brokers()
    if not live:
        return KafkaError.COORDINATOR_NOT_AVAILABLE
    assignment = assign_replicas(live, 1, internal_replication_factor(len(live)))
    err = await view.create_topic(name, assignment, dict(configs))
    if err not in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS):
        return KafkaError.COORDINATOR_NOT_AVAILABLE
    st = view.partition(name, PARTITION)
    return st if st is not None else KafkaError.COORDINATOR_NOT_AVAILABLE


def coordinator_node(view, name: str) -> int | None:
    """The broker coordinating for `name`'s keys now: its partition's live leader, or
    None (offline, not created yet: COORDINATOR_NOT_AVAILABLE for FindCoordinator)."""
    st = view.partition(name, PARTITION)
    if st is None or not st.has_leader or st.leader not in view.brokers():
        return None
    return st.leader
