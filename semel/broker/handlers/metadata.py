"""Metadata (3) and FindCoordinator (10), read from the cluster view: a single node is
a cluster of one (semel.broker.node_view), leading every partition; in a cluster each
partition's leader and each key's coordinator come from etcd."""
from __future__ import annotations

import uuid
from typing import Any, Sequence

from ...cluster.keys import TopicInfo
from ...cluster.state import BrokerInfo
from ...protocol.api_keys import ApiKey
from ...protocol.errors import KafkaError
from ..auth.acl import ResourceType
from ..auth_check import authorized_operations
from ..node_view import MetadataView
from ..router import RequestContext, handler
from .common import auto_create_topic, may_auto_create, named_controller, unknown_topic

ZERO_UUID = uuid.UUID(int=0)


@handler(ApiKey.METADATA, 0, 12)
async def metadata(ctx: RequestContext, req: Any) -> Any:
    return _with_authorized_operations(ctx, req, await _metadata(ctx, req))


def _with_authorized_operations(ctx: RequestContext, req: Any, result: Any) -> Any:
    """KIP-430 (v8+): what the requester may do on each topic described and (v8-v10)
    on the cluster; the request's flags are False at versions without them. Topics
    the gate denies are added after this, without operations, as Kafka answers them."""
    result.authorized_operations = authorized_operations(
        ctx, req.include_cluster_authorized_operations, ResourceType.CLUSTER)
    for t in result.topics:
        t.authorized_operations = authorized_operations(
            ctx, req.include_topic_authorized_operations and t.name is not None, ResourceType.TOPIC, t.name)
    return result


def _creation_asked(ctx: RequestContext, req: Any) -> bool:
    """May this request create the topics it names (v4+ says; before, it always may)?
    Whether the broker does is may_auto_create's part."""
    return ctx.api_version < 4 or req.allow_auto_topic_creation


async def _metadata(ctx: RequestContext, req: Any) -> Any:
    """Metadata from the cluster view (a single node's NodeView, a cluster of one): every
    live broker, each partition's leader, epoch, replicas and ISR (LEADER_NOT_AVAILABLE
    while a partition has none). With auto-creation on, an unknown legal name is created
    first (through etcd in a cluster)."""
    view = ctx.services.metadata
    cls = ctx.cls()
    T = cls.MetadataResponseTopic
    P = T.MetadataResponsePartition
    known = view.topics()
    if req.topics is None or (ctx.api_version == 0 and not req.topics):
        names: Sequence[str | uuid.UUID | None] = sorted(known)
    else:
        names = [_requested_name(t, known) for t in req.topics]
    created = await _auto_create(ctx, view, req, [n for n in names if isinstance(n, str) and n not in known])
    known = view.topics()
    live = view.brokers()
    topics = []
    for name in names:
        if isinstance(name, uuid.UUID):   # an id no topic has
            topics.append(_absent(T, KafkaError.UNKNOWN_TOPIC_ID, None, name))
            continue
        # No name at all is looked up as the empty one: no topic has it, and it is invalid.
        info = known.get(name or "")
        if name is None or info is None:
            topics.append(_absent(T, created.get(name or "") or unknown_topic(name or ""), name, ZERO_UUID))
            continue
        parts = [P(error_code=KafkaError.NONE if st.has_leader else KafkaError.LEADER_NOT_AVAILABLE,
                   partition_index=st.partition, leader_id=st.leader, leader_epoch=st.leader_epoch,
                   replica_nodes=list(st.replicas), isr_nodes=list(st.isr),
                   offline_replicas=[r for r in st.replicas if r not in live])
                 for st in view.topic_partitions(name)]
        # The topic id tells clients with cached metadata that a same-named topic is a new one.
        topics.append(T(error_code=0, name=name, topic_id=uuid.UUID(info.topic_id) if info.topic_id else ZERO_UUID,
                        is_internal=name.startswith("__"), partitions=parts))
    brokers = [cls.MetadataResponseBroker(node_id=b.node_id, host=host, port=port, rack=b.rack)
               for b in sorted(live.values(), key=lambda b: b.node_id) for host, port in [_address(ctx, b)]]
    cfg = ctx.services.config
    return ctx.response(throttle_time_ms=0, brokers=brokers, cluster_id=cfg.cluster_id,
                        controller_id=named_controller(view, cfg.node_id), topics=topics)


