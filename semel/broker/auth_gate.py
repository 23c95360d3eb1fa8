"""Kafka's authorization rules for every API the broker serves, in one table.

`guarded(ctx, body, fn)` runs before a handler (connection._dispatch): a request
whose whole-request resource (cluster, group, transactional id) is denied is
answered with the matching *_AUTHORIZATION_FAILED code without running the
handler; a request naming topics runs the handler on the allowed topics only and
answers the denied ones with TOPIC_AUTHORIZATION_FAILED, so a denial writes
nothing. Handlers added later call `ctx.authorize(...)` themselves (the ops APIs)."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from ..coordinator.txn_branches import branch_of
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from .deferred import Deferred
from .refusal import (CREATE_PARTITIONS, CREATE_TOPICS, FETCH, LEADER_EPOCH, LIST_OFFSETS, OFFSET_COMMIT, PRODUCE,
                      TopicShape, add_partitions_answer, entry_class, offset_fetch_groups_answer, refuse,
                      topic_entry)
from .router import Handler, RequestContext
from .auth.acl import CLUSTER_NAME, Operation as Op, ResourceType as Rt
from .auth.sasl import session_expired
from .auth_check import authorize_any

# Requests a SASL listener answers before authentication; anything else closes it.
PRE_AUTH_APIS = {ApiKey.SASL_HANDSHAKE, ApiKey.API_VERSIONS, ApiKey.SASL_AUTHENTICATE}
# Once a login's session expired (KIP-368), only a re-login's requests are answered.
REAUTH_APIS = {ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE}
E = KafkaError
# rule(ctx, body, handler): the answer, the handler's or a denial
Rule = Callable[[RequestContext, Any, Handler], Awaitable[Any]]
# whole(ctx, body): the code denying every topic of the request, or None
Whole = Callable[[RequestContext, Any], KafkaError | None]


def authenticated_enough(ctx: RequestContext) -> bool:
    listener = ctx.listener
    if listener is None or not listener.sasl or ctx.api_key in REAUTH_APIS:
        return True
    if session_expired(ctx.connection):
        return False
    return ctx.api_key in PRE_AUTH_APIS or ctx.connection.principal is not None


def _enabled(ctx: RequestContext) -> bool:
    return ctx.services.authorizer.enabled


async def guarded(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    rule = RULES.get(ctx.api_key)
    if rule is None or not _enabled(ctx):
        return await fn(ctx, body)
    return await rule(ctx, body, fn)


# --- whole-request checks ---------------------------------------------------------

def _txn_id(body: Any) -> str | None:
    return getattr(body, "transactional_id", None)


def _single(op: Op, rtype: Rt, name_of: Callable[[Any], str], code: KafkaError) -> Rule:
    async def rule(ctx: RequestContext, body: Any, fn: Handler) -> Any:
        if not ctx.authorize(op, rtype, name_of(body)):
            return refuse(ctx, body, code)
        return await fn(ctx, body)
    return rule


def _group(op: Op) -> Rule:
    return _single(op, Rt.GROUP, lambda b: b.group_id, E.GROUP_AUTHORIZATION_FAILED)


def _acl_change(req_list: str, resp_list: str) -> Rule:
    """CreateAcls / DeleteAcls: Alter on the cluster, else each entry denied."""
    async def rule(ctx: RequestContext, body: Any, fn: Handler) -> Any:
        if ctx.authorize(Op.ALTER, Rt.CLUSTER, CLUSTER_NAME):
            return await fn(ctx, body)
        R = entry_class(ctx.cls(), resp_list)
        return ctx.response(**{resp_list: [R(error_code=E.CLUSTER_AUTHORIZATION_FAILED, error_message="denied")
                                           for _ in getattr(body, req_list) or ()]})
    return rule


async def _alter_scram(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    """AlterUserScramCredentials: Alter on the cluster, else every user named is denied."""
    if ctx.authorize(Op.ALTER, Rt.CLUSTER, CLUSTER_NAME):
        return await fn(ctx, body)
    R = entry_class(ctx.cls(), "results")
    names = dict.fromkeys(e.name for e in [*(body.deletions or []), *(body.upsertions or [])])
    return ctx.response(throttle_time_ms=0, results=[
        R(user=n, error_code=E.CLUSTER_AUTHORIZATION_FAILED, error_message="Cluster authorization failed.")
        for n in names])


def _cluster(op: Op) -> Rule:
    """DescribeAcls, DescribeCluster: top-level error and message."""
    async def rule(ctx: RequestContext, body: Any, fn: Handler) -> Any:
        if not ctx.authorize(op, Rt.CLUSTER, CLUSTER_NAME):
            return refuse(ctx, body, E.CLUSTER_AUTHORIZATION_FAILED, error_message="Cluster authorization failed.")
        return await fn(ctx, body)
    return rule


async def _init_producer_id(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    tid = _txn_id(body)
    if tid is not None:
        if not ctx.authorize(Op.WRITE, Rt.TRANSACTIONAL_ID, tid):
            return refuse(ctx, body, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    elif not (authorize_any(ctx, Op.WRITE, Rt.TRANSACTIONAL_ID)
              or ctx.authorize(Op.IDEMPOTENT_WRITE, Rt.CLUSTER, CLUSTER_NAME)):
        return refuse(ctx, body, E.CLUSTER_AUTHORIZATION_FAILED)
    return await fn(ctx, body)


async def _add_offsets_to_txn(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    if not ctx.authorize(Op.WRITE, Rt.TRANSACTIONAL_ID, body.transactional_id):
        return refuse(ctx, body, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if not ctx.authorize(Op.READ, Rt.GROUP, body.group_id):
        return refuse(ctx, body, E.GROUP_AUTHORIZATION_FAILED)
    return await fn(ctx, body)


async def _find_coordinator(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    kind = (Rt.TRANSACTIONAL_ID, E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED) if body.key_type == 1 \
        else (Rt.GROUP, E.GROUP_AUTHORIZATION_FAILED)
    keys = getattr(body, "coordinator_keys", None)
    if ctx.api_version < 4 or keys is None:
        if not ctx.authorize(Op.DESCRIBE, kind[0], body.key):
            return refuse(ctx, body, kind[1])
        return await fn(ctx, body)
    denied = [k for k in keys if not ctx.authorize(Op.DESCRIBE, kind[0], k)]
    if not denied:
        return await fn(ctx, body)
    body.coordinator_keys = [k for k in keys if k not in denied]
    result = await fn(ctx, body) if body.coordinator_keys else ctx.response(coordinators=[])
    C = ctx.cls().Coordinator
    result.coordinators = list(result.coordinators) + [
        C(key=k, node_id=-1, host="", port=-1, error_code=kind[1], error_message=None) for k in denied]
    return result


# --- per-topic checks ---------------------------------------------------------------

async def _run_topics(ctx: RequestContext, body: Any, fn: Handler, shape: TopicShape, denied: list[Any],
                      code: KafkaError) -> Any:
    """The handler on the allowed topics, the denied ones answered with `code`."""
    topics = getattr(body, shape.req_list) or []
    if not denied:
        return await fn(ctx, body)
    gone = {id(t) for t in denied}
    allowed = [t for t in topics if id(t) not in gone]
    entries = [topic_entry(ctx, shape, t, code) for t in denied]
    if not allowed:
        return ctx.response(**{shape.resp_list: entries})
    setattr(body, shape.req_list, allowed)
    result = await fn(ctx, body)
    return _merge(result, shape.resp_list, entries)


def _merge(result: Any, field: str, entries: list[Any]) -> Any:
    if result is None:   # acks=0: nothing is answered
        return None
    if isinstance(result, Deferred):
        inner = result.awaitable

        async def merged() -> Any:
            return _merge(await inner, field, entries)
        return Deferred(merged())
    setattr(result, field, list(getattr(result, field) or []) + entries)
    return result


def _topics(op: Op, shape: TopicShape, whole: Whole | None = None) -> Rule:
    """Per-topic `op`; `whole(ctx, body)` may deny every topic with one code first."""
    async def rule(ctx: RequestContext, body: Any, fn: Handler) -> Any:
        topics = getattr(body, shape.req_list) or []
        code = whole(ctx, body) if whole else None
        if code:
            return await _run_topics(ctx, body, fn, shape, list(topics), code)
        denied = [t for t in topics if not ctx.authorize(op, Rt.TOPIC, getattr(t, shape.req_name))]
        return await _run_topics(ctx, body, fn, shape, denied, E.TOPIC_AUTHORIZATION_FAILED)
    return rule


def _produce_txn(ctx: RequestContext, body: Any) -> KafkaError | None:
    tid = _txn_id(body)
    if tid is not None and not ctx.authorize(Op.WRITE, Rt.TRANSACTIONAL_ID, tid):
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return None


def _group_read(ctx: RequestContext, body: Any) -> KafkaError | None:
    return None if ctx.authorize(Op.READ, Rt.GROUP, body.group_id) else E.GROUP_AUTHORIZATION_FAILED


async def _offset_delete(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    """OffsetDelete: Delete on the group (else a top-level error), Read on each topic."""
    if not ctx.authorize(Op.DELETE, Rt.GROUP, body.group_id):
        return refuse(ctx, body, E.GROUP_AUTHORIZATION_FAILED)
    return await _topics(Op.READ, OFFSET_COMMIT)(ctx, body, fn)


def _txn_offset_commit(ctx: RequestContext, body: Any) -> KafkaError | None:
    if not ctx.authorize(Op.WRITE, Rt.TRANSACTIONAL_ID, body.transactional_id):
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return _group_read(ctx, body)


def _may_add(ctx: RequestContext, t: Any) -> bool:
    """Write on the topic; for a branch's pseudo-partition (a Spark sink batch joining
    its branches, coordinator.txn_branches.branch_of) Write on the branch's transactional id,
    the resource that pseudo-partition stands for."""
    branch = branch_of((t.name, 0)) if list(t.partitions) == [0] else None
    if branch is not None:
        return ctx.authorize(Op.WRITE, Rt.TRANSACTIONAL_ID, branch)
    return ctx.authorize(Op.WRITE, Rt.TOPIC, t.name)


async def _add_partitions_to_txn(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    """Kafka answers AddPartitionsToTxn all or nothing: denied topics get their
    code, the others OPERATION_NOT_ATTEMPTED."""
    if ctx.api_version >= 4:
        return await fn(ctx, body)   # broker-to-broker batch form: needs ClusterAction (not served here)
    topics = body.v3_and_below_topics or []
    if not ctx.authorize(Op.WRITE, Rt.TRANSACTIONAL_ID, body.v3_and_below_transactional_id):
        codes = {id(t): E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED for t in topics}
    else:
        bad = {id(t) for t in topics if not _may_add(ctx, t)}
        if not bad:
            return await fn(ctx, body)
        codes = {id(t): E.TOPIC_AUTHORIZATION_FAILED if id(t) in bad else E.OPERATION_NOT_ATTEMPTED
                 for t in topics}
    return add_partitions_answer(ctx, body, lambda t: codes[id(t)])


async def _metadata(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    """Topics without Describe: omitted from a listing, TOPIC_AUTHORIZATION_FAILED
    when named (and never auto-created)."""
    named = body.topics
    denied = set()
    if named:
        denied = {t.name for t in named if not ctx.authorize(Op.DESCRIBE, Rt.TOPIC, t.name)}
        body.topics = [t for t in named if t.name not in denied]
    allowed = {t.name for t in body.topics} if named else None
    result = await fn(ctx, body)
    keep = []
    for t in result.topics:
        # (a v0 request whose named topics were all denied reads as "all topics": filter by name)
        if allowed is not None and t.name not in allowed:
            continue
        if allowed is None and not ctx.authorize(Op.DESCRIBE, Rt.TOPIC, t.name):
            continue
        keep.append(t)
    T = entry_class(ctx.cls(), "topics")
    keep += [T(name=n, error_code=E.TOPIC_AUTHORIZATION_FAILED, partitions=[]) for n in sorted(denied)]
    result.topics = keep
    return result


async def _create_topics(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    cluster_ok = ctx.authorize(Op.CREATE, Rt.CLUSTER, CLUSTER_NAME)
    denied = [] if cluster_ok else [t for t in body.topics or []
                                    if not ctx.authorize(Op.CREATE, Rt.TOPIC, t.name)]
    return await _run_topics(ctx, body, fn, CREATE_TOPICS, denied, E.TOPIC_AUTHORIZATION_FAILED)


async def _describe_groups(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    groups = body.groups or []
    denied = [g for g in groups if not ctx.authorize(Op.DESCRIBE, Rt.GROUP, g)]
    if not denied:
        return await fn(ctx, body)
    body.groups = [g for g in groups if g not in denied]
    result = await fn(ctx, body) if body.groups else ctx.response(groups=[])
    G = entry_class(ctx.cls(), "groups")
    result.groups = list(result.groups) + [
        G(group_id=g, error_code=E.GROUP_AUTHORIZATION_FAILED, group_state="", protocol_type="",
          protocol_data="", members=[]) for g in denied]
    return result


async def _delete_groups(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    """Delete on each group; denied ones are answered GROUP_AUTHORIZATION_FAILED and
    never reach the coordinator (their offsets stay)."""
    names = list(body.groups_names or [])
    denied = [g for g in names if not ctx.authorize(Op.DELETE, Rt.GROUP, g)]
    if not denied:
        return await fn(ctx, body)
    R = entry_class(ctx.cls(), "results")
    entries = [R(group_id=g, error_code=E.GROUP_AUTHORIZATION_FAILED) for g in denied]
    body.groups_names = [g for g in names if g not in denied]
    if not body.groups_names:
        return ctx.response(results=entries)
    return _merge(await fn(ctx, body), "results", entries)


async def _list_groups(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    result = await fn(ctx, body)
    if not ctx.authorize(Op.DESCRIBE, Rt.CLUSTER, CLUSTER_NAME):
        result.groups = [g for g in result.groups if ctx.authorize(Op.DESCRIBE, Rt.GROUP, g.group_id)]
    return result


async def _offset_fetch(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    if ctx.api_version >= 8:
        for g in body.groups or []:
            if not ctx.authorize(Op.DESCRIBE, Rt.GROUP, g.group_id):
                return _deny_offset_fetch_groups(ctx, body)
        return await fn(ctx, body)
    if not ctx.authorize(Op.DESCRIBE, Rt.GROUP, body.group_id):
        return refuse(ctx, body, E.GROUP_AUTHORIZATION_FAILED)
    return await fn(ctx, body)


def _deny_offset_fetch_groups(ctx: RequestContext, body: Any) -> Any:
    return offset_fetch_groups_answer(ctx, body, lambda group_id: E.GROUP_AUTHORIZATION_FAILED
                                      if not ctx.authorize(Op.DESCRIBE, Rt.GROUP, group_id)
                                      else E.OPERATION_NOT_ATTEMPTED)


def _configs(op: Op, resp_list: str, **extra: Any) -> Rule:
    """DescribeConfigs / AlterConfigs / IncrementalAlterConfigs: `op` on the topic
    (ConfigResource type 2) or on the cluster (a broker, type 4), per resource."""
    def allowed(ctx: RequestContext, r: Any) -> bool:
        if r.resource_type == 2:
            return ctx.authorize(op, Rt.TOPIC, r.resource_name)
        return ctx.authorize(op, Rt.CLUSTER, CLUSTER_NAME)

    async def rule(ctx: RequestContext, body: Any, fn: Handler) -> Any:
        resources = body.resources or []
        denied = [r for r in resources if not allowed(ctx, r)]
        if not denied:
            return await fn(ctx, body)
        gone = {id(r) for r in denied}
        body.resources = [r for r in resources if id(r) not in gone]
        result = await fn(ctx, body) if body.resources else ctx.response(**{resp_list: []})
        R = entry_class(ctx.cls(), resp_list)
        setattr(result, resp_list, list(getattr(result, resp_list)) + [
            R(error_code=E.TOPIC_AUTHORIZATION_FAILED if r.resource_type == 2 else E.CLUSTER_AUTHORIZATION_FAILED,
              error_message="denied", resource_type=r.resource_type, resource_name=r.resource_name, **extra)
            for r in denied])
        return result
    return rule


def _cluster_action(ctx: RequestContext) -> bool:
    return ctx.authorize(Op.CLUSTER_ACTION, Rt.CLUSTER, CLUSTER_NAME)


_CONSUMER_FETCH = _topics(Op.READ, FETCH)


async def _fetch(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    """A follower's Fetch (replica_id >= 0) needs ClusterAction on the cluster, as in Kafka:
    it reads past the high watermark and its fetch offsets move the leader's ISR and high
    watermark, so a client faking one could see uncommitted records or have acks=all
    answered before the data is replicated. Denied, nothing is read or recorded: the
    answer is CLUSTER_AUTHORIZATION_FAILED at the top (v7+) and, per partition, Kafka's
    TOPIC_AUTHORIZATION_FAILED."""
    if body.replica_id < 0:
        return await _CONSUMER_FETCH(ctx, body, fn)
    if _cluster_action(ctx):
        return await fn(ctx, body)
    return ctx.response(throttle_time_ms=0, error_code=E.CLUSTER_AUTHORIZATION_FAILED, session_id=0,
                        responses=[topic_entry(ctx, FETCH, t, E.TOPIC_AUTHORIZATION_FAILED)
                                   for t in body.topics or ()])


_DESCRIBE_EPOCHS = _topics(Op.DESCRIBE, LEADER_EPOCH)


async def _offset_for_leader_epoch(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    """Kafka: ClusterAction on the cluster (a follower) or Describe on each topic (a consumer
    checking for truncation, KIP-320). Only a request naming a replica is checked for the
    former, so a consumer's is not counted as a cluster denial."""
    if getattr(body, "replica_id", -1) >= 0 and _cluster_action(ctx):
        return await fn(ctx, body)
    return await _DESCRIBE_EPOCHS(ctx, body, fn)


