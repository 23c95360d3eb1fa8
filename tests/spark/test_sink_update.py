"""Update output mode, exactly once, through foreachBatch (semel.spark.each_batch):
the canonical Spark + Kafka job, a windowed count with a watermark written in update
mode, into a real semel broker, read back by an unmodified confluent-kafka
read_committed consumer and compared with the same query's updates collected by a
plain foreachBatch function (the reference: what Spark emitted, once).

format("semel") itself is refused in Update mode by pyspark 4.3 (shown first). With
Spark's default 200 shuffle partitions (each batch written by 200 tasks), the query's
driver is SIGKILLed at each step of the commit (a task after producing, after the
decision's offsets, after the decision) and restarted from its checkpoint: the output
is still the reference exactly once. The driver runs in its own process session
(`python -m tests.spark.test_sink_update`)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest

from semel.spark import hooks
from semel.spark.each_batch import write_each_batch
from semel.spark.sink_options import SinkError
from tests.spark.test_source import create, produce
from tests.support.consume import read_values

EVENTS = 90            # event times 0..89 s, spread over both input partitions
PER_TRIGGER = 45       # two micro-batches of input, each written by 200 tasks


def events() -> tuple[list[str], list[str]]:
    times = [i ^ 1 for i in range(EVENTS)]     # each second once, neighbours swapped: none late for the watermark
    return [str(t) for t in times[0::2]], [str(t) for t in times[1::2]]


def windowed_counts(spark, bs: str, src: str):
    from pyspark.sql.functions import window
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", src)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(PER_TRIGGER)).load())
    ev = df.selectExpr("timestamp_seconds(CAST(CAST(value AS STRING) AS BIGINT)) AS ts")
    counts = ev.withWatermark("ts", "20 seconds").groupBy(window("ts", "10 seconds")).count()
    return counts.selectExpr("CAST(unix_timestamp(window.start) AS STRING) AS key",
                             "concat(CAST(unix_timestamp(window.start) AS STRING), ':', CAST(count AS STRING)) AS value")


def reference(spark, bs: str, src: str, ck: str) -> Counter:
    got: list[str] = []
    q = (windowed_counts(spark, bs, src).writeStream.outputMode("update")
         .foreachBatch(lambda df, _: got.extend(r.value for r in df.collect()))
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None
    return Counter(got)


def setup(bs: str, name: str) -> str:
    src = f"{name}-in"
    create(bs, src, 2)
    a, b = events()
    produce(bs, src, a, partition=0)
    produce(bs, src, b, partition=1)
    return src


@pytest.fixture(scope="module")
def updates(spark, spark_broker, tmp_path_factory) -> tuple[str, Counter]:
    """The input topic the exactly-once tests share (each writes its own output topic)
    and the reference: the query's updates, as Spark emits them, collected once."""
    bs = spark_broker.bootstrap
    src = setup(bs, "upd")
    return src, reference(spark, bs, src, str(tmp_path_factory.mktemp("upd-ref") / "ck"))


