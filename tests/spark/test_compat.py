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
