"""A share group's start offsets (KIP-932) for administrators: DescribeShareGroupOffsets
(90, v0-1; v1 adds the lag), AlterShareGroupOffsets (91, v0) and
DeleteShareGroupOffsets (92, v0).

The share coordinator keeps the share-partitions (semel.coordinator.share_offsets
decides); this module checks names and rights and shapes the answers. A group id in use
by a consumer group is not a share group: GROUP_ID_NOT_FOUND, as Kafka answers.
"""
from __future__ import annotations

import uuid
from typing import Any

from ...coordinator import share_offsets as offsets
from ...coordinator.share_coordinator import ShareCoordinator
from ...coordinator.share_partition import SharePartition
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..router import RequestContext, handler
from .groups import topic_catalogue
from .metadata import ZERO_UUID
from .share_groups import consumer_group_conflict

NOT_SHARE = "Group {} is not a share group."
NON_EMPTY = "Group {} has members; stop them first."


def _topic_id(catalogue: dict[str, tuple[uuid.UUID, int]], topic: str) -> uuid.UUID:
    return catalogue.get(topic, (ZERO_UUID, 0))[0]


def _group_error(ctx: RequestContext, share: ShareCoordinator | None, group_id: str, operation: str,
                 *, must_exist: bool = True) -> tuple[KafkaError, str | None]:
    """(error, message) that refuses the whole group, or (NONE, None)."""
    if share is None:
        return KafkaError.UNSUPPORTED_VERSION, None
    if not ctx.authorize(operation, "GROUP", group_id):
        return KafkaError.GROUP_AUTHORIZATION_FAILED, None
    if consumer_group_conflict(ctx, group_id):
        return KafkaError.GROUP_ID_NOT_FOUND, NOT_SHARE.format(group_id)
    err = offsets.group_error(share, group_id, must_exist=must_exist)
    if err == KafkaError.GROUP_ID_NOT_FOUND:
        return err, f"Group {group_id} not found."
    return err, None


def _partition_error(ctx: RequestContext, topic: str, p: int, operation: str) -> KafkaError:
    if not ctx.authorize(operation, "TOPIC", topic):
        return KafkaError.TOPIC_AUTHORIZATION_FAILED
    info = topic_catalogue(ctx.services).get(topic)
    if info is None or not 0 <= p < info[1]:
        return KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    return KafkaError.NONE


# --- DescribeShareGroupOffsets ---------------------------------------------------------

@handler(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, 0, 1)
async def describe_share_group_offsets(ctx: RequestContext, req: Any) -> Any:
    G = ctx.cls().DescribeShareGroupOffsetsResponseGroup
    share = ctx.services.share_coordinator
    groups = []
    for g in req.groups or ():
        err, message = _group_error(ctx, share, g.group_id, "DESCRIBE")
        if err or share is None:
            groups.append(G(group_id=g.group_id, topics=[], error_code=err, error_message=message or err.name))
            continue
        groups.append(G(group_id=g.group_id, topics=_described_topics(ctx, share, g, G.DescribeShareGroupOffsetsResponseTopic),
                        error_code=0, error_message=None))
    return ctx.response(throttle_time_ms=0, groups=groups)


def _described_topics(ctx: RequestContext, share: ShareCoordinator, g: Any, T: Any) -> list[Any]:
    """Every share-partition asked for (all the group has state for when Topics is
    null); one without state says StartOffset -1, as Kafka's does."""
    known = offsets.start_offsets(share, g.group_id)
    if g.topics is None:
        wanted = sorted(known)
    else:
        wanted = [(t.topic_name, p) for t in g.topics for p in t.partitions]
    catalogue = topic_catalogue(ctx.services)
    P = T.DescribeShareGroupOffsetsResponsePartition
    by_topic: dict[str, list[Any]] = {}
    for topic, p in wanted:
        err = _partition_error(ctx, topic, p, "DESCRIBE")
        sp = known.get((topic, p)) if not err else None
        plog = ctx.services.logs.get(topic, p)
        epoch = plog.leader_epoch if plog is not None and plog.leader_epoch is not None else 0
        by_topic.setdefault(topic, []).append(P(
            partition_index=p, start_offset=sp.start if sp else -1, leader_epoch=epoch if sp else -1,
            lag=offsets.lag(sp, plog.high_watermark) if sp and plog else -1,
            error_code=err, error_message=err.name if err else None, **_window(sp)))
    return [T(topic_name=t, topic_id=_topic_id(catalogue, t), partitions=ps)
            for t, ps in by_topic.items()]


