"""AlterConfigs (33), IncrementalAlterConfigs (44), DescribeConfigs (32) through
confluent-kafka's and kafka-python's admin clients: validated like Kafka
(INVALID_CONFIG), durable across a SIGKILL, and acted on (retention)."""
from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, KafkaError as CKError, Producer, TopicPartition
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ConfigSource, NewTopic)

from tests.support import wait
from tests.support.admin import alter_broker_config, error_code
from tests.support.brokers import module_broker


@pytest.fixture(scope="module")
def mbroker(tmp_path_factory):
    # retention runs often so a retention change is seen acting within the test
    with module_broker(tmp_path_factory, "admin-configs", "--retention-check-interval-ms", "200") as b:
        yield b


def _admin(b):
    return AdminClient({"bootstrap.servers": b.bootstrap})


def _topic(admin, config=None):
    name = "cfg-" + uuid.uuid4().hex[:8]
    admin.create_topics([NewTopic(name, 1, 1, config=config or {})])[name].result(30)
    return name


def _incremental(admin, name, *entries):
    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in entries])
    return admin.incremental_alter_configs([res])[res]


def _overrides(admin, name):
    res = ConfigResource(ConfigResource.Type.TOPIC, name)
    got = admin.describe_configs([res])[res].result(30)
    return {k: e.value for k, e in got.items() if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}



def test_incremental_set_delete_append_subtract(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin, {"retention.ms": "100000"})
    _incremental(admin, name, ("retention.bytes", "1048576", AlterConfigOpType.SET),
                 ("retention.ms", None, AlterConfigOpType.DELETE)).result(30)
    assert _overrides(admin, name) == {"retention.bytes": "1048576"}
    _incremental(admin, name, ("cleanup.policy", "compact", AlterConfigOpType.APPEND)).result(30)
    assert _overrides(admin, name)["cleanup.policy"] == "compact,delete"
    _incremental(admin, name, ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)).result(30)
    assert _overrides(admin, name) == {"retention.bytes": "1048576", "cleanup.policy": "compact"}


def test_alter_configs_replaces_all_overrides(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin, {"retention.ms": "100000", "segment.bytes": "100000"})
    res = ConfigResource(ConfigResource.Type.TOPIC, name, set_config={"retention.bytes": "2000000"})
    admin.alter_configs([res])[res].result(30)
    assert _overrides(admin, name) == {"retention.bytes": "2000000"}


def test_bad_configs_are_invalid_config_and_change_nothing(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin, {"retention.ms": "100000"})
    for entry in (("no.such.config", "1", AlterConfigOpType.SET),
                  ("retention.ms", "soon", AlterConfigOpType.SET),
                  ("cleanup.policy", "shred", AlterConfigOpType.SET),
                  ("retention.ms", "5", AlterConfigOpType.APPEND)):
        assert error_code(_incremental(admin, name, entry)) == CKError.INVALID_CONFIG, entry
    res = ConfigResource(ConfigResource.Type.TOPIC, name, set_config={"segment.bytes": "-3"})
    assert error_code(admin.alter_configs([res])[res]) == CKError.INVALID_CONFIG
    missing = "nope-" + uuid.uuid4().hex[:8]
    assert error_code(_incremental(admin, missing, ("retention.ms", "1", AlterConfigOpType.SET))) == \
        CKError.UNKNOWN_TOPIC_OR_PART
    # validate_only checks but does not apply
    res = ConfigResource(ConfigResource.Type.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "7", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([res], validate_only=True)[res].result(30)
    assert _overrides(admin, name) == {"retention.ms": "100000"}


def test_kafka_python_admin(mbroker):
    from kafka.admin import ConfigResource as KPResource, ConfigResourceType, KafkaAdminClient
    name = _topic(_admin(mbroker))
    kp = KafkaAdminClient(bootstrap_servers=mbroker.bootstrap)
    try:
        kp.alter_configs([KPResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "123456"})])
        desc = kp.describe_configs([KPResource(ConfigResourceType.TOPIC, name)])
    finally:
        kp.close()
    (by_name,) = desc.values()
    assert by_name[name]["retention.ms"]["value"] == "123456", desc


