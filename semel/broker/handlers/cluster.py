"""Cluster view: DescribeCluster (60) and OffsetForLeaderEpoch (23).

On a single node one broker leads every partition at leader epoch LEADER_EPOCH
(what Metadata advertises), so the epoch lookup has one answer: that epoch ends
at the log end. In a cluster the answer comes from the partition's leader-epoch
cache (KIP-101/KIP-279): followers truncate to it after a leader change."""
from __future__ import annotations

from typing import Any

from ...cluster.elections import PREFERRED
from ...cluster.replica_manager import ReplicaManager
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.log import PartitionLog
from ..auth.acl import ResourceType
from ..auth.check import authorized_operations
from ..router import RequestContext, handler
from ..services import Services

LEADER_EPOCH = 0
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
    vacant_or_id = view.controller_id()
    controller = -1 if vacant_or_id is None else vacant_or_id
    return ctx.response(throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=endpoint,
                        cluster_id=cfg.cluster_id, controller_id=controller, brokers=brokers,
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
    plog = ctx.services.logs.get(topic, p.partition)
    if plog is None:
        return _undefined(KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
    replicas = ctx.services.replicas
    if replicas is not None:
        return _replicated_epoch_end(replicas, topic, p, plog)
    # current_leader_epoch -1 means "do not fence"; Kafka's checks otherwise.
    if p.current_leader_epoch > LEADER_EPOCH:
        return _undefined(KafkaError.UNKNOWN_LEADER_EPOCH)
    if 0 <= p.current_leader_epoch < LEADER_EPOCH:
        return _undefined(KafkaError.FENCED_LEADER_EPOCH)
    if p.leader_epoch < LEADER_EPOCH or p.leader_epoch > LEADER_EPOCH:
        # No such epoch in this log: Kafka answers "undefined" without an error.
        return _undefined(KafkaError.NONE)
    return {"error_code": KafkaError.NONE, "leader_epoch": LEADER_EPOCH, "end_offset": plog.log_end_offset}


def _replicated_epoch_end(replicas: ReplicaManager, topic: str, p: Any, plog: PartitionLog) -> dict[str, Any]:
    """Only the leader answers, at the asker's epoch (KIP-320 fencing); the end of the
    requested epoch is the start of the next larger one, or the log end for the latest."""
    err = replicas.leader_error(topic, p.partition, p.current_leader_epoch)
    if err:
        return _undefined(err)
    epoch, end = plog.epochs.end_offset_for(p.leader_epoch, plog.log_end_offset)
    return {"error_code": KafkaError.NONE, "leader_epoch": epoch, "end_offset": end}


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
