"""Real speculative execution through the semel sink.

Spark's local mode never speculates (one executor on one host), and Spark never runs
a speculative copy of a task on a host that already runs an attempt of it. So the
query runs on a standalone cluster whose two workers bind 127.0.0.1 and 127.0.0.2
(examples/spark_standalone.py, own_hosts): to Spark, two hosts.

One task's first attempt writes its rows into its branch and then stalls; Spark
launches a speculative copy on the other worker, which writes the same rows, wins,
and the straggler is killed. The log holds both attempts' rows (read_uncommitted);
a read_committed reader sees exactly one attempt's, and every input exactly once.

The query runs in its own driver process (`python -m tests.spark.test_sink_speculation`):
the test session's SparkContext is a local one, and a process has only one."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.spark.test_source import create, produce
from tests.support.consume import read_values

ROWS = 40  # per input partition
STALL_S = 120  # the straggler's stall: far longer than the whole query with its copy
PAD = b"#" * 10_000
EXAMPLES = Path(__file__).parents[2] / "examples"


def tag_attempt(flags: str):
    """mapInArrow function: tag every value with its task's partition and attempt
    (`<value>@p<partition>a<attempt>|<padding>`), mark each attempt by a file in `flags`, and
    stall the first attempt of task 0 after it produced all its rows."""
    def tag(batches):
        import time

        import pyarrow as pa
        from pyspark import TaskContext
        ctx = TaskContext.get()
        p, a = ctx.partitionId(), ctx.attemptNumber()
        Path(flags, f"p{p}.a{a}").touch()
        # Padding: Spark's Python workers and JVM buffer 64 KiB per stream before sending,
        # so the straggler's rows must exceed that to reach its sink before it stalls.
        suffix = f"@p{p}a{a}|".encode() + PAD
        for rb in batches:
            values = [v + suffix for v in rb.column("value").to_pylist()]
            yield pa.record_batch([rb.column("key"), pa.array(values, pa.binary())], names=["key", "value"])
        if p == 0 and a == 0:
            time.sleep(STALL_S)  # a straggler: slower than 1.1 x the median, Spark copies it
    return tag


def driver(bootstrap: str, src: str, dst: str, checkpoint: str, master: str, flags: str) -> None:
    from semel.spark import local_session
    spark = local_session(master, "semel-speculation", Path(checkpoint).parent / "spark-local", **{
        "spark.speculation": "true", "spark.speculation.interval": "100ms",
        "spark.speculation.multiplier": "1.1", "spark.speculation.quantile": "0.5",
        "spark.speculation.minTaskRuntime": "500ms", "spark.executor.memory": "1g",
        "spark.driver.host": "127.0.0.1",
        # small Arrow batches reach the sink while the straggler's input is still open
        "spark.sql.execution.arrow.maxRecordsPerBatch": "5"})
    q = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bootstrap).option("subscribe", src)
         .option("startingOffsets", "earliest").load()
         .selectExpr("key", "value").mapInArrow(tag_attempt(flags), "key binary, value binary")
         .writeStream.format("semel").option("kafka.bootstrap.servers", bootstrap).option("topic", dst)
         .option("checkpointLocation", checkpoint).option("semel.batch.rows", "5")
         .trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    spark.stop()


@pytest.fixture
def cluster(tmp_path):
    sys.path.insert(0, str(EXAMPLES))
    try:
        import spark_standalone
    finally:
        sys.path.remove(str(EXAMPLES))
    root = tmp_path / "cluster"
    root.mkdir()
    url, procs = spark_standalone.start_cluster(root, 2, own_hosts=True)
    try:
        yield url
    finally:
        spark_standalone.stop_cluster(procs)


@pytest.mark.slow
def test_speculative_copy_and_straggler_both_write_one_is_visible(spark_broker, cluster, tmp_path):
    bs = spark_broker.bootstrap
    create(bs, "spec-in", 2)
    create(bs, "spec-out", 2)
    for p in range(2):
        produce(bs, "spec-in", [f"{p}-{i}" for i in range(ROWS)], partition=p)
    flags = tmp_path / "attempts"
    flags.mkdir()
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    r = subprocess.run([sys.executable, "-m", "tests.spark.test_sink_speculation", bs, "spec-in", "spec-out",
                        str(tmp_path / "ck"), cluster, str(flags)], env=env, cwd=os.getcwd(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=STALL_S + 240)
    assert r.returncode == 0, r.stdout.decode(errors="replace")[-5000:]
    # Spark ran task 0 twice (the straggler and its speculative copy), task 1 once
    assert sorted(f.name for f in flags.iterdir()) == ["p0.a0", "p0.a1", "p1.a0"]
    # both attempts of task 0 wrote: the log holds rows of each
    raw = [split(v) for v in read_values(bs, "spec-out", 2, isolation="read_uncommitted", want=3 * ROWS)]
    assert {attempt for _, attempt in raw} == {"p0a0", "p0a1", "p1a0"}
    # a read_committed reader sees one attempt of each task, every input exactly once
    got = [split(v) for v in read_values(bs, "spec-out", 2, want=2 * ROWS)]
    assert Counter(row for row, _ in got) == Counter(f"{p}-{i}" for p in range(2) for i in range(ROWS))
    assert len({attempt for row, attempt in got if row.startswith("0-")}) == 1


def split(value: str) -> tuple[str, str]:
    """(input value, "p<partition>a<attempt>") of an output value."""
    row, attempt = value.split("|", 1)[0].rsplit("@", 1)
    return row, attempt

if __name__ == "__main__":
    driver(*sys.argv[1:])