def _filled_topic(b) -> str:
    """A topic of 4 KiB segments holding 400 records of 50 bytes (about ten segments)."""
    name = _topic(_admin(b), {"segment.bytes": "4096"})
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    for _ in range(400):
        p.produce(name, value=b"x" * 50, partition=0)
    assert p.flush(30) == 0
    return name


def _trimmed(b, name: str, what: str) -> tuple[int, int]:
    """The watermarks once retention has deleted the topic's first segment."""
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wm"})
    try:
        tp = TopicPartition(name, 0)
        return wait.until(lambda: (lambda w: w if w[0] > 0 else None)(c.get_watermark_offsets(tp, 30)), what)
    finally:
        c.close()


def test_retention_change_takes_effect(mbroker):
    admin = _admin(mbroker)
    name = _filled_topic(mbroker)
    assert _watermarks(mbroker, name) == (0, 400)
    _incremental(admin, name, ("retention.bytes", "8192", AlterConfigOpType.SET)).result(30)
    # whole old segments go; the high watermark stays
    lo, hi = _trimmed(mbroker, name, "retention.bytes trimmed the log")
    assert hi == 400 and 0 < lo < 400


def test_configs_survive_sigkill(mbroker):
    admin = _admin(mbroker)
    name = _topic(admin)
    _incremental(admin, name, ("retention.ms", "987654", AlterConfigOpType.SET),
                 ("cleanup.policy", "compact", AlterConfigOpType.SET)).result(30)
    mbroker.kill()
    mbroker.restart()
    admin = _admin(mbroker)
    assert _overrides(admin, name) == {"retention.ms": "987654", "cleanup.policy": "compact"}


def _compacted_topic(b) -> str:
    admin = _admin(b)
    name = _topic(admin)
    _incremental(admin, name, ("cleanup.policy", "compact", AlterConfigOpType.SET)).result(30)
    return name


def _produce_each(b, name, conf, *records) -> list:
    """Each (key, value) sent and flushed on its own: the delivery error codes, in order."""
    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "retries": 0, **conf})
    errors = []
    for key, value in records:
        p.produce(name, key=key, value=value, partition=0, on_delivery=lambda err, msg: errors.append(err))
        assert p.flush(60) == 0
    return [e and e.code() for e in errors]


def _watermarks(b, name) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "wm"})
    try:
        return c.get_watermark_offsets(TopicPartition(name, 0), 30)
    finally:
        c.close()


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_compacted_topic_refuses_records_without_key(mbroker, compression):
    name = _compacted_topic(mbroker)
    codes = _produce_each(mbroker, name, {"compression.type": compression}, (None, b"no key"), (b"k", b"keyed"))
    assert codes == [CKError.INVALID_RECORD, None]
    assert _watermarks(mbroker, name) == (0, 1)  # only the keyed one


def test_a_keyless_record_is_named_in_its_refused_batch(mbroker):
    """KIP-467: the batch fails as a whole (INVALID_RECORD, nothing written) and the answer
    names the bad record by its index with a message, so kafka-python fails that record
    with the broker's reason and the others as refused with it."""
    from kafka import KafkaProducer
    from kafka.errors import InvalidRecordError, KafkaError as KPError
    name = _compacted_topic(mbroker)
    p = KafkaProducer(bootstrap_servers=mbroker.bootstrap, linger_ms=2000, retries=0)
    try:
        futures = [p.send(name, key=key, value=b"v%d" % i, partition=0)    # one batch: within linger_ms
                   for i, key in enumerate([b"k0", None, b"k2"])]
        p.flush(60)
        errors = [f.exception for f in futures]
    finally:
        p.close()
    assert isinstance(errors[1], InvalidRecordError)
    assert "record 1 of the batch has no key" in str(errors[1]) and "cleanup.policy=compact" in str(errors[1])
    for other in (errors[0], errors[2]):    # failed with it, for no fault of their own
        assert isinstance(other, KPError) and not isinstance(other, InvalidRecordError)
    assert _watermarks(mbroker, name) == (0, 0)


