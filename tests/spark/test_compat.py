"""format("semel") as a drop-in for Spark's format("kafka"): Spark's semantics where
they differ from what a semel-first design would pick, on real Spark local mode and a
real semel broker."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.spark.test_source import create, produce
from tests.support import wait
from tests.support.consume import read_values

# A fresh SparkSession that never calls register(): Spark 4 finds `pyspark_semel`.
UNREGISTERED = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    bs, topic, local = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.local.dir", local).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    (spark.createDataFrame([("a",), ("b",), ("c",)], "value string").write.format("semel")
     .mode("append").option("kafka.bootstrap.servers", bs).option("topic", topic).save())
    rows = (spark.read.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", topic)
            .load().selectExpr("CAST(value AS STRING)").collect())
    print("READ", ",".join(sorted(r.value for r in rows)))
    from semel.spark import register
    register(spark)  # still allowed next to the found one
    print("REGISTERED")
""")


def test_format_semel_without_register(spark_broker, tmp_path):
    bs = spark_broker.bootstrap
    create(bs, "noreg", 1)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    out = subprocess.run([sys.executable, "-c", UNREGISTERED, bs, "noreg", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=240)
    assert "READ a,b,c" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "REGISTERED" in out.stdout
    assert sorted(read_values(bs, "noreg", 1, want=3)) == ["a", "b", "c"]


def writer(df, bs, **options):
    w = df.write.format("semel").option("kafka.bootstrap.servers", bs)
    for k, v in options.items():
        w = w.option(k, v)
    return w


def batch_read(spark, bs, **options):
    r = spark.read.format("semel").option("kafka.bootstrap.servers", bs)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


# --- Spark's semantics -------------------------------------------------------------------

def test_topic_option_overrides_topic_column(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "tp-opt", 1)
    create(bs, "tp-col", 1)
    df = spark.createDataFrame([(f"v{i}", "tp-col") for i in range(5)], "value string, topic string")
    writer(df, bs, topic="tp-opt").mode("append").save()            # the columnar path
    with_partition = df.selectExpr("value", "topic", "0 AS partition")
    writer(with_partition, bs, topic="tp-opt").mode("append").save()  # the row path
    assert sorted(read_values(bs, "tp-opt", 1, want=10)) == sorted([f"v{i}" for i in range(5)] * 2)
    assert read_values(bs, "tp-col", 1, idle_s=0.5) == []
    # without the option the column routes, and a null topic is refused
    writer(df, bs).mode("append").save()
    assert sorted(read_values(bs, "tp-col", 1, want=5)) == [f"v{i}" for i in range(5)]
    nulls = spark.createDataFrame([("x", None)], "value string, topic string")
    with pytest.raises(Exception, match="null topic"):
        writer(nulls, bs).mode("append").save()


def test_save_modes(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "modes", 1)
    df = spark.createDataFrame([("a",)], "value string")
    with pytest.raises(Exception, match="Overwrite is not allowed.*mode\\('append'\\)"):
        writer(df, bs, topic="modes").mode("overwrite").save()
    # PySpark itself refuses the default ErrorIfExists for every Python data source
    with pytest.raises(Exception, match="(?i)append"):
        writer(df, bs, topic="modes").save()
    writer(df, bs, topic="modes").mode("append").save()
    assert read_values(bs, "modes", 1, want=1) == ["a"]


def test_batch_reads_planning_nothing_are_empty(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "empty-t", 2)
    create(bs, "some-t", 1)
    produce(bs, "some-t", ["a", "b", "c"])
    assert batch_read(spark, bs, subscribe="empty-t").count() == 0
    same = '{"some-t":{"0":2}}'
    assert batch_read(spark, bs, subscribe="some-t", startingOffsets=same, endingOffsets=same).count() == 0
    assert batch_read(spark, bs, subscribePattern="matches-nothing-.*").count() == 0
    assert batch_read(spark, bs, subscribe="some-t").count() == 3


def test_stream_waits_for_a_topic_that_does_not_exist_yet(spark, spark_broker, tmp_path):
    bs = spark_broker.bootstrap
    with pytest.raises(Exception, match="unknown topic or partition: late-t"):
        batch_read(spark, bs, subscribe="late-t").collect()
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs)
          .option("subscribe", "late-t").load())
    seen: list[str] = []
    q = (df.writeStream.foreachBatch(lambda b, _: seen.extend(r.value.decode() for r in b.collect()))
         .trigger(processingTime="200 milliseconds").option("checkpointLocation", str(tmp_path / "ck"))
         .start())
    try:
        wait.until(lambda: q.lastProgress is not None, "a first trigger without the topic")
        assert q.isActive and q.exception() is None
        create(bs, "late-t", 1)
        produce(bs, "late-t", ["x", "y"])
        wait.until(lambda: sorted(seen) == ["x", "y"], "the topic read once it appeared")
    finally:
        q.stop()


def test_misspelt_stream_option_fails_with_its_cause_alone(spark, spark_broker):
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", spark_broker.bootstrap)
          .option("subscribe", "x").option("startingOffset", "earliest").load())
    q = df.writeStream.format("noop").start()
    with pytest.raises(Exception) as failed:
        q.awaitTermination(120)
    err = str(failed.value)
    assert "unknown source option(s) for format('semel'): startingoffset" in err
    assert "UnboundLocalError" not in err


# --- Spark's remaining options -------------------------------------------------------------

