"""The Python examples of Spark's "Structured Streaming + Kafka Integration Guide"
(Spark 4), with only `format("kafka")` changed to `format("semel")`, against a semel
broker and against Tansu. The other changes are the two the migration notes name: a
batch write says `mode("append")` (PySpark refuses its default mode for Python data
sources), and a streaming write names its `checkpointLocation` (a Python sink is not
told the one Spark derives from `spark.sql.streaming.checkpointLocation`, which the
guide's examples assume and the reads here use). Queries run until
processAllAvailable()."""
from __future__ import annotations

import pytest

from tests.spark.test_source import create, produce
from tests.support.consume import read_values

FMT = "semel"


@pytest.fixture(scope="module", params=["semel", "tansu"])
def guide_broker(request, tmp_path_factory):
    """A semel broker, and Tansu: a Kafka-compatible broker that is not semel (the sink
    runs in its standard-API mode there)."""
    if request.param == "semel":
        yield request.getfixturevalue("spark_broker")
        return
    from semel.launch.process import TansuBroker
    b = TansuBroker()
    b.start()
    yield b
    b.close()


@pytest.fixture(scope="module")
def guide(spark, guide_broker, tmp_path_factory):
    """topic1 (2 partitions), topic2 (1) with records; the session's default checkpoint root."""
    bs = guide_broker.bootstrap
    create(bs, "topic1", 2)
    create(bs, "topic2", 1)
    for t, p in (("topic1", 0), ("topic1", 1), ("topic2", 0)):
        produce(bs, t, [f"{t}-{p}-{i}" for i in range(60)], partition=p)
    spark.conf.set("spark.sql.streaming.checkpointLocation", str(tmp_path_factory.mktemp("guide-ck")))
    yield bs
    spark.conf.unset("spark.sql.streaming.checkpointLocation")


def collected(df):
    """Run a streaming DataFrame until it has read everything there is; its rows so far
    and the query (still running)."""
    rows: list = []
    q = df.writeStream.foreachBatch(lambda b, _: rows.extend(b.collect())).start()
    q.processAllAvailable()
    return rows, q


def stream_sees_new_records(spark, df, bs, topic, expect_values):
    rows, q = collected(df)
    try:
        assert rows == []  # the guide's stream starts at latest
        produce(bs, topic, ["new-1", "new-2"])
        q.processAllAvailable()
        assert sorted(r.value for r in rows) == expect_values
        return rows
    finally:
        q.stop()


def test_read_stream_subscribe_one_topic(spark, guide):
    # Subscribe to 1 topic
    df = spark \
        .readStream \
        .format(FMT) \
        .option("kafka.bootstrap.servers", guide) \
        .option("subscribe", "topic1") \
        .load()
    df = df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
    rows = stream_sees_new_records(spark, df, guide, "topic1", ["new-1", "new-2"])
    assert [r.key for r in sorted(rows, key=lambda r: r.value)] == ["k0", "k1"]


def test_read_stream_with_headers_several_topics_and_pattern(spark, guide):
    # Subscribe to 1 topic, with headers
    df = spark \
        .readStream \
        .format(FMT) \
        .option("kafka.bootstrap.servers", guide) \
        .option("subscribe", "topic2") \
        .option("includeHeaders", "true") \
        .load()
    df = df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)", "headers")
    stream_sees_new_records(spark, df, guide, "topic2", ["new-1", "new-2"])
    # Subscribe to multiple topics
    df = spark \
        .readStream \
        .format(FMT) \
        .option("kafka.bootstrap.servers", guide) \
        .option("subscribe", "topic1,topic2") \
        .load()
    stream_sees_new_records(spark, df.selectExpr("CAST(value AS STRING)"), guide, "topic2", ["new-1", "new-2"])
    # Subscribe to a pattern
    df = spark \
        .readStream \
        .format(FMT) \
        .option("kafka.bootstrap.servers", guide) \
        .option("subscribePattern", "topic.*") \
        .load()
    stream_sees_new_records(spark, df.selectExpr("CAST(value AS STRING)"), guide, "topic1", ["new-1", "new-2"])