def test_librdkafka_tells_keyless_records_from_the_ones_refused_with_them(mbroker):
    """librdkafka's 0011 test: with per-record errors for several records of a batch, those
    fail with INVALID_RECORD and the rest with _INVALID_DIFFERENT_RECORD (with a single
    record error librdkafka gives every record of the batch the partition's error)."""
    name = _compacted_topic(mbroker)
    p = Producer({"bootstrap.servers": mbroker.bootstrap, "linger.ms": 2000, "retries": 0})
    got = {}
    for i in range(6):      # one batch: all queued within linger.ms; every third without a key
        p.produce(name, key=None if i % 3 == 0 else b"k%d" % i, value=b"v", partition=0,
                  on_delivery=lambda err, msg, i=i: got.__setitem__(i, err.code()))
    assert p.flush(60) == 0
    assert got == {i: CKError.INVALID_RECORD if i % 3 == 0 else CKError._INVALID_DIFFERENT_RECORD for i in range(6)}
    assert _watermarks(mbroker, name) == (0, 0)


def test_compacted_topic_refuses_a_batch_that_expands_past_the_limit(mbroker):
    """The key check decompresses; 40 MiB of zeros (a few KiB gzipped) would expand past
    the broker's 32 MiB --max-decompressed-batch-bytes: MESSAGE_TOO_LARGE, nothing
    stored, and the broker goes on serving."""
    name = _compacted_topic(mbroker)
    codes = _produce_each(mbroker, name, {"compression.type": "gzip", "message.max.bytes": 100_000_000},
                          (b"bomb", bytes(40 << 20)), (b"k", b"small"))
    assert codes == [CKError.MSG_SIZE_TOO_LARGE, None]
    assert _watermarks(mbroker, name) == (0, 1)  # only the small one


def _broker_res(name: str, *entries) -> ConfigResource:
    return ConfigResource(ConfigResource.Type.BROKER, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=op) for k, v, op in entries])


def _broker_config(admin, key: str):
    res = ConfigResource(ConfigResource.Type.BROKER, "0")
    entry = admin.describe_configs([res])[res].result(30)[key]
    return entry.value, entry.source


def test_a_single_node_alters_its_dynamic_broker_configs_and_keeps_them(mbroker):
    """kafka-configs --entity-type brokers on one broker: the cluster default ("") and
    the broker's own id, in force at once (retention default trims a topic without an
    override), described with their sources, and kept across a SIGKILL."""
    admin = _admin(mbroker)
    name = _filled_topic(mbroker)
    try:
        assert alter_broker_config(mbroker.bootstrap, "", "log.retention.bytes", "8192") == (0, None)
        res = _broker_res("0", ("connections.max.idle.ms", "123456", AlterConfigOpType.SET))
        admin.incremental_alter_configs([res])[res].result(30)
        assert _broker_config(admin, "log.retention.bytes") == ("8192", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert _broker_config(admin, "connections.max.idle.ms") == ("123456", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        lo, hi = _trimmed(mbroker, name, "the dynamic retention default trimmed a topic without an override")
        assert hi == 400 and 0 < lo < 400
        mbroker.kill()
        mbroker.restart()
        admin = _admin(mbroker)
        assert _broker_config(admin, "log.retention.bytes") == ("8192", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value)
        assert _broker_config(admin, "connections.max.idle.ms") == ("123456", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    finally:   # the module's broker is shared: back to its start flags
        assert alter_broker_config(mbroker.bootstrap, "", "log.retention.bytes", None) == (0, None)
        res = _broker_res("0", ("connections.max.idle.ms", None, AlterConfigOpType.DELETE))
        admin.incremental_alter_configs([res])[res].result(30)
    assert _broker_config(admin, "log.retention.bytes")[1] == ConfigSource.STATIC_BROKER_CONFIG.value


@pytest.mark.parametrize("entity,key,value,code", [
    ("0", "message.max.bytes", "2000000", CKError.INVALID_CONFIG),        # a start flag
    ("0", "log.retention.ms", "soon", CKError.INVALID_CONFIG),            # not a number
    ("7", "log.retention.ms", "1000", CKError.INVALID_REQUEST),           # no broker 7 here
    ("", "leader.replication.throttled.rate", "1000", CKError.INVALID_CONFIG),   # nothing replicated
])
def test_a_single_node_refuses_broker_configs_it_cannot_apply(mbroker, entity, key, value, code):
    admin = _admin(mbroker)
    assert alter_broker_config(mbroker.bootstrap, entity, key, value)[0] == code
    assert _broker_config(admin, "log.retention.ms")[1] == ConfigSource.STATIC_BROKER_CONFIG.value
