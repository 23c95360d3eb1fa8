"""Where a format("semel") task's time goes at 200 tasks a micro-batch: results in
bench/results/spark_task_profile.json.

PySpark gives every partition of a Python data source writer's input its own Python
task. One local[2] SparkSession and one semel broker; the same input (400 records a
batch) repartitioned into 200 tasks is written by Spark's noop sink, by `pynull` (a
Python writer that reads its input and writes nothing: the floor of any PySpark sink)
and by format("semel"), alternating (bench.spark_tasks.run). Per task:

- Spark's Python runner: (pynull batch - noop batch) x cores / tasks, the time a task
  slot spends on a Python task beyond the JVM's own (worker hand-off, the writer's
  unpickling, Arrow in and out, the result's return);
- worker starts: from the sink's trace (SEMEL_SPARK_SINK_TRACE), the Python processes
  that ran semel's tasks and how many each ran (a reused worker pays its imports once);
- semel's imports in a worker (measured in a fresh interpreter that has pyspark's worker
  modules loaded, as a Spark worker has), paid once per worker start;
- unpickling semel's writer (measured the same way), paid by every task;
- semel's own time in write() less its waits for the next Arrow batch of its input
  (Spark's), per phase from the trace: the pooled connection
  (connect), the decided-yet check with the branch's InitProducerId (check_and_init),
  the rows produced with the join and re-check riding on the last request
  (input_and_produce), and a re-check of its own when nothing was left to send; and
  how much of write() was the worker's own CPU (the rest waits on the broker's
  answers, or for a core on a machine the broker and Spark share).

semel's own cost per task = write() + unpickling + imports / tasks per worker; the
target is at most 10% of the Python-writer floor per task.

    .venv/bin/python -m bench.spark_task_profile [--tasks 200 --batches 4 --rounds 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import RESULTS, write_result
from bench.spark_pipeline import load_note
from bench.spark_tasks import PER_BATCH, SINKS, bench_setup, run
from semel.spark.trace import TRACE_ENV

# Run in a fresh interpreter: the worker modules a Spark Python worker has loaded before a
# writer's task arrives, with pyarrow (an Arrow writer's task reads its input with it, and
# it brings NumPy), then semel's sink module (what unpickling its writer imports).
_IMPORT = """
import sys, time, pyspark.worker, pyspark.sql.datasource, pyarrow
from pyspark.sql.pandas.serializers import ArrowStreamSerializer
t = time.perf_counter()
import semel.spark.sink
print(round((time.perf_counter() - t) * 1000, 2), sum(m.split(".")[0] == "kafka" for m in sys.modules))
"""
_UNPICKLE = """
import pickle, time
from pyspark import cloudpickle
from semel.spark.sink import SemelStreamWriter, parse_options
from semel.spark.decision import BatchPlan
o = parse_options({"kafka.bootstrap.servers": "localhost:9092", "topic": "t", "checkpointLocation": "/ck/q"})
data = cloudpickle.dumps(SemelStreamWriter(o, {"key": 0, "value": 1}, BatchPlan(7, {("in", 0): 400, ("in", 1): 400})))
n = 2000
t = time.perf_counter()
for _ in range(n):
    pickle.loads(data)
