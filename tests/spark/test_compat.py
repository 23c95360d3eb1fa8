"""format("semel") as a drop-in for Spark's format("kafka"): Spark's semantics where
they differ from what a semel-first design would pick, on real Spark local mode and a
real semel broker."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.spark.test_source import create, produce
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
