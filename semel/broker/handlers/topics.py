"""Topic administration: CreateTopics (19), DeleteTopics (20), CreatePartitions (37).

In a cluster each is a write to etcd (semel.cluster.metadata), which every broker's
local logs then follow (semel.cluster.topic_sync)."""
from __future__ import annotations

import functools
import uuid

from ...cluster.controller import assign_new_partitions, assign_replicas
from ...cluster.topic_sync import is_internal
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.manager import validate_topic_config, validate_topic_name
from ..router import RequestContext, handler


@handler(ApiKey.CREATE_TOPICS, 2, 7)
async def create_topics(ctx: RequestContext, req):
    cls = ctx.cls()
    results = []
    for t in req.topics:
        rf = 1
        if ctx.services.cluster is not None:
            code, msg, nparts, rf = await _create_in_cluster(ctx, t, req.validate_only)
        else:
            code, msg, nparts = _create_one(ctx, t, req.validate_only)
        results.append(cls.CreatableTopicResult(
            name=t.name, error_code=code, error_message=msg,
            num_partitions=nparts if code == 0 else -1,
            replication_factor=rf if code == 0 else -1, configs=None))
    return ctx.response(throttle_time_ms=0, topics=results)


async def _create_in_cluster(ctx: RequestContext, t, validate_only: bool):
    """(error, message, partitions, replication factor): the assignment is decided here
    (Kafka's spread over the live brokers, or the request's own) and written to etcd in
    one create-if-absent transaction; every broker then opens the logs (ClusterMember)."""
    view = ctx.services.cluster
    cfg = ctx.services.config
    nparts = _partition_count(ctx, t)
    configs = {c.name: c.value for c in t.configs}
    err, msg = validate_topic_name(t.name)
    if not err and t.name.startswith("__"):
        err, msg = KafkaError.INVALID_TOPIC_EXCEPTION, "names starting with __ are internal"
    if not err:
        err, msg, _ = validate_topic_config(configs)
    if not err and not 1 <= nparts <= cfg.max_partitions_per_request:
        err, msg = KafkaError.INVALID_PARTITIONS, f"partitions must be 1..{cfg.max_partitions_per_request}"
    if err:
        return err, msg, nparts, -1
    live = sorted(view.brokers())
    if t.assignments:
        if t.num_partitions != -1 or t.replication_factor != -1:
            return (KafkaError.INVALID_REQUEST,
                    "num_partitions and replication_factor must be -1 with a replica assignment", -1, -1)
        assignment = [tuple(a.broker_ids) for a in sorted(t.assignments, key=lambda a: a.partition_index)]
        if (sorted(a.partition_index for a in t.assignments) != list(range(len(assignment)))
                or len({len(r) for r in assignment}) != 1
                or any(not r or len(set(r)) != len(r) or not set(r) <= set(live) for r in assignment)):
            return (KafkaError.INVALID_REPLICA_ASSIGNMENT,
                    f"each partition 0..n-1 once, the same number of distinct live brokers {live}", -1, -1)
    else:
        rf = cfg.default_replication_factor if t.replication_factor == -1 else t.replication_factor
        try:
            assignment = assign_replicas(live, nparts, rf)
        except ValueError as exc:
            return KafkaError.INVALID_REPLICATION_FACTOR, str(exc), nparts, -1
    rf = len(assignment[0])
    if validate_only:
        exists = t.name in view.topics()
        return (KafkaError.TOPIC_ALREADY_EXISTS if exists else KafkaError.NONE,
                "topic exists" if exists else None, len(assignment), rf)
    try:
        err = await view.create_topic(t.name, assignment, configs)
    except ConnectionError as exc:   # etcd unreachable
        return KafkaError.REQUEST_TIMED_OUT, str(exc), -1, -1
    return err, (None if err == 0 else "topic exists"), len(assignment), rf