print(round((time.perf_counter() - t) * 1000 / n, 4), len(data))
"""


def fresh(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=os.environ)
    return out.stdout.split()


def trace_profile(trace: Path, since: float) -> dict:
    """Per-phase medians of semel's write() and the workers that ran it, from the trace
    lines written after `since`."""
    writes = [d for d in map(json.loads, trace.read_text().splitlines())
              if d["start"] >= since and d["where"].startswith("write")] if trace.exists() else []
    phases = ("connect", "check_and_init", "input_and_produce", "recheck")
    per_pid: dict[int, int] = {}
    for d in writes:
        per_pid[d["pid"]] = per_pid.get(d["pid"], 0) + 1
    total = [(d["end"] - d["start"]) * 1000 for d in writes]
    waits = [d.get("input_wait_ms", 0.0) for d in writes]
    return {"tasks": len(writes), "tasks_with_rows": sum(1 for d in writes if d.get("rows")),
            "write_ms_p50": round(statistics.median(total), 2) if total else None,
            "write_ms_mean": round(statistics.mean(total), 2) if total else None,
            "input_wait_ms_mean": round(statistics.mean(waits), 2) if waits else None,
            # the Python thread's own CPU in write(): what is left of write() less the input
            # waits is the task waiting for the broker's answers (and for a core)
            "write_cpu_ms_mean": round(statistics.mean(cpu), 2) if (cpu := [d["cpu_ms"] for d in writes
                                                                           if "cpu_ms" in d]) else None,
            "phase_ms_p50": {p: round(statistics.median(v), 2) for p in phases
                             if (v := [d[p] for d in writes if p in d])},
            "phase_ms_mean": {p: round(statistics.mean(v), 2) for p in phases
                              if (v := [d[p] for d in writes if p in d])},
            "python_workers": len(per_pid), "worker_starts_seen": sum(1 for d in writes if d.get("call") == 1),
            "tasks_per_worker": sorted(per_pid.values(), reverse=True)}


def quiet_writes(bs: str, tasks: int) -> dict:
    """A task's write() (2 rows, as the profiled tasks) called in this process `tasks`
    times after Spark's batches, Spark idle: what its two round trips cost where the
    broker need not wait for a core behind Spark's JVM and Python workers."""
    import pyarrow as pa
    from semel.spark.branch_writer import ArrowInput, write_branch
    from semel.spark.decision import decision_partitions
    from semel.spark.sink import parse_options, probe
    traced = os.environ.pop(TRACE_ENV, None)   # not in the Spark tasks' trace
    try:
        o = probe(parse_options({"kafka.bootstrap.servers": bs, "topic": "tasks-out",
                                 "semel.query.id": "profile-quiet", "semel.atomicBatches": "true"}))
        rb = pa.record_batch([pa.array([b"1", b"2"]), pa.array([b"1", b"2"])], names=["key", "value"])
        parts = decision_partitions(o, {})
        wall, cpu = [], []
        for batch in (0, 1):   # batch 0 opens the connection and learns the routes
            for p in range(tasks):
                t, c = time.perf_counter(), time.thread_time()
                write_branch(o, {"key": 0, "value": 1}, ArrowInput(iter([rb])), batch, p, 0, parts=parts)
                if batch:
                    wall.append((time.perf_counter() - t) * 1000)
                    cpu.append((time.thread_time() - c) * 1000)
    finally:
        if traced is not None:
            os.environ[TRACE_ENV] = traced
    return {"tasks": tasks, "write_ms_p50": round(statistics.median(wall), 2),
            "write_ms_mean": round(statistics.mean(wall), 2), "cpu_ms_mean": round(statistics.mean(cpu), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    loads = {"start": os.getloadavg()}
    imports = [fresh(_IMPORT) for _ in range(3)]
    import_ms = [float(ms) for ms, _ in imports]
    unpickle_ms, pickled_bytes = fresh(_UNPICKLE)
    times: dict[str, list[int]] = {s: [] for s in SINKS}
    with bench_setup("semel-spark-profile-", a.batches) as (work, trace, bs, spark):
        since = time.time()
        for r in range(a.rounds):
            for sink in SINKS:
                ms = run(spark, bs, work, a.tasks, a.batches, sink, f"{sink}-{r}")
                times[sink] += ms[1:]
                print(f"{a.tasks} tasks {sink} round {r}: {ms} ms per batch", flush=True)
        loads["end"] = os.getloadavg()
        cores = spark.sparkContext.defaultParallelism
        quiet = quiet_writes(bs, a.tasks)
    p50 = {s: statistics.median(v) for s, v in times.items()}
    prof = trace_profile(trace, since)
    floor_task_ms = (p50["pynull"] - p50["noop"]) * cores / a.tasks
    per_worker = statistics.mean(prof["tasks_per_worker"]) if prof["tasks_per_worker"] else 1
    # write() less its waits for Spark's input (Spark's share of the task)
    own = {"write_ms": round((prof["write_ms_mean"] or 0.0) - (prof["input_wait_ms_mean"] or 0.0), 2), "unpickle_writer_ms": float(unpickle_ms),
           "imports_ms_per_task": round(statistics.median(import_ms) / per_worker, 3)}
    own_ms = sum(own.values())
    result = {
        "tasks": a.tasks, "per_batch_records": PER_BATCH, "cores": cores,
        "batch_ms_p50": p50, "batch_ms": times,
        "spark_python_task_floor_ms": round(floor_task_ms, 1),
        "semel_task": {**prof, "imports_ms_per_worker_start": import_ms,
                       "kafka_python_modules_imported": int(imports[0][1]),
                       "writer_pickled_bytes": int(pickled_bytes)},
        "semel_own_ms_per_task": {**own, "total": round(own_ms, 2)},
        "write_with_spark_idle": quiet,
        "semel_share_of_floor": round(own_ms / floor_task_ms, 3) if floor_task_ms > 0 else None,
        "target": {"max_share": 0.10, "met": floor_task_ms > 0 and own_ms / floor_task_ms <= 0.10},
        "notes": "per-task figures at --tasks tasks a batch; spark_python_task_floor_ms: (pynull - noop batch) x cores "
                 "/ tasks, what PySpark's runner costs a task slot per Python task; semel_own_ms_per_task: semel's "
                 "write() (mean over tasks, from the sink's trace), the unpickling of its writer and its imports "
                 "spread over the tasks a worker ran; the rest of a semel batch is Spark's.",
        "load": load_note(loads),
    }
    print(write_result(a.out, "spark_task_profile", result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
