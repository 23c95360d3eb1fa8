"""Topic administration: CreateTopics (19), DeleteTopics (20), CreatePartitions (37).

A request is checked here, the same way alone as in a cluster; the change is the
ClusterAdmin's (semel.broker.cluster_admin): a write to etcd that every broker's local
logs then follow (semel.cluster.topic_sync), or on a single node to its LogManager."""
from __future__ import annotations

import functools
import logging
import uuid
from typing import Any

from ...cluster.controller import assign_new_partitions
from ...cluster.keys import TopicInfo
from ...cluster.topic_sync import is_internal
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.manager import validate_topic_config, validate_topic_name
from .common import warn_below_min_isr
from ..cluster_admin import Answer, Assignment, ClusterAdmin, Refusal
from ..config import BrokerConfig
from ..router import RequestContext, handler
from ..services import Services

log = logging.getLogger("semel.broker.topics")


@handler(ApiKey.CREATE_TOPICS, 2, 7)
async def create_topics(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    results = []
    for t in req.topics:
        code, msg, assignment = await _create(ctx.services, t, req.validate_only)
        results.append(cls.CreatableTopicResult(
            name=t.name, error_code=code, error_message=msg,
            num_partitions=len(assignment) if code == 0 else -1,
            replication_factor=len(assignment[0]) if code == 0 else -1, configs=None))
    return ctx.response(throttle_time_ms=0, topics=results)


async def _create(services: Services, t: Any, validate_only: bool) -> tuple[KafkaError, str | None, Assignment]:
    """(error, message, assignment): the request's own assignment, or the admin's spread
    (Kafka's over the live brokers; the one node alone)."""
    admin = services.admin
    configs = {c.name: c.value for c in t.configs}
    err, msg = _refuse_topic(t, configs, services.config)
    if err:
        return err, msg, []
    if t.assignments:
        assignment = _requested_assignment(t.assignments, admin.live_brokers())
    else:
        assignment = admin.assign(_partition_count(services.config, t), t.replication_factor)
    if isinstance(assignment, tuple):
        return *assignment, []
    if validate_only:
        exists = t.name in admin.topics()
        return (KafkaError.TOPIC_ALREADY_EXISTS if exists else KafkaError.NONE,
                "topic exists" if exists else None, assignment)
    err, answer = await admin.create_topic(t.name, assignment, configs)
    if err == KafkaError.NONE:
        warn_below_min_isr(services.config, t.name, len(assignment[0]), configs)
    return err, answer, assignment


def _refuse_topic(t: Any, configs: dict[str, str], cfg: BrokerConfig) -> Refusal:
    """Kafka's checks of a new topic before its replicas: name, configs, partition count;
    an explicit assignment (num_partitions = replication_factor = -1 on the wire) names
    every partition and is refused mixed with a count."""
    err, msg = validate_topic_name(t.name)
    if not err and t.name.startswith("__"):
        err, msg = KafkaError.INVALID_TOPIC_EXCEPTION, "names starting with __ are internal"
    if not err:
        err, msg, _ = validate_topic_config(configs)
    cap = cfg.max_partitions_per_request
    # 2^31-1 partitions once meant creating directories until the disk or the loop gave out
    if not err and not 1 <= _partition_count(cfg, t) <= cap:
        err, msg = KafkaError.INVALID_PARTITIONS, f"partitions must be 1..{cap}"
    if not err and t.assignments and (t.num_partitions != -1 or t.replication_factor != -1):
        err, msg = KafkaError.INVALID_REQUEST, "num_partitions and replication_factor must be -1 with a replica assignment"
    return err, msg


def _requested_assignment(assignments: list[Any], live: list[int]) -> Assignment | Refusal:
    lists = [tuple(a.broker_ids) for a in sorted(assignments, key=lambda a: a.partition_index)]
    if (sorted(a.partition_index for a in assignments) != list(range(len(lists)))
            or len({len(r) for r in lists}) != 1
            or not all(r and _distinct_live(r, live) for r in lists)):
        return (KafkaError.INVALID_REPLICA_ASSIGNMENT,
                f"each partition 0..n-1 once, the same number of distinct live brokers {live}")
    return lists


def _distinct_live(replicas: tuple[int, ...], live: list[int]) -> bool:
    """A replica list names each broker once, every one of them live."""
    return len(set(replicas)) == len(replicas) and set(replicas) <= set(live)


def _partition_count(cfg: BrokerConfig, t: Any) -> int:
    if t.assignments:
        return len(t.assignments)
    return t.num_partitions if t.num_partitions != -1 else cfg.default_partitions


@handler(ApiKey.DELETE_TOPICS, 1, 6)
async def delete_topics(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    names = [t.name for t in req.topics] if ctx.api_version >= 6 else list(req.topic_names)
    ids = [t.topic_id for t in req.topics] if ctx.api_version >= 6 else [None] * len(names)
    results = []
    for name, topic_id in zip(names, ids):
        name, err, msg = await _delete(ctx.services.admin, name, topic_id)
        if err == KafkaError.NONE:
            # A topic that vanished must be explainable from the broker log alone:
            # who asked (a client, an admin tool, or a stray frame that happens to be
            # a well-formed DeleteTopics).
            log.info("deleted topic %s (DeleteTopics v%d from %s, client %r)", name, ctx.api_version,
                     ctx.peer, ctx.client_id)
        results.append(cls.DeletableTopicResult(name=name, topic_id=topic_id, error_code=err,
                                                error_message=msg))
    return ctx.response(throttle_time_ms=0, responses=results)


_ZERO_UUID = uuid.UUID(int=0)


async def _delete(admin: ClusterAdmin, name: str | None,
                  topic_id: uuid.UUID | None) -> tuple[str | None, KafkaError, str | None]:
    """(name, error, message), by name or by topic id (v6); as Kafka, the groups'
    offsets of the topic go with it."""
    by_id = name is None and topic_id not in (None, _ZERO_UUID)
    if by_id:
        name = next((n for n, i in admin.topics().items() if uuid.UUID(i.topic_id) == topic_id), None)
        if name is None:
            return None, KafkaError.UNKNOWN_TOPIC_ID, "no topic has this id"
    if not name:
        return name, KafkaError.INVALID_REQUEST, "a topic name or id is required"
    if is_internal(name):
        return name, KafkaError.INVALID_REQUEST, f"internal topic {name!r} cannot be deleted"
    answer: Answer = await admin.delete_topic(name, str(topic_id) if by_id else None)
    return name, *answer


@handler(ApiKey.CREATE_PARTITIONS, 0, 3)
async def create_partitions(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    names = [t.name for t in req.topics]
    results = []
    for t in req.topics:
        if names.count(t.name) > 1:  # Kafka refuses a topic named twice in one request
            err, msg = KafkaError.INVALID_REQUEST, "topic named more than once in the request"
        else:
            err, msg = await _grow(ctx.services, t, req.validate_only)
        results.append(cls.CreatePartitionsTopicResult(
            name=t.name, error_code=err, error_message=None if err == 0 else (msg or err.name)))
    return ctx.response(throttle_time_ms=0, results=results)


async def _grow(services: Services, t: Any, validate_only: bool) -> tuple[KafkaError, str]:
    """New partitions, each led by its first replica at epoch 0 with ISR = replicas, like
    a new topic's; the admin decides again when the topic changed meanwhile."""
    admin = services.admin
    if is_internal(t.name):
        return KafkaError.INVALID_REQUEST, f"internal topic {t.name!r} keeps its partition count"
    decide = functools.partial(_decide_growth, t, admin.live_brokers(), services.config.max_partitions_per_request)
    if validate_only:
        info = admin.topics().get(t.name)
        if info is None:
            return KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"topic {t.name!r} does not exist"
        err, msg, _ = decide(info)
        return err, msg
    return await admin.add_partitions(t.name, decide)


def _decide_growth(t: Any, live: list[int], cap: int, info: TopicInfo) -> tuple[KafkaError, str, Assignment]:
    """(error, message, replica lists of the new partitions) for growing `info` to t.count:
    the request's assignment if it gives one (one list per new partition, the topic's
    replication factor of distinct live brokers), else round-robin over the live brokers."""
    if t.count <= info.partitions:
        what = "already has" if t.count == info.partitions else "has"
        return KafkaError.INVALID_PARTITIONS, (
            f"topic {t.name!r} {what} {info.partitions} partitions; a topic's partition count only grows"), []
    new = t.count - info.partitions
    if new > cap:
        return KafkaError.INVALID_PARTITIONS, f"more than max_partitions_per_request={cap} new partitions", []
    if t.assignments is None:
        try:
            return KafkaError.NONE, "", assign_new_partitions(live, info.partitions, t.count, info.replication_factor)
        except ValueError as exc:
            return KafkaError.INVALID_REPLICATION_FACTOR, str(exc), []
    lists = [tuple(a.broker_ids) for a in t.assignments]
    if len(lists) != new or not all(len(r) == info.replication_factor and _distinct_live(r, live)
                                    for r in lists):
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, (
            f"{new} assignments of {info.replication_factor} distinct live brokers {live} needed"), []
    return KafkaError.NONE, "", lists