def _window(sp: SharePartition | None) -> dict[str, int]:
    """semel's tagged fields: the share-partition's window by record state."""
    if sp is None:
        return {}
    counts = sp.counts()
    return {"in_flight": counts["in_flight"], "acquired": counts["acquired"], "archived": counts["archived"]}


# --- AlterShareGroupOffsets ------------------------------------------------------------

@handler(ApiKey.ALTER_SHARE_GROUP_OFFSETS, 0, 0)
async def alter_share_group_offsets(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    T = cls.AlterShareGroupOffsetsResponseTopic
    P = T.AlterShareGroupOffsetsResponsePartition
    share = ctx.services.share_coordinator
    group_id = req.group_id or ""
    err, message = _group_error(ctx, share, group_id, "READ", must_exist=False)
    errors: dict[tuple[str, int], KafkaError] = {}
    wanted: dict[tuple[str, int], int] = {}
    for t in req.topics or ():
        for p in t.partitions or ():
            e = err or _partition_error(ctx, t.topic_name, p.partition_index, "READ")
            if not e and p.start_offset < 0:
                e = KafkaError.INVALID_REQUEST
            errors[(t.topic_name, p.partition_index)] = e
            if not e:
                wanted[(t.topic_name, p.partition_index)] = p.start_offset
    if not err and share is not None and wanted:
        err = await offsets.alter_start_offsets(share, group_id, wanted)
        message = NON_EMPTY.format(group_id) if err == KafkaError.NON_EMPTY_GROUP else None
        errors.update({tp: err for tp in wanted})
    catalogue = topic_catalogue(ctx.services)
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), e in errors.items():
        by_topic.setdefault(topic, []).append(P(partition_index=p, error_code=e,
                                                error_message=(message or e.name) if e else None))
    return ctx.response(throttle_time_ms=0, error_code=err, error_message=(message or err.name) if err else None,
                        responses=[T(topic_name=t, topic_id=_topic_id(catalogue, t),
                                     partitions=ps) for t, ps in by_topic.items()])


# --- DeleteShareGroupOffsets -----------------------------------------------------------

@handler(ApiKey.DELETE_SHARE_GROUP_OFFSETS, 0, 0)
async def delete_share_group_offsets(ctx: RequestContext, req: Any) -> Any:
    T = ctx.cls().DeleteShareGroupOffsetsResponseTopic
    share = ctx.services.share_coordinator
    group_id = req.group_id or ""
    err, message = _group_error(ctx, share, group_id, "DELETE")
    catalogue = topic_catalogue(ctx.services)
    errors: dict[str, KafkaError] = {}
    for t in req.topics or ():
        name = t.topic_name
        e = KafkaError.TOPIC_AUTHORIZATION_FAILED if not ctx.authorize("READ", "TOPIC", name) else (
            KafkaError.NONE if name in catalogue else KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
        errors[name] = e
    if not err and share is not None:
        err = await offsets.delete_topics(share, group_id, [n for n, e in errors.items() if not e])
        if err == KafkaError.NON_EMPTY_GROUP:
            message = NON_EMPTY.format(group_id)
    return ctx.response(
        throttle_time_ms=0, error_code=err, error_message=(message or err.name) if err else None,
        responses=[] if err else [T(topic_name=n, topic_id=_topic_id(catalogue, n),
                                    error_code=e, error_message=e.name if e else None)
                                  for n, e in errors.items()])
