"""format("semel") warns once per run when each micro-batch will be written by more than
64 Python tasks after an aggregation (semel.spark.advice): a real driver process (its
own SparkSession, `python -m tests.spark.test_sink_advice`) runs a Complete-mode count
and an Append-mode windowed count at 65 shuffle partitions, two micro-batches each, and
a Complete-mode count at 8; its output holds the warning once for each of the first two
queries and not for the third."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from semel.spark.advice import MANY_TASKS
from tests.spark.test_source import create, produce

QUERIES = [("complete", MANY_TASKS + 1), ("append", MANY_TASKS + 1), ("complete", 8)]
WARNING = "Python tasks (spark.sql.shuffle.partitions="


@pytest.mark.timeout(600)
def test_many_python_tasks_warn_once_per_query(spark_broker, tmp_path):
    bs = spark_broker.bootstrap
    create(bs, "advice-in", 1)
    create(bs, "advice-out", 1)
    produce(bs, "advice-in", [str(i) for i in range(20)])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, "-m", "tests.spark.test_sink_advice", bs, str(tmp_path)], env=env,
                          cwd=os.getcwd(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=580)
    out = proc.stdout.decode(errors="replace")
    assert proc.returncode == 0, out[-5000:]
    lines = [line for line in out.splitlines() if WARNING in line or line.startswith("query done")]
    assert lines == [f"semel: this query writes each micro-batch from {MANY_TASKS + 1} {WARNING}"
                     f"{MANY_TASKS + 1} after its aggregation, fixed in its checkpoint); PySpark pays a Python worker "
                     "round per task, so even a small batch takes seconds. Lower spark.sql.shuffle.partitions (to the "
                     "executors' cores, say) before the query's first run, with a new checkpoint, or write through "
                     "foreachBatch(write_each_batch(options)), which writes from the executors' cores."
                     if i % 2 == 0 else f"query done {i // 2}" for i in range(4)] + ["query done 2"], lines


def _driver(bs: str, work: str) -> None:
    from pyspark.sql.functions import window

    from semel.spark import local_session
    spark = local_session("local[2]", "semel-advice", work + "/local")
    for i, (mode, partitions) in enumerate(QUERIES):
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
        df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "advice-in")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "10").load())
        if mode == "complete":
            out = df.groupBy("key").count().selectExpr("CAST(count AS STRING) AS value")
        else:
            ts = df.selectExpr("timestamp_seconds(CAST(CAST(value AS STRING) AS BIGINT)) AS ts")
            out = (ts.withWatermark("ts", "1 second").groupBy(window("ts", "5 seconds")).count()
                   .selectExpr("CAST(count AS STRING) AS value"))
        q = (out.writeStream.outputMode(mode).format("semel").option("kafka.bootstrap.servers", bs)
             .option("topic", "advice-out").option("checkpointLocation", f"{work}/ck{i}")
             .trigger(availableNow=True).start())
        q.awaitTermination()
        if q.exception() is not None:
            raise SystemExit(f"query failed: {q.exception()}")
        print(f"query done {i}", flush=True)
    spark.stop()


if __name__ == "__main__":
    _driver(*sys.argv[1:3])