async def _auto_create(ctx: RequestContext, view: MetadataView, req: Any, missing: list[str]) -> dict[str, KafkaError]:
    """{name: error to answer while it is not in this broker's view}: the creation's
    error, or LEADER_NOT_AVAILABLE (retriable, Kafka's answer for a topic being created)
    when another broker created it and the watch has not brought it here yet."""
    config = ctx.services.config
    if not _creation_asked(ctx, req):
        return {}
    out: dict[str, KafkaError] = {}
    for name in missing:
        if may_auto_create(config, name):
            err = await auto_create_topic(config, view, name)
            out[name] = err or KafkaError.LEADER_NOT_AVAILABLE
    return out


def _absent(T: Any, code: KafkaError, name: str | None, topic_id: uuid.UUID) -> Any:
    """A topic the request names that is not here (by name, or by an id no topic has)."""
    return T(error_code=code, name=name, topic_id=topic_id, is_internal=False, partitions=[])


def _address(ctx: RequestContext, info: BrokerInfo) -> tuple[str, int]:
    """Where a client on this request's listener reaches broker `info` (a BrokerInfo): that
    broker's listener of the same name, as Kafka answers per listener, else its main one
    (a broker that registered no such listener)."""
    listener = ctx.listener
    return (info.address(listener.name) if listener is not None else None) or (info.host, info.port)


def _requested_name(t: Any, known: dict[str, TopicInfo]) -> str | uuid.UUID | None:
    """The topic's name, found by topic id (v10+) when only that is given; an unknown id
    comes back as the UUID itself."""
    topic_id: uuid.UUID | None = getattr(t, "topic_id", None)
    name: str | None = t.name
    if name is None and topic_id not in (None, ZERO_UUID):
        return next((n for n, i in known.items() if i.topic_id and uuid.UUID(i.topic_id) == topic_id), topic_id)
    return name


@handler(ApiKey.FIND_COORDINATOR, 0, 4)
async def find_coordinator(ctx: RequestContext, req: Any) -> Any:
    # key_type 0 = group, 1 = transaction. v4+ (KIP-699) asks for several keys at once.
    key_type = req.key_type if ctx.api_version >= 1 else 0
    if ctx.api_version >= 1 and key_type not in (0, 1):
        if ctx.api_version >= 4:
            C = ctx.cls().Coordinator
            return ctx.response(throttle_time_ms=0, coordinators=[
                C(key=k, node_id=-1, host="", port=-1, error_code=KafkaError.INVALID_REQUEST,
                  error_message="unknown key type") for k in req.coordinator_keys or ()])
        return ctx.response(error_code=KafkaError.INVALID_REQUEST, error_message="unknown key type",
                            node_id=-1, host="", port=-1)
    if ctx.api_version >= 4:
        C = ctx.cls().Coordinator
        found = [(k, await _coordinator(ctx, key_type, k)) for k in req.coordinator_keys or ()]
        return ctx.response(throttle_time_ms=0, coordinators=[
            C(key=k, node_id=node, host=host, port=port, error_code=err, error_message=None)
            for k, (err, node, host, port) in found])
    err, node, host, port = await _coordinator(ctx, key_type, req.key)
    return ctx.response(error_code=err, error_message=None, node_id=node, host=host, port=port)


async def _coordinator(ctx: RequestContext, key_type: int, key: str | None) -> tuple[KafkaError, int, str, int]:
    """(error, node id, host, port) of the coordinator of `key`: in a cluster the leader of
    the key's internal partition (docs/cluster.md); this broker on a cluster of one."""
    node = await ctx.services.coordinators_at.coordinator_for(key_type, key)
    info = ctx.services.metadata.brokers().get(node) if node is not None else None
    if info is None:
        return KafkaError.COORDINATOR_NOT_AVAILABLE, -1, "", -1
    host, port = _address(ctx, info)
    return KafkaError.NONE, info.node_id, host, port
