"""Consumer group membership APIs (classic protocol): JoinGroup (11), Heartbeat (12),
LeaveGroup (13), SyncGroup (14), DescribeGroups (15), ListGroups (16: the groups of both
protocols, v5 with their type), DeleteGroups (42).

Each handler translates wire fields to a `GroupCoordinator` call and its result
back to the response of the request's version. JoinGroup and SyncGroup change
group state immediately (in the connection's request order) and return a
`Deferred` whose answer arrives when the rebalance step completes, so the
connection keeps serving the member's other requests (heartbeats, commits).
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Any, Callable

from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..auth.acl import ResourceType
from ..auth_check import authorized_operations
from ..deferred import Deferred
from ..router import RequestContext, handler
from ..services import Services


def topic_catalogue(services: Services) -> dict[str, tuple[uuid.UUID, int]]:
    """name -> (topic id, partition count) of every user topic that exists now (internal
    topics are never subscribed to, as in Kafka; a cluster keeps deleted names as markers)."""
    out = {}
    for name, info in services.metadata.topics().items():
        if name.startswith("__") or info.deleted:
            continue
        topic_id = uuid.UUID(info.topic_id) if info.topic_id else uuid.UUID(int=0)
        out[name] = (topic_id, info.partitions)
    return out


def requester_host(ctx: RequestContext) -> str:
    # Kafka reports the client address as "/<ip>"; clients display it as such.
    return "/" + ctx.peer.rsplit(":", 1)[0] if ctx.peer and ctx.peer != "?" else ""


def answer_when_done(fut: asyncio.Future[Any], build: Callable[[Any], Any]) -> Any:
    """A response now when the future is already done, else a Deferred one."""
    if fut.done():
        return build(fut.result())

    async def later() -> Any:
        return build(await fut)
    return Deferred(later())


@handler(ApiKey.JOIN_GROUP, 0, 7)
async def join_group(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    fut = ctx.services.group_coordinator.join_group(
        req.group_id, req.member_id or "",
        protocol_type=req.protocol_type,
        protocols=[(p.name, p.metadata) for p in req.protocols],
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=req.rebalance_timeout_ms if v >= 1 else -1,
        group_instance_id=req.group_instance_id if v >= 5 else None,
        client_id=ctx.client_id or "",
        client_host=requester_host(ctx),
        require_known_member_id=v >= 4,
        topics=lambda: {name: count for name, (_, count) in topic_catalogue(ctx.services).items()},
    )

    def build(res: Any) -> Any:
        member_cls = ctx.cls().JoinGroupResponseMember
        ok = res.error == KafkaError.NONE
        return ctx.response(
            error_code=res.error,
            generation_id=res.generation,
            protocol_type=res.protocol_type if ok else None,
            protocol_name=(res.protocol_name or "") if ok or v < 7 else None,
            leader=res.leader,
            member_id=res.member_id,
            members=[member_cls(member_id=mid, group_instance_id=inst, metadata=meta)
                     for mid, inst, meta in res.members],
        )
    return answer_when_done(fut, build)


@handler(ApiKey.SYNC_GROUP, 0, 5)
async def sync_group(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    fut = ctx.services.group_coordinator.sync_group(
        req.group_id, req.generation_id, req.member_id,
        group_instance_id=req.group_instance_id if v >= 3 else None,
        protocol_type=req.protocol_type if v >= 5 else None,
        protocol_name=req.protocol_name if v >= 5 else None,
        assignments={a.member_id: a.assignment for a in req.assignments or ()},
    )

    def build(res: Any) -> Any:
        return ctx.response(error_code=res.error, assignment=res.assignment,
                            protocol_type=res.protocol_type, protocol_name=res.protocol_name)
    return answer_when_done(fut, build)


@handler(ApiKey.HEARTBEAT, 0, 4)
async def heartbeat(ctx: RequestContext, req: Any) -> Any:
    err = ctx.services.group_coordinator.heartbeat(
        req.group_id, req.generation_id, req.member_id,
        req.group_instance_id if ctx.api_version >= 3 else None)
    return ctx.response(error_code=err)


@handler(ApiKey.LEAVE_GROUP, 0, 4)
async def leave_group(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    if v >= 3:
        leaving = [(m.member_id or "", m.group_instance_id) for m in req.members or ()]
    else:
        leaving = [(req.member_id or "", None)]
    err, per_member = ctx.services.group_coordinator.leave_group(req.group_id, leaving)
    if v < 3:
        # One member per request: its error is the answer.
        if not err and per_member:
            err = per_member[0]
        return ctx.response(error_code=err)
    member_cls = ctx.cls().MemberResponse
    members = [member_cls(member_id=mid, group_instance_id=inst, error_code=e)
               for (mid, inst), e in zip(leaving, per_member)]
    return ctx.response(error_code=err, members=members)


@handler(ApiKey.DESCRIBE_GROUPS, 0, 5)
async def describe_groups(ctx: RequestContext, req: Any) -> Any:
    group_cls = ctx.cls().DescribedGroup
    member_cls = group_cls.DescribedGroupMember
    groups = []
    for s in ctx.services.group_coordinator.describe_groups(req.groups or ()):
        groups.append(group_cls(
            error_code=s.error, group_id=s.group_id, group_state=s.state,
            protocol_type=s.protocol_type, protocol_data=s.protocol,
            members=[member_cls(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                client_id=m.client_id, client_host=m.client_host,
                                member_metadata=m.metadata, member_assignment=m.assignment)
                     for m in s.members],
            authorized_operations=authorized_operations(
                ctx, req.include_authorized_operations, ResourceType.GROUP, s.group_id),
        ))
    return ctx.response(groups=groups)


@handler(ApiKey.LIST_GROUPS, 0, 5)
async def list_groups(ctx: RequestContext, req: Any) -> Any:
    v = ctx.api_version
    states = req.states_filter if v >= 4 else None
    types = {t.lower() for t in req.types_filter or ()} if v >= 5 else set()
    err, rows = ctx.services.group_coordinator.list_groups(states)
    listed = ctx.cls().ListedGroup
    groups = []
    for gid, ptype, state in rows:
        kind = ctx.services.group_coordinator.group_type(gid)
        if not types or kind in types:
            groups.append(listed(group_id=gid, protocol_type=ptype, group_state=state, group_type=kind))
    share = ctx.services.share_coordinator
    if share is not None and (not types or "share" in types):
        groups += [listed(group_id=gid, protocol_type="share", group_state=state, group_type="share")
                   for gid, state in share.list_rows() if not states or state in states]
    return ctx.response(error_code=err, groups=groups)


@handler(ApiKey.DELETE_GROUPS, 0, 2)
async def delete_groups(ctx: RequestContext, req: Any) -> Any:
    names = list(req.groups_names or ())
    share = ctx.services.share_coordinator
    shared = [g for g in names if share is not None and share.is_share_group(g)]
    fut = ctx.services.group_coordinator.delete_groups([g for g in names if g not in shared])
    result_cls = ctx.cls().DeletableGroupResult

    def build(results: Any) -> Any:
        return ctx.response(results=[result_cls(group_id=gid, error_code=e) for gid, e in results.items()])
    if share is None or not shared:
        return answer_when_done(fut, build)

    async def with_share_groups() -> Any:   # share groups are the share coordinator's
        results = dict(await fut)
        for gid in shared:
            results[gid] = await share.delete_group(gid)
        return build(results)
    return Deferred(with_share_groups())
