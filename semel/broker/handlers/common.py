"""Small pieces shared by handler modules."""
from __future__ import annotations

import logging
from collections.abc import Mapping

from ...cluster.controller import assign_replicas
from ...cluster.replica_rules import below_min_isr_way_out, min_insync_of
from ...protocol.errors import KafkaError
from ...storage.log import PartitionLog
from ...storage.manager import validate_topic_name
from ..config import BrokerConfig
from ..node_view import MetadataView
from ..router import RequestContext

log = logging.getLogger("semel.broker.topics")


def warn_below_min_isr(config: BrokerConfig, topic: str, replication_factor: int,
                       topic_config: Mapping[str, str]) -> None:
    """A topic whose replication factor is below its min.insync.replicas is taken, as
    Kafka takes it, but every acks=all write to it is refused with NOT_ENOUGH_REPLICAS,
    which clients retry silently until their delivery timeout: one WARN when it is
    created or its config changes makes it visible where an operator looks."""
    min_isr = min_insync_of(topic_config, config.min_insync_replicas)
    if replication_factor < min_isr:
        log.warning("topic %s has replication factor %d, below its min.insync.replicas %d: every acks=all "
                    "write to it will be refused with NOT_ENOUGH_REPLICAS (%s)", topic, replication_factor,
                    min_isr, below_min_isr_way_out(replication_factor, min_isr))


def first_error(errors: dict[tuple[str, int], KafkaError]) -> KafkaError:
    return next((KafkaError(e) for e in errors.values() if e), KafkaError.NONE)


def unknown_topic(name: str) -> KafkaError:
    """The error for a topic that does not exist: an illegal name can never exist, so it
    is final for clients (INVALID_TOPIC_EXCEPTION, a producer fails at once); an unknown
    legal one is retriable (it may be created). Internal names are legal to ask about."""
    if validate_topic_name(name, internal=True)[0]:
        return KafkaError.INVALID_TOPIC_EXCEPTION
    return KafkaError.UNKNOWN_TOPIC_OR_PARTITION


def named_controller(view: MetadataView, node_id: int) -> int:
    """The controller id Metadata and DescribeCluster answer: the elected one while this
    broker knows it; otherwise (fenced from etcd, or the seat vacant during an election)
    the lowest other live broker it knows, and itself only when it knows no other. Any
    broker serves the admin requests clients send to the controller (each is one
    compare-and-set in etcd), and librdkafka's admin client, once told -1, waits out its
    whole request timeout without asking again, even after etcd is back. -1 only with no
    broker known at all."""
    elected = view.controller_id()
    if elected is not None:
        return elected
    known = sorted(view.brokers(), key=lambda b: (b == node_id, b))
    return known[0] if known else -1


def may_auto_create(config: BrokerConfig, name: object) -> bool:
    """Kafka's auto.create.topics.enable: a legal, non-internal name, when configured."""
    return (config.auto_create_topics and isinstance(name, str)
            and not name.startswith("__") and not validate_topic_name(name)[0])


async def auto_create_topic(config: BrokerConfig, view: MetadataView, name: str) -> KafkaError:
    """Create `name` with the default partitions and replication factor through the
    view, as CreateTopics does: in etcd for a cluster member (semel.cluster.metadata),
    so every broker opens its logs, or in a single node's own logs (NodeView). NONE
    also when another broker created it first (both raced on etcd)."""
    try:
        assignment = assign_replicas(sorted(view.brokers()), config.default_partitions,
                                     config.default_replication_factor)
    except ValueError:   # fewer live brokers than the default replication factor
        return KafkaError.INVALID_REPLICATION_FACTOR
    try:
        err = await view.create_topic(name, assignment, {})
    except ConnectionError:   # etcd unreachable
        return KafkaError.REQUEST_TIMED_OUT
    if err == KafkaError.NONE:
        warn_below_min_isr(config, name, config.default_replication_factor, {})
    return KafkaError.NONE if err == KafkaError.TOPIC_ALREADY_EXISTS else err


def lookup(ctx: RequestContext, topic: str, partition: int) -> tuple[PartitionLog | None, KafkaError]:
    """(log, error): the partition's log in this broker's LogManager, or why there is
    none (`unknown_topic`'s error for a topic without logs here, UNKNOWN_TOPIC_OR_PARTITION
    for a partition the topic lacks). It creates nothing: a caller that auto-creates
    does so before (`auto_create_topic`)."""
    logs = ctx.services.logs
    plog = logs.get(topic, partition)
    if plog is not None:
        return plog, KafkaError.NONE
    if topic not in logs.topics():
        return None, unknown_topic(topic)
    return None, KafkaError.UNKNOWN_TOPIC_OR_PARTITION
