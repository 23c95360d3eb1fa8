"""A stateful query at Spark's default shape, in update mode: results in
bench/results/spark_update.json.

The canonical Spark + Kafka job: a windowed count per key with a watermark (3,000
records, 300 keys, 400 records a micro-batch), written in update mode through
foreachBatch(write_each_batch(...)) exactly once, against the same query into Spark's
noop sink, at 200 (Spark's default) and 2,000 shuffle partitions. write_each_batch
writes each batch from the executors' cores (2 Python tasks on local[2]), not from one
per shuffle partition; `uncoalesced` (at 200 only) writes from one Python task per
shuffle partition (semel.write.tasks = the partitions), what a foreachBatch writer
that keeps Spark's partitioning pays. One local[2] SparkSession and one semel broker
process; queries alternate, the median micro-batch time (triggerExecution) past each
query's first batch.

    .venv/bin/python -m bench.spark_update [--partitions 200,2000 --rounds 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, write_result
from bench.spark_pipeline import load_note

from semel.demo.job import session
from semel.launch.process import SemelBroker
from semel.spark.each_batch import write_each_batch

RECORDS, KEYS, PER_BATCH = 3000, 300, 400
TARGETS = {"200": 1.5, "2000": 2.0}


def preload(bs: str, topic: str) -> None:
    """RECORDS events over 2 partitions: key i % KEYS, event time i // 10 seconds (in order,
    none late for the watermark)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bs})
    for topic_name in (topic, topic + "-out"):
        for f in admin.create_topics([NewTopic(topic_name, 2, 1)]).values():
            f.result(30)
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 20})
    for i in range(RECORDS):
        p.produce(topic, key=f"k{i % KEYS}".encode(), value=str(i // 10).encode(), partition=i % 2)
    assert p.flush(60) == 0


def windowed_counts(spark, bs: str, topic: str):
    from pyspark.sql.functions import window
    df = (spark.readStream.format("semel").option("kafka.bootstrap.servers", bs).option("subscribe", topic)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(PER_BATCH)).load())
    ev = df.selectExpr("CAST(key AS STRING) AS k", "timestamp_seconds(CAST(CAST(value AS STRING) AS BIGINT)) AS ts")
    counts = ev.withWatermark("ts", "30 seconds").groupBy(window("ts", "10 seconds"), "k").count()
    return counts.selectExpr("k AS key", "concat(CAST(unix_timestamp(window.start) AS STRING), ':', "
                             "CAST(count AS STRING)) AS value")


def run(spark, bs: str, work: Path, partitions: int, sink: str, tag: str) -> list[int]:
    ck = str(work / f"ck-{tag}")
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))  # fixed in the checkpoint at its first batch
    w = windowed_counts(spark, bs, "upd-in").writeStream.outputMode("update").option("checkpointLocation", ck)
    if sink == "noop":
        w = w.format("noop")
    else:
        opts = {"kafka.bootstrap.servers": bs, "topic": "upd-in-out", "checkpointLocation": ck}
        if sink == "uncoalesced":
            opts["semel.write.tasks"] = str(partitions)
        w = w.foreachBatch(write_each_batch(opts))
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    assert q.exception() is None, q.exception()
    got = [p["durationMs"]["triggerExecution"] for p in q.recentProgress if p["numInputRows"] > 0]
    assert len(got) == -(-RECORDS // PER_BATCH), got
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", default="200,2000")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--uncoalesced", action=argparse.BooleanOptionalAction, default=True,
                    help="also one round of one Python task per shuffle partition, at 200")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="semel-spark-update-"))
    loads = {"start": os.getloadavg()}
    rows: dict[str, dict] = {}
    with SemelBroker(work / "data", log_path=work / "broker.log") as broker:
        bs = broker.bootstrap
        spark = session("local[2]", work)
        preload(bs, "upd-in")
        run(spark, bs, work, 2, "noop", "warm")            # JVM and Python workers warm
        run(spark, bs, work, 2, "each_batch", "warm-each")
        for n in (int(x) for x in a.partitions.split(",")):
            sinks = ["noop", "each_batch"]
            times: dict[str, list[int]] = {s: [] for s in sinks + ["uncoalesced"]}
            for r in range(a.rounds):
                for sink in sinks + (["uncoalesced"] if a.uncoalesced and n <= 200 and r == 0 else []):
                    t0 = time.perf_counter()
                    ms = run(spark, bs, work, n, sink, f"{sink}-{n}-{r}")
                    times[sink] += ms[1:]    # the first batch pays the query's start-up
                    print(f"{n} partitions {sink} round {r}: {ms} ms per batch ({time.perf_counter() - t0:.1f} s)",
                          flush=True)
            p50 = {s: statistics.median(v) for s, v in times.items() if v}
            rows[str(n)] = {**{f"{s}_batch_ms_p50": v for s, v in p50.items()},
                            "ratio": round(p50["each_batch"] / p50["noop"], 3),
                            **({"uncoalesced_ratio": round(p50["uncoalesced"] / p50["noop"], 3)}
                               if "uncoalesced" in p50 else {}),
                            **{f"{s}_batch_ms": v for s, v in times.items() if v}}
            loads[f"after_{n}"] = os.getloadavg()
        spark.stop()
    result = {
        "records": RECORDS, "keys": KEYS, "per_batch_records": PER_BATCH,
        "write_tasks": "the executors' cores: 2 (local[2])", "partitions": rows,
        "targets": {k: {"max_ratio": t, "met": rows[k]["ratio"] <= t} for k, t in TARGETS.items() if k in rows},
        "notes": "windowed count per key with a watermark, update mode; median micro-batch time (triggerExecution) "
                 "past each query's first batch; ratio: write_each_batch / Spark's noop sink, the same query and "
                 "shuffle partitions, measured alternately in this run; uncoalesced: write_each_batch with "
                 "semel.write.tasks = the shuffle partitions (one Python task per partition).",
        "load": load_note(loads),
    }
    print(write_result(a.out, "spark_update", result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
