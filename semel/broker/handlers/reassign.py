"""Partition reassignment: AlterPartitionReassignments (45), ListPartitionReassignments (46).

A cluster only (semel.cluster.reassignment decides; each partition's new state is a
compare-and-set in etcd, decided again when it loses). A single node has one replica
per partition and nothing to move: it answers what Kafka answers without a
controller to move anything."""
from __future__ import annotations

from ...cluster.reassignment import begin, original
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..router import RequestContext, handler

CAS_TRIES = 10


@handler(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 1)
async def alter_partition_reassignments(ctx: RequestContext, req):
    cls = ctx.cls()
    T, P = cls.ReassignableTopicResponse, cls.ReassignableTopicResponse.ReassignablePartitionResponse
    view = ctx.services.cluster
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            if view is None:
                err, msg = KafkaError.INVALID_REPLICA_ASSIGNMENT, "a single node has nothing to reassign"
            else:
                err, msg = await _alter_one(view, t.name, p.partition_index, p.replicas,
                                            getattr(req, "allow_replication_factor_change", True))
            parts.append(P(partition_index=p.partition_index, error_code=err, error_message=msg))
        topics.append(T(name=t.name, partitions=parts))
    extra = {"allow_replication_factor_change": req.allow_replication_factor_change} if ctx.api_version >= 1 else {}
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, responses=topics, **extra)


async def _alter_one(view, topic: str, index: int, replicas, allow_rf_change: bool) -> tuple[KafkaError, str | None]:
    for _ in range(CAS_TRIES):
        st = view.partition(topic, index)
        if st is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {topic}-{index}"
        if replicas is not None and not allow_rf_change and len(replicas) != len(original(st)):
            return KafkaError.INVALID_REPLICATION_FACTOR, "the request does not allow a replication factor change"
        new = begin(st, replicas, view.brokers())
        if isinstance(new, tuple):
            return new
        if new == st:
            return KafkaError.NONE, None
        try:
            if await view.write_partition(st, new) is not None:
                return KafkaError.NONE, None
        except ConnectionError as exc:   # etcd unreachable
            return KafkaError.REQUEST_TIMED_OUT, str(exc)
    return KafkaError.REQUEST_TIMED_OUT, "the partition kept changing; try again"


@handler(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0)
async def list_partition_reassignments(ctx: RequestContext, req):
    cls = ctx.cls()
    T = cls.OngoingTopicReassignment
    P = T.OngoingPartitionReassignment
    states = ctx.services.metadata.partitions()   # none reassigning on a cluster of one
    if req.topics is not None:
        wanted = {(t.name, i) for t in req.topics for i in t.partition_indexes}
        states = [st for st in states if (st.topic, st.partition) in wanted]
    by_topic: dict[str, list] = {}
    for st in sorted((s for s in states if s.reassigning), key=lambda s: (s.topic, s.partition)):
        by_topic.setdefault(st.topic, []).append(P(
            partition_index=st.partition, replicas=list(st.replicas), adding_replicas=list(st.adding),
            removing_replicas=list(st.removing)))
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None,
                        topics=[T(name=n, partitions=ps) for n, ps in by_topic.items()])