async def _delete_topics(ctx: RequestContext, body: Any, fn: Handler) -> Any:
    names = body.topic_names if ctx.api_version < 6 else [t.name for t in body.topics or []]
    denied = {n for n in names or [] if not ctx.authorize(Op.DELETE, Rt.TOPIC, n)}
    if not denied:
        return await fn(ctx, body)
    if ctx.api_version < 6:
        body.topic_names = [n for n in names if n not in denied]
        left = body.topic_names
    else:
        body.topics = [t for t in body.topics if t.name not in denied]
        left = body.topics
    result = await fn(ctx, body) if left else ctx.response(responses=[])
    R = entry_class(ctx.cls(), "responses")
    result.responses = list(result.responses) + [R(name=n, error_code=E.TOPIC_AUTHORIZATION_FAILED)
                                                 for n in sorted(denied)]
    return result


# api key -> its rule
RULES: dict[int, Rule] = {
    ApiKey.PRODUCE: _topics(Op.WRITE, PRODUCE, whole=_produce_txn),
    ApiKey.FETCH: _fetch,
    ApiKey.LIST_OFFSETS: _topics(Op.DESCRIBE, LIST_OFFSETS),
    ApiKey.METADATA: _metadata,
    ApiKey.OFFSET_COMMIT: _topics(Op.READ, OFFSET_COMMIT, whole=_group_read),
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.JOIN_GROUP: _group(Op.READ),
    ApiKey.HEARTBEAT: _group(Op.READ),
    ApiKey.LEAVE_GROUP: _group(Op.READ),
    ApiKey.SYNC_GROUP: _group(Op.READ),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: _group(Op.READ),
    ApiKey.DESCRIBE_GROUPS: _describe_groups,
    ApiKey.LIST_GROUPS: _list_groups,
    ApiKey.CREATE_TOPICS: _create_topics,
    ApiKey.DELETE_TOPICS: _delete_topics,
    ApiKey.DELETE_RECORDS: _topics(Op.DELETE, LIST_OFFSETS),
    ApiKey.INIT_PRODUCER_ID: _init_producer_id,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: _offset_for_leader_epoch,
    ApiKey.ADD_PARTITIONS_TO_TXN: _add_partitions_to_txn,
    ApiKey.ADD_OFFSETS_TO_TXN: _add_offsets_to_txn,
    ApiKey.END_TXN: _single(Op.WRITE, Rt.TRANSACTIONAL_ID, lambda b: b.transactional_id,
                E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED),
    ApiKey.TXN_OFFSET_COMMIT: _topics(Op.READ, OFFSET_COMMIT, whole=_txn_offset_commit),
    ApiKey.DESCRIBE_ACLS: _cluster(Op.DESCRIBE),
    ApiKey.CREATE_ACLS: _acl_change("creations", "results"),
    ApiKey.DELETE_ACLS: _acl_change("filters", "filter_results"),
    ApiKey.DESCRIBE_CONFIGS: _configs(Op.DESCRIBE_CONFIGS, "results", configs=[]),
    ApiKey.ALTER_CONFIGS: _configs(Op.ALTER_CONFIGS, "responses"),
    ApiKey.CREATE_PARTITIONS: _topics(Op.ALTER, CREATE_PARTITIONS),
    ApiKey.DELETE_GROUPS: _delete_groups,
    ApiKey.OFFSET_DELETE: _offset_delete,
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _configs(Op.ALTER_CONFIGS, "responses"),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _cluster(Op.ALTER),
    ApiKey.LIST_PARTITION_REASSIGNMENTS: _cluster(Op.DESCRIBE),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: _cluster(Op.DESCRIBE),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: _alter_scram,
    ApiKey.DESCRIBE_CLUSTER: _cluster(Op.DESCRIBE),
}
