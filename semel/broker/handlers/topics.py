"""Topic administration: CreateTopics (19), DeleteTopics (20), CreatePartitions (37)."""
from __future__ import annotations

from ...protocol.errors import KafkaError
from ...storage.manager import validate_topic_config, validate_topic_name
from ..router import handler


@handler(19, 2, 7)
async def create_topics(ctx, req):
    cls = ctx.cls()
    results = []
    for t in req.topics:
        rf = 1
        if ctx.broker.cluster is not None:
            code, msg, nparts, rf = await _create_in_cluster(ctx, t, req.validate_only)
        else:
            code, msg, nparts = _create_one(ctx, t, req.validate_only)
        results.append(cls.CreatableTopicResult(
            name=t.name, error_code=code, error_message=msg,
            num_partitions=nparts if code == 0 else -1,
            replication_factor=rf if code == 0 else -1, configs=None))
    return ctx.response(throttle_time_ms=0, topics=results)


async def _create_in_cluster(ctx, t, validate_only: bool):
    """(error, message, partitions, replication factor): the assignment is decided here
    (Kafka's spread over the live brokers, or the request's own) and written to etcd in
    one create-if-absent transaction; every broker then opens the logs (ClusterMember)."""
    from ...cluster.controller import assign_replicas
    view = ctx.broker.cluster
    cfg = ctx.broker.config
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


def _create_one(ctx, t, validate_only: bool):
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
    cap = ctx.broker.config.max_partitions_per_request
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
        if not err and t.name in ctx.broker.logs.topics():
            err, msg = KafkaError.TOPIC_ALREADY_EXISTS, "topic exists"
        return err, msg or None, nparts
    logs = ctx.broker.logs
    err = logs.create_topic(t.name, nparts, configs)
    return err, (None if err == 0 else (logs.last_error_message or err.name)), nparts


def _partition_count(ctx, t) -> int:
    if t.assignments:
        return len(t.assignments)
    return t.num_partitions if t.num_partitions != -1 else ctx.broker.config.default_partitions


def _check_create_assignment(ctx, assignments) -> tuple[KafkaError, str]:
    """Partitions 0..n-1 each once, each on this broker (the only one)."""
    if sorted(a.partition_index for a in assignments) != list(range(len(assignments))):
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, "assigned partitions must be 0..n-1, each once"
    return _check_brokers(ctx, (a.broker_ids for a in assignments))


def _check_brokers(ctx, replica_lists) -> tuple[KafkaError, str]:
    node = ctx.broker.config.node_id
    if any(list(ids) != [node] for ids in replica_lists):
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, f"this cluster has one broker, id {node}"
    return KafkaError.NONE, ""


@handler(20, 1, 6)
async def delete_topics(ctx, req):
    cls = ctx.cls()
    names = [t.name for t in req.topics] if ctx.api_version >= 6 else list(req.topic_names)
    if ctx.broker.cluster is not None:   # not yet: deletion must reach every replica (docs/cluster.md)
        return ctx.response(throttle_time_ms=0, responses=[cls.DeletableTopicResult(
            name=n, error_code=KafkaError.INVALID_REQUEST,
            error_message="deleting topics is not supported in a cluster yet") for n in names])
    results = []
    for name in names:
        if name is None or name.startswith("__"):
            err = KafkaError.INVALID_TOPIC_EXCEPTION if name else KafkaError.UNKNOWN_TOPIC_ID
        else:
            err = ctx.broker.logs.delete_topic(name)
        results.append(cls.DeletableTopicResult(name=name, error_code=err,
                                                error_message=None if err == 0 else err.name))
    return ctx.response(throttle_time_ms=0, responses=results)


@handler(37, 0, 3)
async def create_partitions(ctx, req):
    cls = ctx.cls()
    names = [t.name for t in req.topics]
    results = []
    for t in req.topics:
        if ctx.broker.cluster is not None:   # not yet: new partitions need an assignment in etcd
            err, msg = KafkaError.INVALID_REQUEST, "adding partitions is not supported in a cluster yet"
        elif names.count(t.name) > 1:  # Kafka refuses a topic named twice in one request
            err, msg = KafkaError.INVALID_REQUEST, "topic named more than once in the request"
        else:
            err, msg = _grow_one(ctx, t, req.validate_only)
        results.append(cls.CreatePartitionsTopicResult(
            name=t.name, error_code=err, error_message=None if err == 0 else (msg or err.name)))
    return ctx.response(throttle_time_ms=0, results=results)


def _grow_one(ctx, t, validate_only: bool) -> tuple[KafkaError, str]:
    """Kafka's checks in its order: topic known, count grows, assignment fits the new partitions."""
    logs = ctx.broker.logs
    info = logs.topics().get(t.name)
    if info is None:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {t.name!r} does not exist"
    if t.count <= info.partitions:
        what = "already has" if t.count == info.partitions else "has"
        return KafkaError.INVALID_PARTITIONS, (
            f"topic {t.name!r} {what} {info.partitions} partitions; a topic's partition count only grows")
    cap = ctx.broker.config.max_partitions_per_request
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


def _check_assignment(ctx, assignments, new: int) -> tuple[KafkaError, str]:
    if len(assignments) != new:
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, (
            f"{len(assignments)} assignments given for {new} new partitions")
    return _check_brokers(ctx, (a.broker_ids for a in assignments))
