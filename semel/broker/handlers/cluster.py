"""Cluster view: DescribeCluster (60) and OffsetForLeaderEpoch (23).

The epoch lookup is the leader's (`Services.replicas.epoch_end`): in a cluster from
the partition's leader-epoch cache (KIP-101/KIP-279), which followers truncate to after
a leader change; on a single node, which leads every partition at
node_view.LEADER_EPOCH (what Metadata advertises), that one epoch ends at the log end."""
from __future__ import annotations

from typing import Any

from ...cluster.elections import PREFERRED
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..auth.acl import ResourceType
from ..auth_check import authorized_operations
from ..router import RequestContext, handler
from ..services import Services
from .common import named_controller

ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS = 1, 2
NO_OPERATIONS = None  # the codec writes Kafka's "not asked for" (-2^31) for None


@handler(ApiKey.DESCRIBE_CLUSTER, 0, 2)
async def describe_cluster(ctx: RequestContext, req: Any) -> Any:
    cfg = ctx.services.config
    cls = ctx.cls()
    endpoint = req.endpoint_type if ctx.api_version >= 1 else ENDPOINT_BROKERS
    if endpoint != ENDPOINT_BROKERS:
        # Kafka: a broker asked for controllers answers MISMATCHED_ENDPOINT_TYPE.
        err = KafkaError.MISMATCHED_ENDPOINT_TYPE if endpoint == ENDPOINT_CONTROLLERS \
            else KafkaError.UNSUPPORTED_ENDPOINT_TYPE
        return ctx.response(throttle_time_ms=0, error_code=err, error_message=err.name,
                            endpoint_type=endpoint, cluster_id=cfg.cluster_id, controller_id=-1,
                            brokers=[], authorized_operations=NO_OPERATIONS)
    # Every live broker and the controller, as Metadata lists them (this node alone).
    view = ctx.services.metadata
    brokers = [cls.DescribeClusterBroker(broker_id=b.node_id, host=b.host, port=b.port, rack=b.rack,
                                         is_fenced=False)
               for b in sorted(view.brokers().values(), key=lambda b: b.node_id)]
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=endpoint,
                        cluster_id=cfg.cluster_id, controller_id=named_controller(view, cfg.node_id),
                        brokers=brokers,
                        authorized_operations=authorized_operations(
                            ctx, req.include_cluster_authorized_operations, ResourceType.CLUSTER))


@handler(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4)
async def offset_for_leader_epoch(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    T = cls.OffsetForLeaderTopicResult
    topics = [T(topic=t.topic, partitions=[
        T.EpochEndOffset(partition=p.partition, **_epoch_end(ctx, t.topic, p)) for p in t.partitions])
        for t in req.topics]
    return ctx.response(throttle_time_ms=0, topics=topics)


def _epoch_end(ctx: RequestContext, topic: str, p: Any) -> dict[str, Any]:
    """Only the leader answers, at the asker's epoch (KIP-320 fencing; -1: do not fence)."""
    if ctx.services.logs.get(topic, p.partition) is None:
        return _undefined(KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
    err, epoch, end = ctx.services.replicas.epoch_end(topic, p.partition, p.current_leader_epoch, p.leader_epoch)
    return {"error_code": err, "leader_epoch": epoch, "end_offset": end}


def _undefined(err: KafkaError) -> dict[str, Any]:
    return {"error_code": err, "leader_epoch": -1, "end_offset": -1}


@handler(ApiKey.ELECT_LEADERS, 0, 2)
async def elect_leaders(ctx: RequestContext, req: Any) -> Any:
    """ElectLeaders: preferred (0) or unclean (1) election of the partitions named, or of
    every partition when none are (then only those where something happened, or failed,
    are listed, as Kafka does). Any broker answers: in a cluster the election is a
    compare-and-set in the metadata service (semel.cluster.elections), not the
    controller's memory; a single node leads every partition already (the ClusterAdmin,
    semel.broker.cluster_admin, answers for both)."""
    cls = ctx.cls()
    R = cls.ReplicaElectionResult
    election_type = req.election_type if ctx.api_version >= 1 else PREFERRED
    if not ctx.authorize("ALTER", "CLUSTER", "kafka-cluster"):
        err = KafkaError.CLUSTER_AUTHORIZATION_FAILED
        results = [R(topic=t.topic, partition_result=[
            R.PartitionResult(partition_id=p, error_code=err, error_message=err.name) for p in t.partitions])
            for t in req.topic_partitions or ()]
        return ctx.response(throttle_time_ms=0, error_code=err, replica_election_results=results)
    everything = req.topic_partitions is None
    asked = _all_partitions(ctx.services) if everything else \
        [(t.topic, list(t.partitions)) for t in req.topic_partitions]
    results = []
    for topic, parts in asked:
        done = []
        for p in parts:
            err = await ctx.services.admin.elect(topic, p, election_type)
            if everything and err == KafkaError.ELECTION_NOT_NEEDED:
                continue
            done.append(R.PartitionResult(partition_id=p, error_code=err,
                                          error_message=None if err == KafkaError.NONE else err.name))
        if done:
            results.append(R(topic=topic, partition_result=done))
    return ctx.response(throttle_time_ms=0, error_code=KafkaError.NONE, replica_election_results=results)


def _all_partitions(services: Services) -> list[tuple[str, list[int]]]:
    return [(name, list(range(info.partitions))) for name, info in sorted(services.metadata.topics().items())]
