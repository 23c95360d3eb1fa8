"""Metadata (3) and FindCoordinator (10): a single broker leads every partition
and coordinates every group and transactional id."""
from __future__ import annotations

import uuid

from ...protocol.errors import KafkaError
from ...storage.manager import validate_topic_name
from ..router import handler

ZERO_UUID = uuid.UUID(int=0)


@handler(3, 0, 12)
async def metadata(ctx, req):
    broker = ctx.broker
    cfg = broker.config
    cls = ctx.cls()
    logs = broker.logs
    if req.topics is None or (ctx.api_version == 0 and not req.topics):
        names = sorted(logs.topics())
    else:
        names = [_requested_name(t, logs) for t in req.topics]
    allow_create = cfg.auto_create_topics and (ctx.api_version < 4 or req.allow_auto_topic_creation)
    topics = []
    for name in names:
        if isinstance(name, uuid.UUID):  # asked by a topic id this broker does not know
            topics.append(cls.MetadataResponseTopic(error_code=KafkaError.UNKNOWN_TOPIC_ID, name=None,
                                                    topic_id=name, is_internal=False, partitions=[]))
            continue
        if name not in logs.topics() and allow_create and name and not name.startswith("__"):
            logs.create_topic(name, cfg.default_partitions, {})
        topics.append(_topic_metadata(cls, logs, name, cfg.node_id))
    brokers = [cls.MetadataResponseBroker(node_id=cfg.node_id, host=cfg.advertised, port=ctx.listener_port, rack=None)]
    return ctx.response(throttle_time_ms=0, brokers=brokers, cluster_id=cfg.cluster_id,
                        controller_id=cfg.node_id, topics=topics)


def _requested_name(t, logs):
    """The topic's name, found by topic id (v10+) when only that is given; an
    unknown id comes back as the UUID itself."""
    topic_id = getattr(t, "topic_id", None)
    if t.name is None and topic_id not in (None, ZERO_UUID):
        for info in logs.topics().values():
            if info.topic_id and uuid.UUID(info.topic_id) == topic_id:
                return info.name
        return topic_id
    return t.name


def _topic_metadata(cls, logs, name, node_id):
    T = cls.MetadataResponseTopic
    info = logs.topics().get(name)
    if info is None:
        # An illegal name is final for clients (INVALID_TOPIC_EXCEPTION); an unknown
        # legal one is retriable. Internal names are legal to ask about.
        code = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        if validate_topic_name(name, internal=True)[0]:
            code = KafkaError.INVALID_TOPIC_EXCEPTION
        return T(error_code=code, name=name, is_internal=False, partitions=[])
    P = T.MetadataResponsePartition
    parts = [P(error_code=0, partition_index=i, leader_id=node_id, leader_epoch=0,
               replica_nodes=[node_id], isr_nodes=[node_id], offline_replicas=[])
             for i in range(info.partitions)]
    # The topic id tells clients with cached metadata that a same-named topic is a new one.
    topic_id = uuid.UUID(info.topic_id) if info.topic_id else ZERO_UUID
    return T(error_code=0, name=name, topic_id=topic_id, is_internal=info.internal, partitions=parts)


@handler(10, 0, 3)
async def find_coordinator(ctx, req):
    cfg = ctx.broker.config
    # key_type 0 = group, 1 = transaction; this broker coordinates both.
    if ctx.api_version >= 1 and req.key_type not in (0, 1):
        return ctx.response(error_code=KafkaError.INVALID_REQUEST, error_message="unknown key type",
                            node_id=-1, host="", port=-1)
    return ctx.response(error_code=0, error_message=None, node_id=cfg.node_id,
                        host=cfg.advertised, port=ctx.listener_port)
