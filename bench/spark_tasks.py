"""Cost of a micro-batch against the number of tasks writing it: results in
bench/results/spark_tasks.json.

One local[2] SparkSession and one semel broker process. For each task count (10, 200,
2,000 by default) the same input (400 records per micro-batch, a few batches) is
repartitioned into that many partitions and written by the exactly-once sink
(format("semel"), mode a) and, interleaved, by Spark's noop sink and by a Python data
source whose writer reads its input and writes nothing (the floor of any sink written
with PySpark's data source API: one Python worker round per task): the median
micro-batch time (triggerExecution) of each, past the first batch, and the ratios. With
SEMEL_SPARK_SINK_TRACE's phase lines the sink's own time per batch is reported too: its
tasks' write() time summed and its driver-side commit().
Spark's default spark.sql.shuffle.partitions (200) gives every aggregation 200 tasks
per batch however few records it holds, most of them empty; the target is at most
1.2x the noop batch at 200 tasks.

    .venv/bin/python -m bench.spark_tasks [--tasks 10,200,2000 --batches 4]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from bench.common import RESULTS, write_result
from bench.spark_pipeline import load_note, preload
from pyspark.sql.datasource import DataSource, DataSourceStreamArrowWriter, WriterCommitMessage

from semel.demo.job import session
from semel.launch.process import SemelBroker
from semel.spark.trace import TRACE_ENV

PER_BATCH = 400


class _NullWriter(DataSourceStreamArrowWriter):
    def write(self, iterator):
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass


class PythonNullSink(DataSource):
    """format("pynull"): reads each task's Arrow input and writes nothing."""

    @classmethod
    def name(cls) -> str:
        return "pynull"

    def streamWriter(self, schema, overwrite: bool):
        return _NullWriter()


SINKS = ("noop", "pynull", "semel")


def sink_ms(trace: Path, since: float) -> dict:
    """The sink's own time per batch from the trace lines written after `since`: the
    median over batches of its tasks' write() time summed, and of its commit()."""
    writes: dict[tuple, float] = {}
    commits: list[float] = []
    for line in trace.read_text().splitlines() if trace.exists() else []:
        doc = json.loads(line)
        if doc["start"] < since or doc["where"].startswith("streamWriter"):
            continue
        ms = (doc["end"] - doc["start"]) * 1000
        if doc["where"] == "commit":
            commits.append(ms)
        else:
            key = (doc["query"], doc["batch"])
            writes[key] = writes.get(key, 0.0) + ms
    return {"tasks_write_ms_sum_p50": round(statistics.median(writes.values()), 1) if writes else None,
            "commit_ms_p50": round(statistics.median(commits), 1) if commits else None}


def batch_ms(q) -> list[int]:
    return [p["durationMs"]["triggerExecution"] for p in q.recentProgress if p["numInputRows"] > 0]


def run(spark, bs: str, work: Path, tasks: int, batches: int, sink: str, tag: str) -> list[int]:
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", "tasks-in")
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(PER_BATCH)).load()
          .selectExpr("key", "value").repartition(tasks))
    w = df.writeStream.format(sink).option("checkpointLocation", str(work / f"ck-{tag}"))
    if sink == "semel":
        w = w.option("kafka.bootstrap.servers", bs).option("topic", "tasks-out").option("semel.atomicBatches", "true")
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    assert q.exception() is None, q.exception()
    got = batch_ms(q)
    assert len(got) == batches, got
    return got


@contextmanager
def bench_setup(prefix: str, batches: int):
    """What this bench and bench.spark_task_profile start with: the sink's trace on, a
    semel broker holding `batches` batches of input, a local[2] session with pynull
    registered, JVM and Python workers warmed by each sink at 10 tasks. Yields (work
    dir, trace file, bootstrap, session)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    trace = work / "trace.jsonl"
    os.environ[TRACE_ENV] = str(trace)  # read by the Python workers Spark starts from here on
    with SemelBroker(work / "data", log_path=work / "broker.log") as broker:
        bs = broker.bootstrap
        spark = session("local[2]", work)
        spark.dataSource.register(PythonNullSink)
        preload(bs, "tasks-in", PER_BATCH * batches)
        preload(bs, "tasks-out", 0)
        for sink in SINKS:
            run(spark, bs, work, 10, batches, sink, f"warm-{sink}")
        try:
            yield work, trace, bs, spark
        finally:
            spark.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", default="10,200,2000")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    loads = {"start": os.getloadavg()}
    rows: dict[str, dict] = {}
    with bench_setup("semel-spark-tasks-", a.batches) as (work, trace, bs, spark):
        for n in (int(x) for x in a.tasks.split(",")):
            times: dict[str, list[int]] = {s: [] for s in SINKS}
            since = time.time()
            for r in range(a.rounds):
                for sink in SINKS:
                    t0 = time.perf_counter()
                    ms = run(spark, bs, work, n, a.batches, sink, f"{sink}-{n}-{r}")
                    times[sink] += ms[1:]          # the first batch pays the query's start-up
                    print(f"{n} tasks {sink} round {r}: {ms} ms per batch ({time.perf_counter() - t0:.1f} s)",
                          flush=True)
            p50 = {s: statistics.median(times[s]) for s in SINKS}
            rows[str(n)] = {**{f"{s}_batch_ms_p50": p50[s] for s in SINKS},
                            "ratio": round(p50["semel"] / p50["noop"], 3),
                            "ratio_to_python_floor": round(p50["semel"] / p50["pynull"], 3),
                            "semel_sink_own": sink_ms(trace, since),
                            **{f"{s}_batch_ms": times[s] for s in SINKS}}
            loads[f"after_{n}"] = os.getloadavg()
    result = {
        "per_batch_records": PER_BATCH, "tasks": rows,
        "target": {"ratio_at_200_tasks": 1.2, "met": rows.get("200", {}).get("ratio", 99) <= 1.2},
        "notes": "median micro-batch time (triggerExecution) past each query's first batch, semel "
                 "(format('semel'), mode a), Spark's noop sink and pynull (a PySpark data source writer that "
                 "reads its input and writes nothing) alternating, the same input repartitioned into N tasks; "
                 "ratio: semel / noop; ratio_to_python_floor: semel / pynull; semel_sink_own: the sink's own "
                 "time per batch (its tasks' write() summed over tasks, running 2 at a time, and its commit()). "
                 "An empty task's branch is never opened (no broker round trip).",
        "load": load_note(loads),
    }
    path = write_result(a.out, "spark_tasks", result)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