def test_batch_reads(spark, guide):
    everything = {f"{t}-{p}-{i}" for t, p in (("topic1", 0), ("topic1", 1), ("topic2", 0)) for i in range(60)}
    # Subscribe to 1 topic defaults to the earliest and latest offsets
    df = spark \
        .read \
        .format(FMT) \
        .option("kafka.bootstrap.servers", guide) \
        .option("subscribe", "topic1") \
        .load()
    got = {r.value for r in df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()}
    assert {v for v in everything if v.startswith("topic1")} <= got
    # Subscribe to multiple topics, specifying explicit Kafka offsets
    df = spark \
        .read \
        .format(FMT) \
        .option("kafka.bootstrap.servers", guide) \
        .option("subscribe", "topic1,topic2") \
        .option("startingOffsets", """{"topic1":{"0":23,"1":-2},"topic2":{"0":-2}}""") \
        .option("endingOffsets", """{"topic1":{"0":50,"1":-1},"topic2":{"0":-1}}""") \
        .load()
    got = [r.value for r in df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()]
    assert {v for v in got if v.startswith("topic1-0-")} == {f"topic1-0-{i}" for i in range(23, 50)}
    assert {f"topic1-1-{i}" for i in range(60)} | {f"topic2-0-{i}" for i in range(60)} <= set(got)
    # Subscribe to a pattern, at the earliest and latest offsets
    df = spark \
        .read \
        .format(FMT) \
        .option("kafka.bootstrap.servers", guide) \
        .option("subscribePattern", "topic.*") \
        .option("startingOffsets", "earliest") \
        .option("endingOffsets", "latest") \
        .load()
    assert everything <= {r.value for r in df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()}


def test_writes_with_topic_option_and_topic_column(spark, guide, tmp_path):
    bs = guide
    create(bs, "out1", 1)
    create(bs, "out2", 1)
    src = spark.read.format(FMT).option("kafka.bootstrap.servers", bs).option("subscribe", "topic2").load()
    # Write key-value data from a DataFrame to a specific Kafka topic specified in an option
    src.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \
        .write \
        .mode("append") \
        .format(FMT) \
        .option("kafka.bootstrap.servers", bs) \
        .option("topic", "out1") \
        .save()
    # Write key-value data from a DataFrame to Kafka using a topic specified in the data
    df = src.selectExpr("'out2' AS topic", "key", "value")  # a DataFrame whose rows name their topic
    df.selectExpr("topic", "CAST(key AS STRING)", "CAST(value AS STRING)") \
        .write \
        .mode("append") \
        .format(FMT) \
        .option("kafka.bootstrap.servers", bs) \
        .save()
    want = sorted(r.value.decode() for r in src.collect())
    assert sorted(read_values(bs, "out1", 1, want=len(want))) == want
    assert sorted(read_values(bs, "out2", 1, want=len(want))) == want
    # the same as streams
    df = spark.readStream.format(FMT).option("kafka.bootstrap.servers", bs) \
        .option("subscribe", "topic2").option("startingOffsets", "earliest").load()
    ds = df \
        .selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)") \
        .writeStream \
        .format(FMT) \
        .option("kafka.bootstrap.servers", bs) \
        .option("topic", "out1") \
        .option("checkpointLocation", str(tmp_path / "w1")) \
        .start()
    ds.processAllAvailable()
    ds.stop()
    df = df.selectExpr("'out2' AS topic", "key", "value")
    ds = df \
        .selectExpr("topic", "CAST(key AS STRING)", "CAST(value AS STRING)") \
        .writeStream \
        .format(FMT) \
        .option("kafka.bootstrap.servers", bs) \
        .option("checkpointLocation", str(tmp_path / "w2")) \
        .start()
    ds.processAllAvailable()
    ds.stop()
    assert sorted(read_values(bs, "out1", 1, want=2 * len(want))) == sorted(want * 2)
    assert sorted(read_values(bs, "out2", 1, want=2 * len(want))) == sorted(want * 2)
