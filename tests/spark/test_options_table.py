"""Every option of Spark's Kafka connector, one case each: accepted with its effect on
what format("semel") does, or refused with the reason; and docs/spark.md's migration
table is the code's table (semel.spark.options.SPARK_KAFKA_OPTIONS), row for row."""
from __future__ import annotations

from pathlib import Path

import pytest

from semel.client.security import Secret, Tls
from semel.spark import options as opt
from semel.spark import security, sink, sink_options, source

BASE = {"kafka.bootstrap.servers": "h:1"}
DOCS = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


def src(batch=False, **kw):
    return opt.parse_source({**BASE, "subscribe": "t", **kw}, batch=batch)


def snk(**kw):
    return sink.parse_options({**BASE, "semel.query.id": "q", "topic": "t", **kw})


def k(name, value, **more):
    return {name: value, **more}


# option -> a check that holds only when the option took effect
EFFECTS = {
    "assign": lambda: opt.parse_source({**BASE, "assign": '{"t":[1]}'}, batch=False).subscription.assigned
    == (("t", 1),),
    "subscribe": lambda: src(subscribe="a,b").subscription.topics == ("a", "b"),
    "subscribePattern": lambda: opt.parse_source({**BASE, "subscribePattern": "t-.*"}, batch=False)
    .subscription.matches("t-1"),
    "kafka.bootstrap.servers": lambda: src().bootstrap == snk().bootstrap == "h:1",
    "startingTimestamp": lambda: src(startingTimestamp="5").starting == opt.ByTimestamp(every=5),
    "startingOffsetsByTimestamp": lambda: src(startingOffsetsByTimestamp='{"t":{"0":7}}').starting
    == opt.ByTimestamp(per={"t": {0: 7}}),
    "startingOffsetsByTimestampStrategy": lambda: src(startingOffsetsByTimestampStrategy="latest")
    .starting_strategy == "latest" and src().starting_strategy == "error",
    "startingOffsets": lambda: src(startingOffsets="earliest").starting == "earliest",
    "endingTimestamp": lambda: src(True, endingTimestamp="9").ending == opt.ByTimestamp(every=9),
    "endingOffsetsByTimestamp": lambda: src(True, endingOffsetsByTimestamp='{"t":{"0":9}}').ending
    == opt.ByTimestamp(per={"t": {0: 9}}),
    "endingOffsets": lambda: src(True, endingOffsets='{"t":{"0":3}}').ending == {"t": {0: 3}},
    "failOnDataLoss": lambda: not src(failOnDataLoss="false").fail_on_data_loss,
    "kafkaConsumer.pollTimeoutMs": lambda: source._executor_timeout_ms(
        src(**k("kafkaConsumer.pollTimeoutMs", "700"))) == 700,
    "fetchOffset.numRetries": lambda: source._driver_retry(src(**k("fetchOffset.numRetries", "2"))).attempts == 3
    and source._driver_retry(src()).attempts is None,
    "fetchOffset.retryIntervalMs": lambda: source._driver_retry(
        src(**k("fetchOffset.retryIntervalMs", "250"))).backoff_s == 0.25,
    "maxOffsetsPerTrigger": lambda: src(maxOffsetsPerTrigger="10").max_offsets == 10,
    "minOffsetsPerTrigger": lambda: src(minOffsetsPerTrigger="10").min_offsets == 10,
    "maxTriggerDelay": lambda: src(maxTriggerDelay="2s").max_trigger_delay_ms == 2000,
    "minPartitions": lambda: source.split([(("t", 0), 0, 8)], src(minPartitions="4").min_partitions)
    == [(("t", 0), 0, 2), (("t", 0), 2, 4), (("t", 0), 4, 6), (("t", 0), 6, 8)],
    "maxRecordsPerPartition": lambda: source.split([(("t", 0), 0, 10)], None,
                                                   src(maxRecordsPerPartition="4").max_per_partition)
    == [(("t", 0), 0, 3), (("t", 0), 3, 6), (("t", 0), 6, 10)],
    "groupIdPrefix": lambda: opt.query_group_id({"checkpointLocation": "/c", "groupIdPrefix": "mine"})
    .startswith("mine-") and sink.parse_options({**BASE, "topic": "t", "checkpointLocation": "/c",
                                                 "groupIdPrefix": "mine"}).group.startswith("mine-"),
    "kafka.group.id": lambda: src(startingOffsets="committed", **k("kafka.group.id", "g")).group_id == "g"
    == sink.parse_options({**BASE, "topic": "t", "kafka.group.id": "g"}).group,
    "includeHeaders": lambda: src(includeHeaders="true").include_headers,
    "topic": lambda: snk(topic="out").topic == "out",
    "kafka.isolation.level": lambda: src().read_committed
    and not src(**k("kafka.isolation.level", "read_uncommitted")).read_committed,
    "kafka.request.timeout.ms": lambda: src(**k("kafka.request.timeout.ms", "700")).request_timeout_ms == 700
    == snk(**k("kafka.request.timeout.ms", "700")).request_timeout_ms,
    "kafka.max.partition.fetch.bytes": lambda: src(**k("kafka.max.partition.fetch.bytes", "99")).fetch_max_bytes
    == 99,
    "kafka.client.id": lambda: src(**k("kafka.client.id", "me")).client_id == "me"
    == snk(**k("kafka.client.id", "me")).producer.client_id,
    "kafka.compression.type": lambda: [snk(**k("kafka.compression.type", c)).producer.compression
                                       for c in ("none", "gzip", "snappy", "lz4", "zstd")] == [0, 1, 2, 3, 4],
    "kafka.linger.ms": lambda: snk(**k("kafka.linger.ms", "5")).producer.linger_ms == 5,
    "kafka.batch.size": lambda: snk(**k("kafka.batch.size", "100")).batch_bytes == 100
    and snk(**k("kafka.batch.size", str(10 << 20))).batch_bytes == sink_options.MAX_REQUEST_BYTES,
}

