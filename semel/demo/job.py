"""The demo's Spark processor: numbers from demo-input, doubled, written exactly once
to demo-output (the `format("semel")` sink), to a PostgreSQL table and to a
filesystem directory (eos two-phase-commit sinks through semel.spark.foreach).

    python -m semel.demo.job --bootstrap HOST:PORT --work DIR --postgres URL

It runs as its own process group so the demo can SIGKILL it (driver, JVM and
Python workers together) at any moment and start it again: both queries resume
from their checkpoints under DIR. It stops cleanly when DIR/stop appears.

The same file runs unchanged on a Spark standalone cluster: `--master
spark://HOST:PORT`. Only the driver reads and writes DIR (the checkpoints, and the
filesystem sink's files through foreachBatch): the workers need not see it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

INPUT, OUTPUT, TABLE = "demo-input", "demo-output", "demo_output"
POLL_S = 0.5


def doubled(spark, bootstrap: str, max_per_trigger: int):
    """demo-input -> (key, value * 2) as strings: the whole transform."""
    src = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", INPUT).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(max_per_trigger)).load())
    return src.selectExpr("cast(key as string) as key",
                          "cast(cast(cast(value as string) as bigint) * 2 as string) as value")


# Spark (semel.spark) and PostgreSQL (psycopg) are imported inside the functions that
# use them: the demo's driver (run.py, verify.py) imports this module for its names.


def external_sinks(work: Path, postgres: str):
    from semel.eos.sinks.filesystem import FileSystemSink
    from semel.eos.sinks.postgres import PostgresSink
    # Table mode works on any PostgreSQL (no max_prepared_transactions needed);
    # readers see rows WHERE NOT pending.
    return [PostgresSink(postgres, TABLE, ["k", "v"], mode="table"), FileSystemSink(work / "files")]


def batch_rows(df, _batch_id):
    rows = df.collect()
    return {"postgres": [(r.key, int(r.value)) for r in rows],
            "filesystem": [{"k": r.key, "v": int(r.value)} for r in rows]}


def start(spark, bootstrap: str, work: Path, postgres: str, max_per_trigger: int, trigger_s: float):
    """Both queries: Kafka output through the semel sink, external sinks through foreachBatch."""
    from semel.spark.foreach import foreach_batch
    kafka_ck, ext_ck = str(work / "ck" / "kafka"), str(work / "ck" / "external")
    trigger = f"{trigger_s} seconds"
    q1 = (doubled(spark, bootstrap, max_per_trigger).writeStream.format("semel")
          .option("kafka.bootstrap.servers", bootstrap).option("topic", OUTPUT)
          .option("checkpointLocation", kafka_ck).trigger(processingTime=trigger).start())
    fn = foreach_batch(batch_rows, sinks=external_sinks(work, postgres), bootstrap=bootstrap,
                       checkpoint=ext_ck)
    q2 = (doubled(spark, bootstrap, max_per_trigger).writeStream.foreachBatch(fn)
          .option("checkpointLocation", ext_ck).trigger(processingTime=trigger).start())
    return [q1, q2]


def session(master: str, work: Path):
    from semel.spark import local_session
    return local_session(master, "semel-demo", work / "spark-local", **{"spark.executor.memory": "1g"})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="semel.demo.job")
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--postgres", required=True)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--max-per-trigger", type=int, default=500)
    p.add_argument("--trigger-s", type=float, default=1.0)
    a = p.parse_args(argv)
    from semel.spark import hooks
    if os.environ.get(hooks.KILL_ENV) and not os.environ.get(hooks.KILL_PGID_ENV):
        # the sink's crash hook kills this whole group: driver, JVM and workers
        os.environ[hooks.KILL_PGID_ENV] = str(os.getpgid(0))
    spark = session(a.master, a.work)
    queries = start(spark, a.bootstrap, a.work, a.postgres, a.max_per_trigger, a.trigger_s)
    (a.work / "started").touch()
    stop = a.work / "stop"
    while not stop.exists():
        for q in queries:
            if q.exception() is not None:
                print(f"query failed: {q.exception()}", file=sys.stderr)
                return 1
        time.sleep(POLL_S)
    for q in queries:
        q.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
