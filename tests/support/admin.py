"""Admin-client helpers for tests that check which Kafka error an operation ends in."""
from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException


def error_code(fut, timeout_s: float = 30) -> int:
    """The Kafka error code a confluent-kafka admin future ends in (NO_ERROR on success)."""
    try:
        fut.result(timeout_s)
    except KafkaException as exc:
        return exc.args[0].code()
    return KafkaError.NO_ERROR


def commit_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit {partition: offset} for `group` outside group management (confluent-kafka)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def committed_offsets(bootstrap: str, group: str, topic: str, parts: int) -> dict[int, int]:
    """{partition: committed offset} of `group` as OffsetFetch answers it to confluent-kafka
    (OFFSET_INVALID, -1001, where the broker answers -1: nothing committed)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(parts)], 30)}
    finally:
        c.close()


# Names Kafka never accepts: a space and punctuation, a reserved name, one character too long.
ILLEGAL_TOPIC_NAMES = ("bad name!", "..", "x" * 250)


def delivery_errors(bootstrap: str, topic: str) -> list:
    """The delivery errors (confluent-kafka KafkaError, None when delivered) of one record
    produced to `topic`, with a message timeout far beyond flush's: an error that comes
    back before flush returns came as a final answer, not after retrying to the timeout."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 300000})
    got = []
    p.produce(topic, value=b"x", on_delivery=lambda err, msg: got.append((err, msg.topic())))
    assert p.flush(60) == 0, f"no delivery report for {topic!r} within 60 s: the client is still retrying"
    assert all(t == topic for _, t in got)
    return [err for err, _ in got]


def produce_error(bootstrap: str, topic: str):
    """The Produce answer's error for one record sent straight to `topic` (semel's own
    client, no Metadata first): what a client that skips Metadata is told."""
    from semel.client.client import Client
    from semel.protocol import records
    with Client(bootstrap, timeout_s=10) as c:
        err, _ = c.produce(topic, 0, records.build_batch([(None, b"x")]))
    return err


def alter_broker_config(bootstrap: str, entity: str, name: str, value: str | None) -> tuple[int, str | None]:
    """IncrementalAlterConfigs SET (None: DELETE) of `name` on a broker entity, sent to
    `bootstrap` whatever the entity: "" is the default (what kafka-configs.sh
    --entity-default sends; confluent-kafka and kafka-python refuse an empty broker
    name), and the admin clients send a node id only to that node. Over semel's wire
    client; the answer's (error code, message)."""
    from semel.client.client import Client
    from semel.protocol.api_keys import ApiKey
    from semel.protocol.messages import request_class
    cls = request_class(ApiKey.INCREMENTAL_ALTER_CONFIGS)
    with Client(bootstrap, timeout_s=10) as c:
        r = c.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, resources=[cls.AlterConfigsResource(
            resource_type=4, resource_name=entity, configs=[cls.AlterConfigsResource.AlterableConfig(
                name=name, config_operation=0 if value is not None else 1, value=value)])], validate_only=False)
    return r.responses[0].error_code, r.responses[0].error_message