def _create_one(ctx: RequestContext, t, validate_only: bool):
    if t.assignments:
        # An explicit assignment (num_partitions = replication_factor = -1 on the wire)
        # names every partition; Kafka refuses it mixed with a count.
        if t.num_partitions != -1 or t.replication_factor != -1:
            return (KafkaError.INVALID_REQUEST,
                    "num_partitions and replication_factor must be -1 with a replica assignment", -1)
        err, msg = _check_create_assignment(ctx, t.assignments)
        if err:
            return err, msg, -1
    nparts = _partition_count(ctx, t)
    cap = ctx.services.config.max_partitions_per_request
    if nparts > cap:  # 2^31-1 partitions once meant creating directories until the disk or the loop gave out
        return KafkaError.INVALID_PARTITIONS, f"more than max_partitions_per_request={cap} partitions", nparts
    if t.replication_factor not in (-1, 1):
        return KafkaError.INVALID_REPLICATION_FACTOR, "a single broker holds one replica", nparts
    configs = {c.name: c.value for c in t.configs}
    if t.name.startswith("__"):
        return KafkaError.INVALID_TOPIC_EXCEPTION, "names starting with __ are internal", nparts
    if validate_only:
        err, msg = validate_topic_name(t.name)
        if not err:
            err, msg, _ = validate_topic_config(configs)
        if not err and t.name in ctx.services.logs.topics():
            err, msg = KafkaError.TOPIC_ALREADY_EXISTS, "topic exists"
        return err, msg or None, nparts
    logs = ctx.services.logs
    err = logs.create_topic(t.name, nparts, configs)
    return err, (None if err == 0 else (logs.last_error_message or err.name)), nparts


def _partition_count(ctx: RequestContext, t) -> int:
    if t.assignments:
        return len(t.assignments)
    return t.num_partitions if t.num_partitions != -1 else ctx.services.config.default_partitions


def _check_create_assignment(ctx: RequestContext, assignments) -> tuple[KafkaError, str]:
    """Partitions 0..n-1 each once, each on this broker (the only one)."""
    if sorted(a.partition_index for a in assignments) != list(range(len(assignments))):
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, "assigned partitions must be 0..n-1, each once"
    return _check_brokers(ctx, (a.broker_ids for a in assignments))


def _check_brokers(ctx: RequestContext, replica_lists) -> tuple[KafkaError, str]:
    node = ctx.services.config.node_id
    if any(list(ids) != [node] for ids in replica_lists):
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, f"this cluster has one broker, id {node}"
    return KafkaError.NONE, ""


@handler(ApiKey.DELETE_TOPICS, 1, 6)
async def delete_topics(ctx: RequestContext, req):
    cls = ctx.cls()
    names = [t.name for t in req.topics] if ctx.api_version >= 6 else list(req.topic_names)
    if ctx.services.cluster is not None:
        ids = [t.topic_id for t in req.topics] if ctx.api_version >= 6 else [None] * len(names)
        results = []
        for name, topic_id in zip(names, ids):
            name, err, msg = await _delete_in_cluster(ctx, name, topic_id)
            results.append(cls.DeletableTopicResult(name=name, topic_id=topic_id, error_code=err,
                                                    error_message=msg))
        return ctx.response(throttle_time_ms=0, responses=results)
    results = []
    for name in names:
        if name is None or name.startswith("__"):
            err = KafkaError.INVALID_TOPIC_EXCEPTION if name else KafkaError.UNKNOWN_TOPIC_ID
        else:
            err = ctx.services.logs.delete_topic(name)
            if err == KafkaError.NONE:   # as Kafka: the groups' offsets of the topic go with it
                ctx.services.group_coordinator.drop_topic_offsets([name])
        results.append(cls.DeletableTopicResult(name=name, error_code=err,
                                                error_message=None if err == 0 else err.name))
    return ctx.response(throttle_time_ms=0, responses=results)


_ZERO_UUID = uuid.UUID(int=0)


async def _delete_in_cluster(ctx: RequestContext, name, topic_id):
    """(name, error, message): the topic marked deleted in etcd by compare-and-set (its
    partitions go in the same transaction); this broker's logs are gone before the answer,
    the others' as their watch delivers it. By name, or by topic id (v6)."""
    view = ctx.services.cluster
    by_id = name is None and topic_id not in (None, _ZERO_UUID)
    if by_id:
        name = next((n for n, i in view.topics().items() if uuid.UUID(i.topic_id) == topic_id), None)
        if name is None:
            return None, KafkaError.UNKNOWN_TOPIC_ID, "no topic has this id"
    if not name:
        return name, KafkaError.INVALID_REQUEST, "a topic name or id is required"
    if is_internal(name):
        return name, KafkaError.INVALID_REQUEST, f"internal topic {name!r} cannot be deleted"
    try:
        err = await view.delete_topic(name, str(topic_id) if by_id else None)
    except ConnectionError as exc:   # etcd unreachable
        return name, KafkaError.REQUEST_TIMED_OUT, str(exc)
    return name, err, None if err == 0 else f"topic {name!r} does not exist"


