"""Partition reassignment: AlterPartitionReassignments (45), ListPartitionReassignments (46).

The ClusterAdmin moves a partition (semel.broker.cluster_admin): in a cluster
semel.cluster.reassignment decides and each partition's new state is a compare-and-set
in etcd; a single node has one replica per partition and nothing to move, and answers
what Kafka answers without a controller to move anything."""
from __future__ import annotations

from typing import Any

from ...protocol.api_keys import ApiKey
from ..router import RequestContext, handler


@handler(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 1)
async def alter_partition_reassignments(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    T, P = cls.ReassignableTopicResponse, cls.ReassignableTopicResponse.ReassignablePartitionResponse
    admin = ctx.services.admin
    allow_rf_change = getattr(req, "allow_replication_factor_change", True)
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            err, msg = await admin.reassign(t.name, p.partition_index, p.replicas, allow_rf_change)
            parts.append(P(partition_index=p.partition_index, error_code=err, error_message=msg))
        topics.append(T(name=t.name, partitions=parts))
    extra = {"allow_replication_factor_change": req.allow_replication_factor_change} if ctx.api_version >= 1 else {}
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, responses=topics, **extra)


@handler(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0)
async def list_partition_reassignments(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    T = cls.OngoingTopicReassignment
    P = T.OngoingPartitionReassignment
    states = ctx.services.metadata.partitions()   # none reassigning on a cluster of one
    if req.topics is not None:
        wanted = {(t.name, i) for t in req.topics for i in t.partition_indexes}
        states = [st for st in states if (st.topic, st.partition) in wanted]
    by_topic: dict[str, list[Any]] = {}
    for st in sorted((s for s in states if s.reassigning), key=lambda s: (s.topic, s.partition)):
        by_topic.setdefault(st.topic, []).append(P(
            partition_index=st.partition, replicas=list(st.replicas), adding_replicas=list(st.adding),
            removing_replicas=list(st.removing)))
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None,
                        topics=[T(name=n, partitions=ps) for n, ps in by_topic.items()])
