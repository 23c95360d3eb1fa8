"""The consumer group protocol of KIP-848: ConsumerGroupHeartbeat (68, v0-1) and
ConsumerGroupDescribe (69, v0-1).

Topics travel by id on the wire and by name in the coordinator: the handler maps
them with the broker's topic catalogue (a single node's logs, a cluster's view), and
gives the coordinator the partition count of every topic a member may subscribe to.
"""
from __future__ import annotations

from typing import Any

import uuid

from ...coordinator.consumer_group_rules import Heartbeat
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..auth.acl import ResourceType
from ..auth_check import authorized_operations
from ..router import RequestContext, handler
from .groups import requester_host, topic_catalogue

# ConsumerGroupDescribe v1 MemberType: 0 = a classic member (online migration), 1 = a
# member of the consumer protocol.
MEMBER_TYPE_CLASSIC, MEMBER_TYPE_CONSUMER = 0, 1


@handler(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1)
async def consumer_group_heartbeat(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    catalogue = topic_catalogue(ctx.services)
    share = ctx.services.share_coordinator
    if share is not None and share.is_share_group(req.group_id):   # Kafka: not a consumer group
        return _answer(ctx, KafkaError.GROUP_ID_NOT_FOUND, req.member_id, -1, None, catalogue,
                       f"group {req.group_id} is a share group")
    names_by_id = {tid: name for name, (tid, _) in catalogue.items()}
    owned = None
    if req.topic_partitions is not None:
        owned = frozenset((names_by_id[t.topic_id], p) for t in req.topic_partitions
                          if t.topic_id in names_by_id for p in t.partitions or ())
    hb = Heartbeat(
        member_id=req.member_id or "", member_epoch=req.member_epoch,
        instance_id=req.instance_id, rack_id=req.rack_id,
        rebalance_timeout_ms=req.rebalance_timeout_ms,
        topics=tuple(req.subscribed_topic_names) if req.subscribed_topic_names is not None else None,
        regex=req.subscribed_topic_regex if v >= 1 else None,
        assignor=req.server_assignor, owned=owned,
        client_id=ctx.client_id or "", client_host=requester_host(ctx),
        coordinator_names_member=v == 0)
    answer = await ctx.services.group_coordinator.consumer_group_heartbeat(
        req.group_id, hb, {name: count for name, (_, count) in catalogue.items()})
    return _answer(ctx, answer.error, answer.member_id, answer.member_epoch, answer.assignment,
                   catalogue, answer.message)


def _answer(ctx: RequestContext, err: Any, member_id: Any, epoch: Any, assignment: Any, catalogue: Any, message: Any = None) -> Any:
    cls = ctx.cls()
    body = None
    if not err and assignment is not None:
        tp_cls = cls.Assignment.TopicPartitions
        by_topic: dict[str, list[int]] = {}
        for topic, p in assignment:
            by_topic.setdefault(topic, []).append(p)
        body = cls.Assignment(topic_partitions=[
            tp_cls(topic_id=catalogue[t][0], partitions=sorted(ps))
            for t, ps in sorted(by_topic.items()) if t in catalogue])
    interval = ctx.services.group_coordinator.config.consumer_heartbeat_interval_ms
    return ctx.response(throttle_time_ms=0, error_code=err, error_message=message if err else None,
                        member_id=member_id or None, member_epoch=epoch if not err else -1,
                        heartbeat_interval_ms=interval if not err else 0, assignment=body)


@handler(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 1)
async def consumer_group_describe(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    G = cls.DescribedGroup
    M = G.Member
    A = M.Assignment
    catalogue = topic_catalogue(ctx.services)

    def assignment(parts: Any) -> Any:
        by_topic: dict[str, list[int]] = {}
        for topic, p in parts:
            by_topic.setdefault(topic, []).append(p)
        return A(topic_partitions=[
            A.TopicPartitions(topic_id=catalogue.get(t, (uuid.UUID(int=0), 0))[0], topic_name=t,
                              partitions=sorted(ps))
            for t, ps in sorted(by_topic.items())])

    groups = []
    for view in ctx.services.group_coordinator.consumer_group_describe(req.group_ids or ()):
        if not ctx.authorize("DESCRIBE", "GROUP", view.group_id):
            groups.append(G(error_code=KafkaError.GROUP_AUTHORIZATION_FAILED, group_id=view.group_id,
                            group_state="", group_epoch=-1, assignment_epoch=-1, assignor_name="",
                            members=[]))
            continue
        g = view.group
        if view.error or g is None:
            groups.append(G(error_code=view.error, error_message=view.message, group_id=view.group_id,
                            group_state="Dead", group_epoch=-1, assignment_epoch=-1, assignor_name="",
                            members=[]))
            continue
        members = []
        for mid, meta in g.members.items():
            cur = g.current.get(mid)
            members.append(M(
                member_id=mid, instance_id=meta.instance_id, rack_id=meta.rack_id,
                member_epoch=cur.epoch if cur else 0, client_id=meta.client_id,
                client_host=meta.client_host, subscribed_topic_names=list(meta.topics),
                subscribed_topic_regex=meta.regex,
                assignment=assignment(cur.assigned if cur else ()),
                target_assignment=assignment(g.target.get(mid, ())),
                member_type=MEMBER_TYPE_CLASSIC if meta.classic is not None else MEMBER_TYPE_CONSUMER))
        groups.append(G(
            error_code=KafkaError.NONE, group_id=g.group_id, group_state=g.state_name(),
            group_epoch=g.epoch, assignment_epoch=g.target_epoch, assignor_name=g.assignor,
            members=members,
            authorized_operations=authorized_operations(
                ctx, req.include_authorized_operations, ResourceType.GROUP, g.group_id)))
    return ctx.response(throttle_time_ms=0, groups=groups)
