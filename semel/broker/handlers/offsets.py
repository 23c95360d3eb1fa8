"""OffsetCommit (8, v2-9) and OffsetFetch (9, v1-9).

OffsetCommit appends the offsets to __consumer_offsets while the request is
handled (so commits of one connection keep their order) and answers once they
are on disk. Partitions of unknown topics are refused per partition, as Kafka
does; the per-request retention time of v2-4 is ignored (Kafka 2.1+ too:
offsets of active groups never expire, those of empty groups after
offsets_retention_ms).
"""
from __future__ import annotations

from typing import Any

from ...coordinator.group_model import FetchedOffset
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..responses import by_topic
from ..router import RequestContext, handler
from .groups import answer_when_done


def _partition_known(ctx: RequestContext, topic: str, partition: int) -> bool:
    try:
        return ctx.services.logs.get(topic, partition) is not None
    except Exception:  # a name storage cannot even look up is not a known partition
        return False


@handler(ApiKey.OFFSET_COMMIT, 2, 9)
async def offset_commit(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    offsets: dict[tuple[str, int], tuple[int, int, str | None]] = {}
    refused: dict[tuple[str, int], KafkaError] = {}
    order: list[tuple[str, int]] = []
    for topic in req.topics or ():
        for p in topic.partitions or ():
            tp = (topic.name, p.partition_index)
            order.append(tp)
            if not _partition_known(ctx, topic.name, p.partition_index):
                refused[tp] = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                continue
            epoch = p.committed_leader_epoch if v >= 6 else -1
            offsets[tp] = (p.committed_offset, epoch, p.committed_metadata)
    if offsets:
        fut = ctx.services.group_coordinator.commit_offsets(
            req.group_id, req.generation_id_or_member_epoch, req.member_id or "", offsets,
            group_instance_id=req.group_instance_id if v >= 7 else None, api_version=v)
    else:
        fut = None

    def build(results: dict[tuple[str, int], KafkaError]) -> Any:
        merged = {**refused, **(results or {})}
        topic_cls = ctx.cls().OffsetCommitResponseTopic
        part_cls = topic_cls.OffsetCommitResponsePartition
        grouped = by_topic(((tp, merged.get(tp, KafkaError.NONE)) for tp in order),
                           lambda p, err: part_cls(partition_index=p, error_code=err))
        return ctx.response(topics=[topic_cls(name=n, partitions=ps) for n, ps in grouped.items()])

    if fut is None:
        return build({})
    return answer_when_done(fut, build)


@handler(ApiKey.OFFSET_FETCH, 1, 9)
async def offset_fetch(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    if v >= 8:
        return _offset_fetch_groups(ctx, req)
    wanted = None
    if req.topics is not None:
        wanted = [(t.name, p) for t in req.topics for p in t.partition_indexes or ()]
    require_stable = bool(req.require_stable) if v >= 7 else False
    err, fetched = ctx.services.group_coordinator.fetch_offsets(req.group_id, wanted, require_stable)
    topic_cls = ctx.cls().OffsetFetchResponseTopic
    part_cls = topic_cls.OffsetFetchResponsePartition
    if err and v < 2:
        # v1 has no top-level error: every requested partition carries it.
        fetched = [FetchedOffset(t, p, -1, -1, "", err) for t, p in wanted or ()]
    return ctx.response(topics=_fetched_topics(topic_cls, part_cls, fetched), error_code=err)


def _fetched_topics(topic_cls: Any, part_cls: Any, fetched: list[FetchedOffset]) -> list[Any]:
    topics: dict[str, list[Any]] = {}
    for f in fetched:
        topics.setdefault(f.topic, []).append(part_cls(
            partition_index=f.partition, committed_offset=f.offset,
            committed_leader_epoch=f.leader_epoch, metadata=f.metadata, error_code=f.error))
    return [topic_cls(name=n, partitions=ps) for n, ps in topics.items()]


def _offset_fetch_groups(ctx: RequestContext, req: Any) -> Any:
    """v8+: several groups in one request, each with its own error; v9 names the member
    (id and epoch) of a consumer-protocol group, checked as Kafka checks it. Each group is
    answered by its own coordinator, or NOT_COORDINATOR when it is not here."""
    v = ctx.api_version
    groups = ctx.services.group_coordinator
    group_cls = ctx.cls().OffsetFetchResponseGroup
    topic_cls = group_cls.OffsetFetchResponseTopics
    part_cls = topic_cls.OffsetFetchResponsePartitions
    out = []
    for g in req.groups or ():
        wanted = None
        if g.topics is not None:
            wanted = [(t.name, p) for t in g.topics for p in t.partition_indexes or ()]
        err = groups.error_for(g.group_id)   # is this broker the group's coordinator?
        fetched: list[FetchedOffset] = []
        if not err:
            err, fetched = groups.fetch_offsets(
                g.group_id, wanted, bool(req.require_stable),
                member_id=g.member_id if v >= 9 else None, member_epoch=g.member_epoch if v >= 9 else -1)
        out.append(group_cls(group_id=g.group_id, error_code=err,
                             topics=_fetched_topics(topic_cls, part_cls, fetched)))
    return ctx.response(throttle_time_ms=0, groups=out)