# option -> (the options that are refused, the words the error must say)
REFUSALS = {
    "kafka.acks": ({"kafka.acks": "1"}, "acks=all"),
    "kafka.enable.idempotence": ({"kafka.enable.idempotence": "false"}, "idempotent producer"),
    "kafka.transactional.id": ({"kafka.transactional.id": "x"}, "names its own transactions"),
    "kafka.auto.offset.reset": ({"kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
    "kafka.enable.auto.commit": ({"kafka.enable.auto.commit": "true"}, "checkpoint"),
    "kafka.key.deserializer": ({"kafka.key.deserializer": "x"}, "keys are binary"),
    "kafka.value.deserializer": ({"kafka.value.deserializer": "x"}, "values are binary"),
    "kafka.key.serializer": ({"kafka.key.serializer": "x"}, "`key` column"),
    "kafka.value.serializer": ({"kafka.value.serializer": "x"}, "`value` column"),
    "kafka.interceptor.classes": ({"kafka.interceptor.classes": "x"}, "no Java client"),
    "kafka.*": ({"kafka.fetch.min.bytes": "1"}, "unknown .* option.*kafka.fetch.min.bytes"),
}

SCRAM = {"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "SCRAM-SHA-512",
         "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                   'username="alice" password="alice-secret";'}
PEM_TRUST = {"kafka.security.protocol": "SSL", "kafka.ssl.truststore.type": "PEM",
             "kafka.ssl.truststore.location": "/etc/kafka/ca.pem",
             "kafka.ssl.endpoint.identification.algorithm": ""}


def both_sides(**given):
    """The Security each side parsed from the same options: (source's, sink's)."""
    return src(**given).security, snk(**given).security


# security row -> a check, on source and sink alike, that holds only when the options
# of that row were parsed into the Security every connection uses
SECURITY_EFFECTS = {
    "kafka.security.protocol": lambda: [s.protocol for s in both_sides(**k("kafka.security.protocol", "SSL"))]
    == ["SSL", "SSL"] and [s.protocol for s in both_sides()] == ["PLAINTEXT", "PLAINTEXT"],
    "kafka.sasl.*": lambda: all(s.protocol == "SASL_SSL" and s.sasl and s.mechanism == "SCRAM-SHA-512"
                                and s.username == "alice" and s.password == Secret("alice-secret")
                                for s in both_sides(**SCRAM)),
    "kafka.ssl.*": lambda: both_sides(**PEM_TRUST)
    == (security.Security(protocol="SSL", tls=Tls(ca_file="/etc/kafka/ca.pem", check_hostname=False)),) * 2,
}

ROWS = {o.name: o for o in opt.SPARK_KAFKA_OPTIONS}


def test_every_option_has_a_case():
    assert set(EFFECTS) | set(REFUSALS) | set(SECURITY_EFFECTS) == set(ROWS)
    assert {n for n, o in ROWS.items() if o.semel == opt.REFUSED} == set(REFUSALS)
    assert {n for n, o in ROWS.items() if o.semel == opt.SECURITY} == set(SECURITY_EFFECTS)


@pytest.mark.parametrize("name", sorted(SECURITY_EFFECTS))
def test_security_rows_accepted_and_parsed(name):
    assert ROWS[name].side == "both"
    assert SECURITY_EFFECTS[name]()


def test_security_rows_name_every_security_option_and_both_sides_know_them():
    """The three rows (one name, two families) cover exactly the names semel reads."""
    families = [n[:-1] for n in SECURITY_EFFECTS if n.endswith("*")]
    covered = {n for n in security.OPTIONS if n == "kafka.security.protocol" or n.startswith(tuple(families))}
    assert covered == security.OPTIONS and len(security.OPTIONS) > 10
    assert security.OPTIONS <= opt.SHARED_OPTIONS


@pytest.mark.parametrize("store", ["truststore", "keystore"])
def test_jks_stores_are_refused_with_the_conversion_on_both_sides(store):
    given = {"kafka.security.protocol": "SSL", f"kafka.ssl.{store}.type": "JKS",
             f"kafka.ssl.{store}.location": f"/etc/kafka/{store}.jks"}
    says = (rf"option 'kafka\.ssl\.{store}\.type': JKS stores are not supported, only PEM; "
            r"convert it to PEM \(keytool -importkeystore")
    with pytest.raises(opt.OptionError, match=says):
        src(**given)
    with pytest.raises(sink_options.SinkError, match=says):
        snk(**given)


def test_security_option_names_are_case_insensitive_and_secrets_stay_out_of_reprs():
    given = {"Kafka.Security.Protocol": "SASL_SSL", "KAFKA.SASL.MECHANISM": "SCRAM-SHA-512",
             "kafka.SASL.jaas.config": SCRAM["kafka.sasl.jaas.config"]}
    s, o = src(**given), snk(**given)
    assert s.security == o.security and s.security.username == "alice"
    assert "alice-secret" not in repr(s) + repr(o)


@pytest.mark.parametrize("name", sorted(EFFECTS))
def test_accepted_with_effect(name):
    row = ROWS[name]
    assert row.semel in (opt.SAME, opt.MAPPED)
    # known to the side(s) the table says
    if row.side in ("source", "both"):
        assert name.lower() in opt.SOURCE_OPTIONS | opt.SHARED_OPTIONS
    if row.side in ("sink", "both"):
        assert name.lower() in opt.SINK_OPTIONS | opt.SHARED_OPTIONS
    assert EFFECTS[name]()


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_refused_with_the_reason(name):
    row = ROWS[name]
    given, why = REFUSALS[name]
    sides = ("source", "sink") if row.side == "both" else (row.side,)
    for side in sides:
        with pytest.raises((opt.OptionError, sink_options.SinkError), match=why):
            src(**given) if side == "source" else snk(**given)


def test_guarantee_keeping_values_of_refused_settings_are_accepted():
    for acks in ("all", "-1", "ALL"):
        assert snk(**k("kafka.acks", acks)).topic == "t"
    assert snk(**k("kafka.enable.idempotence", "true")).topic == "t"


def test_option_names_are_case_insensitive_on_both_sides():
    assert src(**{"STARTINGTIMESTAMP": "5", "MaxRecordsPerPartition": "2"}).max_per_partition == 2
    assert snk(**{"Kafka.Compression.Type": "gzip", "TOPIC": "x"}).producer.compression == 1


def docs_table() -> list[tuple[str, str, str, str]]:
    text = DOCS.read_text()
    section = text[text.index("## Moving from format('kafka')"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) == 4 and cells[0].startswith("`"):
            rows.append((cells[0].strip("`"), cells[1], cells[2], cells[3]))
    return rows


def test_docs_table_is_the_codes_table():
    assert docs_table() == [(o.name, o.side, o.semel, o.note) for o in opt.SPARK_KAFKA_OPTIONS]


def test_fetch_offset_retries_bound_the_tries():
    """fetchOffset.numRetries=2: three tries of a request that keeps failing retriably, then the error."""
    from semel.client.cluster import ReaderError, _Transient
    from semel.protocol.errors import KafkaError
    tries = []

    def op():
        tries.append(1)
        raise _Transient("busy", KafkaError.NOT_LEADER_OR_FOLLOWER)
    retry = source._driver_retry(src(**k("fetchOffset.numRetries", "2"), **k("fetchOffset.retryIntervalMs", "1")))
    with pytest.raises(ReaderError, match="gave up after 3 tries"):
        retry.run("ListOffsets", op)
    assert len(tries) == 3
