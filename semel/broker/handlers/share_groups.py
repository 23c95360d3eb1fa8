"""Share groups (KIP-932) at the versions Kafka 4.2 serves: ShareGroupHeartbeat (76,
v1), ShareFetch (78, v1-2) and ShareAcknowledge (79, v1-2; v2 renews acquisition locks,
see share_renew).

The share coordinator (semel.coordinator.share_coordinator) keeps the members, the
share sessions and every share-partition; this module maps topic ids to names, reads
what may be delivered from the partition logs (share_reads), and waits for records
when a fetch finds none. Acknowledgements ride on ShareFetch as on ShareAcknowledge.
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Any, Callable

from ...coordinator.share_coordinator import ShareCoordinator
from ...coordinator.share_partition import Acquired
from ...coordinator.share_state import ShareGroup
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ...storage.log import PartitionLog
from ..auth.acl import ResourceType
from ..auth_check import authorized_operations
from ..router import RequestContext, handler
from .groups import requester_host, topic_catalogue
from .share_reads import fetchable, read_range
from .share_renew import lock_timeout, renew_at, renew_fetch_error

# A long-polling fetch looks again at least this often: a lock that ran out makes
# records available without an append to wake it.
POLL_SLICE_S = 0.25


def _share(ctx: RequestContext) -> ShareCoordinator | None:
    return ctx.services.share_coordinator


def consumer_group_conflict(ctx: RequestContext, group_id: str) -> KafkaError:
    """A group id in use by a consumer group (classic or KIP-848) is not a share group:
    GROUP_ID_NOT_FOUND, as Kafka answers."""
    groups = ctx.services.group_coordinator
    _, rows = groups.list_groups()
    if groups.group_type(group_id) == "consumer" or any(gid == group_id for gid, _, _ in rows):
        return KafkaError.GROUP_ID_NOT_FOUND
    return KafkaError.NONE


@handler(ApiKey.SHARE_GROUP_HEARTBEAT, 1, 1)
async def share_group_heartbeat(ctx: RequestContext, req: Any) -> Any:
    share = _share(ctx)
    catalogue = topic_catalogue(ctx.services)
    if share is None:
        err = KafkaError.UNSUPPORTED_VERSION
    elif not ctx.authorize("READ", "GROUP", req.group_id):
        err = KafkaError.GROUP_AUTHORIZATION_FAILED
    else:
        err = ctx.services.group_coordinator.error_for(req.group_id) or consumer_group_conflict(ctx, req.group_id)
    if share is None or err:
        return ctx.response(throttle_time_ms=0, error_code=err, member_id=req.member_id or None,
                            member_epoch=-1, heartbeat_interval_ms=0, assignment=None)
    topics = tuple(req.subscribed_topic_names) if req.subscribed_topic_names is not None else None
    if req.member_epoch == 0:
        await share.refresh_configs(req.group_id)
    answer = share.heartbeat(req.group_id, req.member_id or "", req.member_epoch, topics, req.rack_id,
                             {name: count for name, (_, count) in catalogue.items()},
                             (ctx.client_id or "", requester_host(ctx)))
    cls = ctx.cls()
    body = None
    if not answer.error and answer.assignment is not None:
        by_topic: dict[str, list[int]] = {}
        for t, p in answer.assignment:
            by_topic.setdefault(t, []).append(p)
        body = cls.Assignment(topic_partitions=[
            cls.Assignment.TopicPartitions(topic_id=catalogue[t][0], partitions=ps)
            for t, ps in sorted(by_topic.items()) if t in catalogue])
    return ctx.response(throttle_time_ms=0, error_code=answer.error,
                        error_message=answer.message if answer.error else None,
                        member_id=answer.member_id or None, member_epoch=answer.epoch,
                        heartbeat_interval_ms=answer.interval_ms, assignment=body)


def _acknowledge(share: ShareCoordinator, group_id: str, member_id: str, names: dict[uuid.UUID, str],
                 topics: Any, refused: dict[tuple[str, int], KafkaError],
                 renewing: int | None = None) -> dict[tuple[str, int], KafkaError]:
    """Apply every acknowledgement batch; the error per partition (NONE when all held;
    a partition in `refused` gets its error there). `renewing`: the time renewals count
    from, where the request may renew."""
    out: dict[tuple[str, int], KafkaError] = {}
    limits = share.state.limits(group_id)
    for t in topics or ():
        name = names.get(t.topic_id)
        for p in t.partitions or ():
            if not p.acknowledgement_batches:
                continue
            key = (name or "", p.partition_index)
            if key in refused:
                out[key] = refused[key]
                continue
            sp = share.state.partition(group_id, name, p.partition_index) if name else None
            if sp is None:
                out[key] = KafkaError.UNKNOWN_TOPIC_OR_PARTITION if name is None else KafkaError.INVALID_RECORD_STATE
                continue
            err = KafkaError.NONE
            for b in p.acknowledgement_batches:
                e = sp.acknowledge(member_id, b.first_offset, b.last_offset, list(b.acknowledge_types), limits,
                                   renewing)
                err = err or e
            out[key] = err
    return out


def _session_keys(names: dict[uuid.UUID, str], topics: Any, field: str) -> set[tuple[str, int]]:
    out = set()
    for t in topics or ():
        name = names.get(t.topic_id)
        if name is None:
            continue
        for p in getattr(t, field) or ():
            out.add((name, p if isinstance(p, int) else p.partition_index))
    return out


def _ack_keys(names: dict[uuid.UUID, str], topics: Any) -> set[tuple[str, int]]:
    return {(names[t.topic_id], p.partition_index) for t in topics or () if t.topic_id in names
            for p in t.partitions or () if p.acknowledgement_batches}


async def _prepare(ctx: RequestContext, share: ShareCoordinator, group_id: str,
                   keys: set[tuple[str, int]]) -> dict[tuple[str, int], KafkaError]:
    """The partitions of `keys` this request may not use here, with why: not led here
    (in a cluster, share-partitions live at their partition's leader), or their state
    could not be read."""
    refused: dict[tuple[str, int], KafkaError] = {}
    led: dict[tuple[str, int], int] = {}
    for topic, p in keys:
        err = ctx.services.replicas.leader_error(topic, p)
        plog = ctx.services.logs.get(topic, p)
        if err or plog is None:
            if err != KafkaError.UNKNOWN_TOPIC_OR_PARTITION:   # as before: left out quietly
                refused[(topic, p)] = err or KafkaError.NOT_LEADER_OR_FOLLOWER
            continue
        led[(topic, p)] = plog.leader_epoch if plog.leader_epoch is not None else 0
    refused.update(await share.prepare(group_id, led))
    return refused


def _acquire(ctx: RequestContext, share: ShareCoordinator, group_id: str, member_id: str,
             keys: set[tuple[str, int]], max_records: int, created: set[tuple[str, int]]
             ) -> dict[tuple[str, int], list[Acquired]]:
    """Acquire records for the member across its session's partitions; the
    share-partitions read for the first time are added to `created`."""
    state = share.state
    limits = state.limits(group_id)
    committed = state.config(group_id, "share.isolation.level") == "read_committed"
    now = share.clock()
    got: dict[tuple[str, int], list[Acquired]] = {}
    for topic, p in sorted(keys):
        if max_records <= 0:
            break
        plog = ctx.services.logs.get(topic, p)
        if plog is None:
            continue
        if state.partition(group_id, topic, p) is None:
            created.add((topic, p))
        sp = share.share_partition(group_id, topic, p, _reset_start(plog))
        if sp.start < plog.log_start_offset:   # records deleted under the window
            sp.skip_to(plog.log_start_offset)
        end, skip, starts = fetchable(plog, sp.end, committed)
        acquired = sp.acquire(member_id, max(end, sp.end), max_records, now, limits, skip, starts)
        if acquired:
            got[(topic, p)] = acquired
            max_records -= sum(last - first + 1 for first, last, _ in acquired)
    return got


def _reset_start(plog: PartitionLog) -> Callable[[str], int]:
    """Where a share-partition starts, by share.auto.offset.reset."""
    return lambda reset: plog.log_start_offset if reset == "earliest" else plog.high_watermark


def _ranges(acquired: list[Acquired]) -> list[Acquired]:
    """Neighbouring ranges with one delivery count joined (fewer AcquiredRecords)."""
    runs: list[Acquired] = []
    for first, last, count in sorted(acquired):
        if runs and runs[-1][1] == first - 1 and runs[-1][2] == count:
            runs[-1] = (runs[-1][0], last, count)
        else:
            runs.append((first, last, count))
    return runs


@handler(ApiKey.SHARE_FETCH, 1, 2)
async def share_fetch(ctx: RequestContext, req: Any) -> Any:
    share = _share(ctx)
    if share is None:
        return _fetch_error(ctx, KafkaError.UNSUPPORTED_VERSION)
    group_id, member_id = req.group_id or "", req.member_id or ""
    err = share.error()
    if not err and not ctx.authorize("READ", "GROUP", group_id):
        err = KafkaError.GROUP_AUTHORIZATION_FAILED
    if not err and share.members_here and req.share_session_epoch != -1 \
            and not share.state.is_member(group_id, member_id):
        err = KafkaError.UNKNOWN_MEMBER_ID
    renewing = renew_at(ctx, req, share)
    if not err and renewing is not None:
        err = renew_fetch_error(req)
    if err:
        return _fetch_error(ctx, err)
    catalogue = topic_catalogue(ctx.services)
    names = {tid: name for name, (tid, _) in catalogue.items()}
    err, session = share.state.open_session(group_id, member_id, req.share_session_epoch,
                                            _session_keys(names, req.topics, "partitions"),
                                            _session_keys(names, req.forgotten_topics_data, "partitions"))
    if err or session is None:
        return _fetch_error(ctx, err)
    if req.share_session_epoch == 0:
        await share.refresh_configs(group_id)
    refused = await _prepare(ctx, share, group_id, set(session.partitions) | _ack_keys(names, req.topics))
    acks = _acknowledge(share, group_id, member_id, names, req.topics, refused, renewing)
    # Acquisitions are not written (their locks die with the broker anyway: what was
    # acquired is available again after a restart); acknowledgements, released sessions
    # and where a new share-partition starts are, before the answer.
    changed = set(acks)
    got: dict[tuple[str, int], list[Acquired]] = {}
    if req.share_session_epoch == -1:
        changed |= {(t, p) for _, t, p in share.state.release_session(group_id, member_id)}
    elif renewing is None:   # a renewing fetch acquires nothing
        deadline = asyncio.get_running_loop().time() + max(req.max_wait_ms, 0) / 1000
        max_records = req.max_records if req.max_records > 0 else 500
        while True:
            got = _acquire(ctx, share, group_id, member_id, set(session.partitions) - set(refused), max_records,
                           changed)
            left = deadline - asyncio.get_running_loop().time()
            if got or acks or left <= 0 or not share.state.is_member(group_id, member_id):
                break
            await ctx.services.notifier.wait_any(sorted(session.partitions), min(left, POLL_SLICE_S))
        share.locks.arm(group_id, got)   # a lock that runs out is released with no fetch
    persisted = await share.persist(share.partition_records(group_id, changed))
    if persisted:   # an acknowledgement not durable is not answered as done
        return _fetch_error(ctx, persisted)
    return _fetch_answer(ctx, share.state.limits(group_id).lock_ms, catalogue, acks, got,
                         {tp: e for tp, e in refused.items() if tp in session.partitions})


def _leader(ctx: RequestContext, cls: Any, topic: str, p: int) -> Any:
    plog = ctx.services.logs.get(topic, p)
    epoch = plog.leader_epoch if plog is not None and plog.leader_epoch is not None else 0
    return cls(leader_id=ctx.services.config.node_id, leader_epoch=epoch)


def _fetch_answer(ctx: RequestContext, lock_ms: int, catalogue: dict[str, tuple[uuid.UUID, int]],
                  acks: dict[tuple[str, int], KafkaError], got: dict[tuple[str, int], list[Acquired]],
                  refused: dict[tuple[str, int], KafkaError]) -> Any:
    cls = ctx.cls()
    T = cls.ShareFetchableTopicResponse
    P = T.PartitionData
    by_topic: dict[str, list[Any]] = {}
    for topic, p in sorted(set(acks) | set(got) | set(refused)):
        if topic not in catalogue:
            continue
        acquired = got.get((topic, p), [])
        records = b""
        plog = ctx.services.logs.get(topic, p)
        if acquired and plog is not None:
            records = read_range(plog, min(f for f, _, _ in acquired), max(last for _, last, _ in acquired))
        by_topic.setdefault(topic, []).append(P(
            partition_index=p, error_code=refused.get((topic, p), KafkaError.NONE),
            acknowledge_error_code=acks.get((topic, p), KafkaError.NONE),
            current_leader=_leader(ctx, P.LeaderIdAndEpoch, topic, p), records=records,
            acquired_records=[P.AcquiredRecords(first_offset=f, last_offset=last, delivery_count=c)
                              for f, last, c in _ranges(acquired)]))
    return ctx.response(
        throttle_time_ms=0, error_code=0, acquisition_lock_timeout_ms=lock_ms,
        responses=[T(topic_id=catalogue[t][0], partitions=ps) for t, ps in sorted(by_topic.items())],
        node_endpoints=[])


def _fetch_error(ctx: RequestContext, err: KafkaError) -> Any:
    return ctx.response(throttle_time_ms=0, error_code=err, error_message=err.name,
                        acquisition_lock_timeout_ms=0, responses=[], node_endpoints=[])


@handler(ApiKey.SHARE_ACKNOWLEDGE, 1, 2)
async def share_acknowledge(ctx: RequestContext, req: Any) -> Any:
    share = _share(ctx)
    cls = ctx.cls()
    if share is None:
        return ctx.response(throttle_time_ms=0, error_code=KafkaError.UNSUPPORTED_VERSION, responses=[],
                            node_endpoints=[])
    group_id, member_id = req.group_id or "", req.member_id or ""
    err = share.error()
    if not err and not ctx.authorize("READ", "GROUP", group_id):
        err = KafkaError.GROUP_AUTHORIZATION_FAILED
    catalogue = topic_catalogue(ctx.services)
    names = {tid: name for name, (tid, _) in catalogue.items()}
    if not err:
        err, _ = share.state.open_session(group_id, member_id, req.share_session_epoch, set(), set())
    if err:
        return ctx.response(throttle_time_ms=0, error_code=err, error_message=err.name, responses=[],
                            node_endpoints=[])
    refused = await _prepare(ctx, share, group_id, _ack_keys(names, req.topics))
    acks = _acknowledge(share, group_id, member_id, names, req.topics, refused, renew_at(ctx, req, share))
    changed = {tp for tp, e in acks.items() if tp not in refused}
    if req.share_session_epoch == -1:
        changed |= {(t, p) for _, t, p in share.state.release_session(group_id, member_id)}
    persisted = await share.persist(share.partition_records(group_id, changed))
    T = cls.ShareAcknowledgeTopicResponse
    P = T.PartitionData
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), e in sorted(acks.items()):
        if topic in catalogue:
            by_topic.setdefault(topic, []).append(P(
                partition_index=p, error_code=persisted or e,
                current_leader=_leader(ctx, P.LeaderIdAndEpoch, topic, p)))
    return ctx.response(throttle_time_ms=0, error_code=0,
                        responses=[T(topic_id=catalogue[t][0], partitions=ps) for t, ps in sorted(by_topic.items())],
                        node_endpoints=[], **lock_timeout(ctx, share.state.limits(group_id).lock_ms))


@handler(ApiKey.SHARE_GROUP_DESCRIBE, 1, 1)
async def share_group_describe(ctx: RequestContext, req: Any) -> Any:
    cls = ctx.cls()
    G = cls.DescribedGroup
    A = G.Member.Assignment
    share = _share(ctx)
    catalogue = topic_catalogue(ctx.services)
    groups = []
    for gid in req.group_ids or ():
        err = share.error() if share is not None else KafkaError.UNSUPPORTED_VERSION
        if not err and not ctx.authorize("DESCRIBE", "GROUP", gid):
            err = KafkaError.GROUP_AUTHORIZATION_FAILED
        group = share.state.groups.get(gid) if share is not None and not err else None
        if group is None and share is not None and share.is_share_group(gid):
            group = ShareGroup(gid)   # known by its configs or share-partitions alone
        if err or group is None or share is None:
            groups.append(G(error_code=err or KafkaError.GROUP_ID_NOT_FOUND, group_id=gid, group_state="Dead",
                            group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[]))
            continue
        counts = {name: n for name, (_, n) in catalogue.items()}
        members = []
        for m in group.members.values():
            by_topic: dict[str, list[int]] = {}
            for t, p in share.state.assignment(m, counts):
                by_topic.setdefault(t, []).append(p)
            members.append(G.Member(
                member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.epoch, client_id=m.client_id,
                client_host=m.client_host, subscribed_topic_names=list(m.topics),
                assignment=A(topic_partitions=[A.TopicPartitions(topic_id=catalogue[t][0], topic_name=t, partitions=ps)
                                               for t, ps in sorted(by_topic.items())])))
        groups.append(G(
            error_code=0, group_id=gid, group_state="Stable" if members else "Empty", group_epoch=group.epoch,
            assignment_epoch=group.epoch, assignor_name="simple", members=members,
            authorized_operations=authorized_operations(ctx, req.include_authorized_operations,
                                                        ResourceType.GROUP, gid)))
    return ctx.response(throttle_time_ms=0, groups=groups)