@handler(ApiKey.CREATE_PARTITIONS, 0, 3)
async def create_partitions(ctx: RequestContext, req):
    cls = ctx.cls()
    names = [t.name for t in req.topics]
    results = []
    for t in req.topics:
        if names.count(t.name) > 1:  # Kafka refuses a topic named twice in one request
            err, msg = KafkaError.INVALID_REQUEST, "topic named more than once in the request"
        elif ctx.services.cluster is not None:
            err, msg = await _grow_in_cluster(ctx, t, req.validate_only)
        else:
            err, msg = _grow_one(ctx, t, req.validate_only)
        results.append(cls.CreatePartitionsTopicResult(
            name=t.name, error_code=err, error_message=None if err == 0 else (msg or err.name)))
    return ctx.response(throttle_time_ms=0, results=results)


async def _grow_in_cluster(ctx: RequestContext, t, validate_only: bool) -> tuple[KafkaError, str]:
    """New partitions written to etcd with the topic's new count in one transaction on the
    topic's version (decided again when it lost); each led by its first replica at epoch 0
    with ISR = replicas, like a new topic's; every broker then opens their logs."""
    view = ctx.services.cluster
    if is_internal(t.name):
        return KafkaError.INVALID_REQUEST, f"internal topic {t.name!r} keeps its partition count"
    decide = functools.partial(_decide_growth, t, sorted(view.brokers()), ctx.services.config.max_partitions_per_request)
    if validate_only:
        info = view.topics().get(t.name)
        if info is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {t.name!r} does not exist"
        err, msg, _ = decide(info)
        return err, msg
    try:
        return await view.add_partitions(t.name, decide)
    except ConnectionError as exc:   # etcd unreachable
        return KafkaError.REQUEST_TIMED_OUT, str(exc)


def _decide_growth(t, live: list[int], cap: int, info):
    """(error, message, replica lists of the new partitions) for growing `info` to t.count:
    the request's assignment if it gives one (one list per new partition, the topic's
    replication factor of distinct live brokers), else round-robin over the live brokers."""
    if t.count <= info.partitions:
        what = "already has" if t.count == info.partitions else "has"
        return KafkaError.INVALID_PARTITIONS, (
            f"topic {t.name!r} {what} {info.partitions} partitions; a topic's partition count only grows"), None
    new = t.count - info.partitions
    if new > cap:
        return KafkaError.INVALID_PARTITIONS, f"more than max_partitions_per_request={cap} new partitions", None
    if t.assignments is None:
        try:
            return KafkaError.NONE, "", assign_new_partitions(live, info.partitions, t.count, info.replication_factor)
        except ValueError as exc:
            return KafkaError.INVALID_REPLICATION_FACTOR, str(exc), None
    lists = [tuple(a.broker_ids) for a in t.assignments]
    if len(lists) != new or any(len(r) != info.replication_factor or len(set(r)) != len(r)
                                or not set(r) <= set(live) for r in lists):
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, (
            f"{new} assignments of {info.replication_factor} distinct live brokers {live} needed"), None
    return KafkaError.NONE, "", lists


def _grow_one(ctx: RequestContext, t, validate_only: bool) -> tuple[KafkaError, str]:
    """Kafka's checks in its order: topic known, count grows, assignment fits the new partitions."""
    logs = ctx.services.logs
    info = logs.topics().get(t.name)
    if info is None:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {t.name!r} does not exist"
    if t.count <= info.partitions:
        what = "already has" if t.count == info.partitions else "has"
        return KafkaError.INVALID_PARTITIONS, (
            f"topic {t.name!r} {what} {info.partitions} partitions; a topic's partition count only grows")
    cap = ctx.services.config.max_partitions_per_request
    if t.count - info.partitions > cap:
        return KafkaError.INVALID_PARTITIONS, f"more than max_partitions_per_request={cap} new partitions"
    if t.assignments is not None:
        err, msg = _check_assignment(ctx, t.assignments, t.count - info.partitions)
        if err:
            return err, msg
    if validate_only:
        return KafkaError.NONE, ""
    err = logs.create_partitions(t.name, t.count)
    return err, logs.last_error_message


def _check_assignment(ctx: RequestContext, assignments, new: int) -> tuple[KafkaError, str]:
    if len(assignments) != new:
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, (
            f"{len(assignments)} assignments given for {new} new partitions")
    return _check_brokers(ctx, (a.broker_ids for a in assignments))