def test_format_semel_is_refused_in_update_mode(spark, spark_broker, tmp_path):
    bs = spark_broker.bootstrap
    src = setup(bs, "upd-refused")
    q = None
    with pytest.raises(Exception) as exc:
        q = (windowed_counts(spark, bs, src).writeStream.outputMode("update").format("semel")
             .option("kafka.bootstrap.servers", bs).option("topic", "upd-refused-out")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
        q.awaitTermination(60)
        raise q.exception() or AssertionError("the query ran")
    assert "does not support Update mode" in str(exc.value)


def test_write_each_batch_needs_the_checkpoint():
    with pytest.raises(SinkError, match="checkpointLocation"):
        write_each_batch({"kafka.bootstrap.servers": "x:1", "topic": "t"})


@pytest.mark.parametrize("name,value,why", [("semel.write.tasks", "0", "positive"),
                                            ("semel.write.tasks", "two", "integer"),
                                            ("semel.write.rebalance", "yes", "true or false")])
def test_write_each_batch_refuses_a_bad_task_option(name, value, why):
    with pytest.raises(SinkError, match=why):
        write_each_batch({"kafka.bootstrap.servers": "x:1", "topic": "t", "checkpointLocation": "/ck", name: value})


def test_format_semel_refuses_the_task_options():
    """format("semel") cannot choose its tasks (one per input partition): the option
    would do nothing there, so it is an error naming where it applies."""
    from semel.spark.sink import parse_options
    with pytest.raises(SinkError, match="write_each_batch"):
        parse_options({"kafka.bootstrap.servers": "x:1", "topic": "t", "checkpointLocation": "/ck",
                       "semel.write.tasks": "2"})


def write_stage_tasks(spark, q) -> list[tuple[str, int]]:
    """Spark's own count of tasks in the last stage of each job the query ran (Spark runs
    a query's jobs, those of its foreachBatch function included, in a job group named
    by the run's id): (stage name, tasks)."""
    st = spark.sparkContext.statusTracker()
    out = []
    for job in sorted(st.getJobIdsForGroup(str(q.runId))):
        stages = [st.getStageInfo(s) for s in st.getJobInfo(job).stageIds]
        last = max((s for s in stages if s is not None), key=lambda s: s.stageId)
        out.append((last.name, last.numTasks))
    return out


# (extra options, expected tasks per batch: None is the executors' cores)
SHAPES = [({}, None), ({"semel.write.tasks": "3", "semel.write.rebalance": "true"}, 3)]


@pytest.mark.parametrize("extra,tasks", SHAPES, ids=["cores", "option"])
def test_update_mode_windowed_count_is_exactly_once(spark, spark_broker, updates, tmp_path, extra, tasks):
    """With Spark's default 200 shuffle partitions, each batch is written by as many
    Python tasks as the executors' cores (or as the option says), and exactly once."""
    bs = spark_broker.bootstrap
    name = f"upd-{len(extra)}"
    src, want = updates
    create(bs, f"{name}-out", 2)
    ck = str(tmp_path / "ck")
    opts = {"kafka.bootstrap.servers": bs, "topic": f"{name}-out", "checkpointLocation": ck, **extra}
    spark.conf.set("spark.sql.shuffle.partitions", "200")
    try:
        q = (windowed_counts(spark, bs, src).writeStream.outputMode("update").foreachBatch(write_each_batch(opts))
             .option("checkpointLocation", ck).trigger(availableNow=True).start())
        q.awaitTermination(300)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert q.exception() is None
    written = write_stage_tasks(spark, q)
    assert len(written) >= EVENTS // PER_TRIGGER, written
    assert {n for _, n in written} == {tasks or spark.sparkContext.defaultParallelism}, written
    got = Counter(read_values(bs, f"{name}-out", 2, want=sum(want.values())))
    assert got == want
    # every window's last update is its full count
    final = {}
    for v in want:
        w, n = v.split(":")
        final[w] = max(final.get(w, 0), int(n))
    assert sum(final.values()) == EVENTS


def run_driver(bs: str, src: str, dst: str, ck: str, kill_at: str | None) -> int:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    env.pop(hooks.KILL_ENV, None)
    if kill_at:
        env[hooks.KILL_ENV] = kill_at
    proc = subprocess.run([sys.executable, "-m", "tests.spark.test_sink_update", bs, src, dst, ck], env=env,
                          cwd=os.getcwd(), start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=400)
    if proc.returncode not in (0, -9):
        print(proc.stdout.decode(errors="replace")[-5000:])
    return proc.returncode


@pytest.mark.timeout(900)   # 200 stateful tasks a batch on local[2]: ~40 s a batch here, three driver starts
def test_update_mode_with_200_shuffle_partitions_survives_driver_kills(spark_broker, updates, tmp_path):
    """A kill after the tasks produced (the batch is redone) and one after the decision
    (the restart completes it); every step's kill at two tasks is tests/spark/test_sink_crash.py's."""
    bs = spark_broker.bootstrap
    src, want = updates
    create(bs, "upd-kill-out", 2)
    ck = str(tmp_path / "ck")
    for batch, step in enumerate(["write:produced", "commit:decided"]):
        assert run_driver(bs, src, "upd-kill-out", ck, f"{step}@{batch}") == -9, f"not killed at {step}@{batch}"
    assert run_driver(bs, src, "upd-kill-out", ck, None) == 0
    assert Counter(read_values(bs, "upd-kill-out", 2, want=sum(want.values()))) == want


def _driver(bs: str, src: str, dst: str, ck: str) -> None:
    os.environ[hooks.KILL_PGID_ENV] = str(os.getpgid(0))
    from semel.spark import local_session
    spark = local_session("local[2]", "semel-update-crash", ck + "-local")
    spark.conf.set("spark.sql.shuffle.partitions", "200")   # Spark's default (local_session's is 2)
    opts = {"kafka.bootstrap.servers": bs, "topic": dst, "checkpointLocation": ck}
    q = (windowed_counts(spark, bs, src).writeStream.outputMode("update").foreachBatch(write_each_batch(opts))
         .option("checkpointLocation", ck).trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise SystemExit(f"query failed: {q.exception()}")
    spark.stop()


if __name__ == "__main__":
    _driver(*sys.argv[1:5])