def produce_at(bs, topic, stamped, partition=0):
    """Records with explicit create times: [(value, timestamp ms)]."""
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
    for v, ts in stamped:
        p.produce(topic, value=v.encode(), partition=partition, timestamp=ts)
    assert p.flush(30) == 0


def test_timestamp_starts_and_ends(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "ts-t", 2)
    produce_at(bs, "ts-t", [(f"a{i}", 1_000 + i * 100) for i in range(5)], partition=0)  # 1000..1400
    produce_at(bs, "ts-t", [(f"b{i}", 2_000 + i * 100) for i in range(5)], partition=1)  # 2000..2400

    def vals(**options):
        return sorted(r.value.decode() for r in batch_read(spark, bs, subscribe="ts-t", **options).collect())

    assert vals(startingTimestamp="1250") == ["a3", "a4"] + [f"b{i}" for i in range(5)]
    assert vals(startingOffsetsByTimestamp='{"ts-t":{"0":1400,"1":2300}}') == ["a4", "b3", "b4"]
    # startingTimestamp wins over startingOffsetsByTimestamp and startingOffsets (Spark's precedence)
    assert vals(startingTimestamp="1300", startingOffsetsByTimestamp='{"ts-t":{"0":0,"1":0}}',
                startingOffsets="earliest") == ["a3", "a4"] + [f"b{i}" for i in range(5)]
    assert vals(endingTimestamp="1200") == ["a0", "a1"]
    assert vals(endingOffsetsByTimestamp='{"ts-t":{"0":9999,"1":2100}}') == \
        [f"a{i}" for i in range(5)] + ["b0"]  # no record at 9999: that end is the latest offset
    # no record at or after the start: fail (Spark's default strategy), or start at the end
    with pytest.raises(Exception, match="no record at or after the starting timestamp in ts-t-0"):
        vals(startingOffsetsByTimestamp='{"ts-t":{"0":5000,"1":0}}')
    assert vals(startingOffsetsByTimestamp='{"ts-t":{"0":5000,"1":2400}}',
                startingOffsetsByTimestampStrategy="latest") == ["b4"]
    with pytest.raises(Exception, match="must name exactly the partitions read; differs at ts-t-1"):
        vals(startingOffsetsByTimestamp='{"ts-t":{"0":0}}')
    # a stream starts there too
    got: list[str] = []
    q = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "ts-t")
         .option("startingTimestamp", "1350").load().writeStream
         .foreachBatch(lambda b, _: got.extend(r.value.decode() for r in b.collect()))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(120) and q.exception() is None
    assert sorted(got) == ["a4"] + [f"b{i}" for i in range(5)]


def test_max_records_per_partition_splits_the_tasks(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "mrp-t", 1)
    produce(bs, "mrp-t", [str(i) for i in range(10)])
    df = batch_read(spark, bs, subscribe="mrp-t", maxRecordsPerPartition="3")
    assert df.rdd.getNumPartitions() == 4  # 10 offsets in pieces of at most 3
    assert sorted(int(r.value) for r in df.collect()) == list(range(10))


def on_disk_batches(broker, topic):
    """Headers of the data batches a topic's partition 0 holds in the broker's segment files."""
    from semel.protocol import records
    out = []
    for seg in sorted((broker.data_dir).rglob("*.log")):
        if seg.parent.name != f"{topic}-0":
            continue
        data = seg.read_bytes()
        out += [h for _, h in records.iter_batches(data) if not h.is_control]
    return out


@pytest.mark.parametrize("codec, code", [("gzip", 1), ("snappy", 2), ("lz4", 3), ("zstd", 4)])
def test_sink_compression(spark, spark_broker, codec, code):
    bs = spark_broker.bootstrap
    topic = f"zip-{codec}"
    create(bs, topic, 1)
    df = spark.createDataFrame([(f"k{i}", f"value-{i}" * 10) for i in range(20)], "key string, value string")
    writer(df, bs, topic=topic, **{"kafka.compression.type": codec}).mode("append").save()          # columnar
    writer(df.selectExpr("key", "value", "0 AS partition"), bs, topic=topic,
           **{"kafka.compression.type": codec}).mode("append").save()                              # row path
    assert sorted(read_values(bs, topic, 1, want=40)) == sorted([f"value-{i}" * 10 for i in range(20)] * 2)
    assert {h.compression for h in on_disk_batches(spark_broker, topic)} == {code}


def test_sink_producer_settings(spark, spark_broker):
    bs = spark_broker.bootstrap
    create(bs, "prod-t", 1)
    df = spark.createDataFrame([(f"{i:04d}",) for i in range(10)], "value string").coalesce(1)
    writer(df, bs, topic="prod-t", **{"kafka.batch.size": "40", "kafka.linger.ms": "5", "kafka.client.id": "me",
                                      "kafka.acks": "all", "kafka.enable.idempotence": "true"}).mode("append").save()
    assert read_values(bs, "prod-t", 1, want=10) == [f"{i:04d}" for i in range(10)]
    # 20 bytes counted per record: a batch is cut once it reaches 40
    assert [h.record_count for h in on_disk_batches(spark_broker, "prod-t")] == [2] * 5
    for bad, why in ((("kafka.acks", "1"), "acks=all"), (("kafka.enable.idempotence", "false"), "idempotent")):
        with pytest.raises(Exception, match=f"{bad[0]}.*refused.*{why}"):
            writer(df, bs, topic="prod-t", **{bad[0]: bad[1]}).mode("append").save()
