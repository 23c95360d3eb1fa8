"""Spark pipeline benchmark: one run, results in bench/results/spark_pipeline.json.

In one local[2] SparkSession against one semel broker process:
- throughput of the demo transform (value * 2) over a preloaded topic, trigger availableNow,
  4 micro-batches of 50k rows by default (enough that per-query and per-batch fixed costs do
  not hide the per-row cost): exactly-once (format("semel") sink), at-least-once (foreachBatch:
  each task gets the same Arrow batches via mapInArrow and writes them with a plain
  idempotent confluent-kafka producer: no transaction, no decision), and the ceiling with the
  same input (semel source -> transform -> Spark's noop sink, same batch sizes);
- rate_noop: Spark's rate source -> the same transform -> noop (no Kafka), for the floor;
- latency: a producer paced at --latency-rate stamps each input with its ack time; a
  read_committed consumer of the output measures ack -> visible, p50/p99, while the
  exactly-once query runs with a --trigger-ms processing-time trigger (6000 records at 50/s:
  ~240 triggers, so p99 is a percentile, not the worst of a few dozen batches). The first
  WARMUP_BATCHES micro-batches (the query's start-up) are left out of the percentiles
  (`all` has every record). Every micro-batch's breakdown goes into the results: Spark's
  durationMs, the sink's phases (SEMEL_SPARK_SINK_TRACE: the slowest task's and commit()'s),
  when commit() started after the last task, when the reader saw the output after commit();
  `phases_ms` sums them up (p50/p99/max over the measured batches). The micro-batch floor
  is the trigger interval plus the median triggerExecution of the rate_noop query in the
  same run, past its first WARMUP_BATCHES batches too (the least a micro-batch pipeline can
  take to show a record);
- commit-cycle cost per batch: the median over the latency phase's batches of commit()'s time
  plus the slowest task's transaction round trips (cycle_cost); add_batch_eos_minus_alo_ms is
  the throughput queries' median addBatch difference (negative where exactly-once is faster).

    .venv/bin/python -m bench.spark_pipeline [--records 200000 --per-trigger 50000]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import RESULTS, write_result
from semel.demo.job import session
from semel.launch.process import SemelBroker
from semel.spark import trace as spark_trace

LATENCY_QUERY = "bench-latency"
# The first micro-batches of a query pay its start-up (planning, the Python source's process,
# first use of each worker): left out of the latency percentiles and, alike, of the floor.
WARMUP_BATCHES = 5
MIN_BATCHES = 100  # measured batches at least: p99 over batches, not the worst of a few
TRANSFORM = ("key", "cast(cast(cast(value as string) as bigint) * 2 as string) as value")


def preload(bootstrap: str, topic: str, n: int, partitions: int = 2) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the futures resolve
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for i in range(n):
        while True:
            try:
                p.produce(topic, key=str(i % 64).encode(), value=str(i).encode())
                break
            except BufferError:  # the client's queue is full: let deliveries drain it
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def source(spark, bootstrap, topic, per_trigger):
    return (spark.readStream.format("semel").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_trigger)).load()
            .selectExpr(*TRANSFORM))


def alo_writer(bootstrap: str, topic: str):
    """Each task gets the same Arrow batches the semel sink's tasks get (mapInArrow) and
    hands them to a plain idempotent producer: the same data path minus the transactions."""
    def write_partition(batches):
        import pyarrow as pa
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "queue.buffering.max.messages": 1_000_000})
        n = 0
        for rb in batches:
            keys = rb.column("key").to_pylist()
            values = rb.column("value").cast(pa.binary()).to_pylist()
            for k, v in zip(keys, values):
                while True:
                    try:
                        p.produce(topic, key=k, value=v)
                        break
                    except BufferError:
                        p.poll(0.01)
            n += rb.num_rows
        assert p.flush(60) == 0
        yield pa.record_batch([pa.array([n], pa.int64())], names=["n"])

    def batch(df, _batch_id):
        df.mapInArrow(write_partition, "n long").collect()
    return batch


def progress_stats(q) -> dict:
    ps = [p for p in q.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in ps)
    return {"batches": len(ps), "rows": rows,
            "add_batch_ms_p50": statistics.median(p["durationMs"].get("addBatch", 0) for p in ps) if ps else None,
            "trigger_ms": [p["durationMs"]["triggerExecution"] for p in ps],
            "trigger_ms_p50": statistics.median(p["durationMs"]["triggerExecution"] for p in ps) if ps else None}


def timed(q, n: int) -> dict:
    t0 = time.perf_counter()
    q.awaitTermination()
    secs = time.perf_counter() - t0
    st = progress_stats(q)
    busy_s = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress if p["numInputRows"] > 0) / 1000
    return {**st, "seconds": round(secs, 2), "rows_per_s": round(st["rows"] / secs, 1),
            "busy_rows_per_s": round(st["rows"] / busy_s, 1) if busy_s else None, "expected_rows": n}


def throughput(spark, bs, work, n, per_trigger, rounds: int) -> dict:
    preload(bs, "bench-in", n)
    preload(bs, "bench-warm", 2000)
    for name in ("bench-eos", "bench-alo", "bench-warm-out"):
        preload(bs, name, 0)
    # warm-up: the first query of a session pays JVM start-up and each writer's first use of
    # the Python workers (imports: pyarrow, the sink, the producers); no measured one should
    (source(spark, bs, "bench-in", per_trigger).writeStream.format("noop")
     .option("checkpointLocation", str(work / "ck-warm")).trigger(availableNow=True).start().awaitTermination())
    (source(spark, bs, "bench-warm", 1000).writeStream.format("semel").option("kafka.bootstrap.servers", bs)
     .option("topic", "bench-warm-out").option("checkpointLocation", str(work / "ck-warm-eos"))
     .trigger(availableNow=True).start().awaitTermination())
    (source(spark, bs, "bench-warm", 1000).writeStream.foreachBatch(alo_writer(bs, "bench-warm-out"))
     .option("checkpointLocation", str(work / "ck-warm-alo")).trigger(availableNow=True).start().awaitTermination())
    # Rounds interleave the three writers so that the load of a shared machine, which drifts
    # over a minute, weighs on each alike; each writer's median round is reported.
    runs: dict[str, list[dict]] = {"noop_same_input": [], "exactly_once": [], "at_least_once": []}
    for r in range(rounds):
        # the ceiling with the same input: semel source -> transform -> Spark's noop sink
        noop = (source(spark, bs, "bench-in", per_trigger).writeStream.format("noop")
                .option("checkpointLocation", str(work / f"ck-noop-same-{r}")).trigger(availableNow=True).start())
        runs["noop_same_input"].append(timed(noop, n))
        eos = (source(spark, bs, "bench-in", per_trigger).writeStream.format("semel")
               .option("kafka.bootstrap.servers", bs).option("topic", "bench-eos")
               .option("checkpointLocation", str(work / f"ck-eos-{r}")).trigger(availableNow=True).start())
        runs["exactly_once"].append(timed(eos, n))
        alo = (source(spark, bs, "bench-in", per_trigger).writeStream.foreachBatch(alo_writer(bs, "bench-alo"))
               .option("checkpointLocation", str(work / f"ck-alo-{r}")).trigger(availableNow=True).start())
        runs["at_least_once"].append(timed(alo, n))
    out = {name: median_run(rs) for name, rs in runs.items()}
    out["rounds_rows_per_s"] = {name: [r["rows_per_s"] for r in rs] for name, rs in runs.items()}
    return out


def median_run(runs: list[dict]) -> dict:
    """The run with the median rows/s (an odd number of rounds: a real run, not a mean)."""
    return sorted(runs, key=lambda r: r["rows_per_s"])[len(runs) // 2]


def rate_noop(spark, work, seconds: float, rate: int) -> dict:
    """Spark's rate source -> transform -> noop: no Kafka at all; its median micro-batch
    (past the first WARMUP_BATCHES, as the latency phase counts them) is the floor's second
    term (the least a small micro-batch takes here)."""
    q = (spark.readStream.format("rate").option("rowsPerSecond", str(rate)).load()
         .selectExpr("cast(value % 64 as string) as key", "cast(value as string) as value").selectExpr(*TRANSFORM)
         .writeStream.format("noop").option("checkpointLocation", str(work / "ck-noop")).start())
    time.sleep(seconds)  # the measured window itself
    q.stop()
    ps = [p for p in q.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in ps)
    busy_s = sum(p["durationMs"]["triggerExecution"] for p in ps) / 1000
    steady = [p["durationMs"]["triggerExecution"] for p in ps if p["batchId"] >= WARMUP_BATCHES]
    return {"rows": rows, "busy_seconds": round(busy_s, 2),
            "trigger_ms_p50": statistics.median(steady) if steady else 0,
            "trigger_ms_p50_all": statistics.median(p["durationMs"]["triggerExecution"] for p in ps) if ps else 0,
            "rows_per_s": round(rows / busy_s, 1) if busy_s else None, "offered_rows_per_s": rate}


def latency(spark, bs, work, n: int, rate: float, trigger_ms: int, trace: Path) -> dict:
    """ack -> visible under read_committed for n paced records, and a breakdown of every
    micro-batch (Spark's durationMs, the sink's own phases from `trace`, the records' latency).
    The percentiles count the records of batches WARMUP_BATCHES on (the query's start-up is
    not a steady-state micro-batch; the floor's median skips the same batches); `all` counts
    every record."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    preload(bs, "lat-in", 0)
    preload(bs, "lat-out", 0)
    acked: dict[str, tuple[float, int, int]] = {}  # output value -> (ack time, input partition, offset)
    visible: dict[str, float] = {}                # output value -> when the reader got it
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(10 * n))  # keep every batch's
    q = (source(spark, bs, "lat-in", 100000).writeStream.format("semel").option("kafka.bootstrap.servers", bs)
         .option("topic", "lat-out").option("checkpointLocation", str(work / "ck-lat"))
         .option("semel.query.id", LATENCY_QUERY)  # names its lines in the sink's trace
         .trigger(processingTime=f"{trigger_ms} milliseconds").start())
    c = Consumer({"bootstrap.servers": bs, "group.id": "bench-lat", "isolation.level": "read_committed",
                  "enable.auto.commit": False})
    c.assign([TopicPartition("lat-out", p, 0) for p in range(2)])

    enough = threading.Event()  # the query has run past WARMUP_BATCHES + MIN_BATCHES
    fed = [0]

    def feed():
        # at least n records, and on until enough batches ran (a busy box runs fewer a
        # second), at most 3 n
        p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 0})
        t0 = time.monotonic()
        i = 0
        while i < n or (not enough.is_set() and i < 3 * n):
            def ack(err, m, v=str(2 * i)):
                if err is None:
                    acked[v] = (time.time(), m.partition(), m.offset())
            p.produce("lat-in", key=str(i % 64).encode(), value=str(i).encode(), on_delivery=ack)
            i += 1
            # pacing the offered load; poll() serves each ack as it arrives (a sleep here
            # would stamp it up to one interval late, understating the latency)
            while (delay := t0 + i / rate - time.monotonic()) > 0:
                p.poll(delay)
        p.flush(60)
        fed[0] = i
    t = threading.Thread(target=feed)
    t.start()
    deadline = time.monotonic() + 3 * n / rate + 120
    looked = 0.0
    while (t.is_alive() or len(visible) < fed[0]) and time.monotonic() < deadline:
        # poll() hands over each record as soon as it is fetched; consume(k, t) would hold
        # a partial batch until t passed, adding up to t to every latency
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            visible.setdefault(m.value().decode(), time.time())
        if time.monotonic() - looked > 1:
            looked = time.monotonic()
            last = q.lastProgress
            if last is not None and last["batchId"] >= WARMUP_BATCHES + MIN_BATCHES:
                enough.set()
    enough.set()
    t.join()
    c.close()
    q.stop()
    batches = batch_breakdown([json.loads(p.json) for p in q.recentProgress], acked, visible, trace)
    steady = [v for b in batches if b["batch"] >= WARMUP_BATCHES for v in b.pop("values")]
    for b in batches:
        b.pop("values", None)
    lat = lambda vs: sorted(visible[v] - acked[v][0] for v in vs if v in visible and v in acked)  # noqa: E731
    measured = [b for b in batches if b["batch"] >= WARMUP_BATCHES]
    return {"records": fed[0], "seen": len(visible), "offered_rows_per_s": rate, "trigger_ms": trigger_ms,
            "warmup_batches": WARMUP_BATCHES, "records_measured": len(steady), "batches_measured": len(measured),
            **percentiles(lat(steady)), "all": percentiles(lat(acked)),
            "phases_ms": phase_summary(measured), "batches": batches}


def percentiles(lat: list[float]) -> dict:
    """p50/p99/max in ms of sorted latencies in seconds (the p-th value, no interpolation)."""
    if not lat:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    pick = lambda f: round(lat[min(len(lat) - 1, int(f * len(lat)))] * 1000, 1)  # noqa: E731
    return {"p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(lat[-1] * 1000, 1)}


def batch_breakdown(progress: list[dict], acked: dict, visible: dict, trace: Path) -> list[dict]:
    """One entry per micro-batch that read rows: Spark's durationMs, the sink's phases (the
    slowest task's and commit()'s, in ms), when commit() started after the last task ended,
    when the reader first saw the batch's output after commit() returned, and the batch's
    records' latency (each record assigned to its batch by its input offset)."""
    sink = sink_phases(trace)
    out = []
    for p in progress:
        if not p["numInputRows"]:
            continue
        src = p["sources"][0]
        lo, hi = (offsets_of(src[k]) for k in ("startOffset", "endOffset"))
        mine = [v for v, (_, part, off) in acked.items() if v in visible and lo.get(part, 0) <= off < hi.get(part, 0)]
        entry = {"batch": p["batchId"], "values": mine, "rows": p["numInputRows"], "durationMs": p["durationMs"],
                 "latency_max_ms": round(max(visible[v] - acked[v][0] for v in mine) * 1000, 1) if mine else None}
        phases = sink.pop(p["batchId"], {})
        end = phases.pop("commit_end", None)
        if mine and end is not None:
            entry["visible_after_commit_ms"] = round((min(visible[v] for v in mine) - end) * 1000, 1)
        entry.update(phases)
        out.append(entry)
    return out


def phase_summary(batches: list[dict]) -> dict:
    """p50 / p99 / max over the batches of each phase: Spark's durationMs, the slowest task's
    and commit()'s sink phases, and the batch's records' worst latency."""
    series: dict[str, list[float]] = {}
    for b in batches:
        for k, v in b["durationMs"].items():
            series.setdefault(f"spark.{k}", []).append(v)
        for k, v in b.get("task_max_ms", {}).items():
            series.setdefault(f"task.{k}", []).append(v)
        for k, v in b.get("commit_ms", {}).items():
            series.setdefault(f"commit.{k}", []).append(v)
        for k in ("commit_start_after_tasks_ms", "visible_after_commit_ms", "latency_max_ms"):
            if b.get(k) is not None:
                series.setdefault(k, []).append(b[k])
    out = {}
    for k, vs in sorted(series.items()):
        vs.sort()
        out[k] = {"p50": vs[len(vs) // 2], "p99": vs[min(len(vs) - 1, int(0.99 * len(vs)))], "max": vs[-1]}
    return out


# The slowest task's transaction round trips (not its rows): decided yet + InitProducerId,
# and the re-check when it went on its own.
TASK_TXN_PHASES = ("check_and_init", "recheck")


def cycle_cost(batches: list[dict]) -> float | None:
    """What the exactly-once cycle adds to a micro-batch's critical path, median over the
    latency phase's measured batches: commit() from start to end (every phase) plus the
    slowest task's transaction round trips. Rows written are not counted: at-least-once
    writes them too."""
    costs = sorted(sum(b["commit_ms"].values()) + sum(b.get("task_max_ms", {}).get(k, 0) for k in TASK_TXN_PHASES)
                   for b in batches if b["batch"] >= WARMUP_BATCHES and "commit_ms" in b)
    return round(costs[len(costs) // 2], 1) if costs else None


def offsets_of(doc) -> dict[int, int]:
    doc = json.loads(doc) if isinstance(doc, str) else (doc or {})
    return {int(part): off for parts in doc.values() for part, off in parts.items()}


def sink_phases(trace: Path) -> dict[int, dict]:
    """batch -> the sink's phases, from the lines the sink wrote to `trace` (SEMEL_SPARK_SINK_TRACE)
    for the latency query (its checkpoint's group)."""
    lines = [json.loads(x) for x in trace.read_text().splitlines()] if trace.exists() else []
    lines = [d for d in lines if d["query"] == LATENCY_QUERY]
    out: dict[int, dict] = {}
    for b in sorted({d["batch"] for d in lines}):
        tasks = [d for d in lines if d["batch"] == b and d["where"].startswith("write")]
        commit = next((d for d in lines if d["batch"] == b and d["where"] == "commit"), None)
        skip = {"query", "where", "batch", "pid", "start", "end", "rows", "branches"}
        entry: dict = {"tasks": len(tasks)}
        if tasks:
            entry["task_max_ms"] = {k: max(d.get(k, 0) for d in tasks) for k in tasks[0] if k not in skip}
        if commit:
            entry["commit_ms"] = {k: v for k, v in commit.items() if k not in skip}
            entry["commit_end"] = commit["end"]
            if tasks:
                entry["commit_start_after_tasks_ms"] = round((commit["start"] - max(d["end"] for d in tasks)) * 1000, 1)
        out[b] = entry
    return out


LATENCY_NOTE = ("latency: p50/p99/max over the records of batches WARMUP_BATCHES on (all: every record); "
                "batches: each micro-batch's durationMs, its sink phases (task_max_ms: the slowest task's, "
                "commit_ms: commit()'s, ms per phase), commit_start_after_tasks_ms (Spark handing the "
                "messages to its commit worker), visible_after_commit_ms (the reader's first record of the "
                "batch after commit() returned; negative: seen before the answer reached the worker); "
                "phases_ms: p50/p99/max of each over the measured batches")


def load_note(loads: dict) -> str:
    """How busy the shared box was: the figures only compare within this run."""
    one = [v[0] for v in loads.values()]
    cpus = os.cpu_count() or 1
    how = "quiet" if max(one) <= cpus else f"up to {max(one) / cpus:.1f} runnable processes per core"
    return (f"1-minute load average {min(one):.1f} to {max(one):.1f} on {cpus} cores at the phase boundaries "
            f"({how}; other work shared the cores: Spark's fixed per-batch costs grow with it)")


def headline(doc: dict) -> dict:
    """The figures a before/after comparison of two runs needs."""
    tp = doc["throughput"]
    return {"when": doc.get("when"), "targets": doc["targets"], "micro_batch_floor_ms": doc["micro_batch_floor_ms"],
            "latency_p99_ms": doc["latency"]["p99_ms"],
            "rows_per_s": {k: tp[k]["rows_per_s"] for k in ("noop_same_input", "exactly_once", "at_least_once")},
            "rounds_rows_per_s": tp["rounds_rows_per_s"], "load": doc.get("load")}


def pin(broker_pid: int) -> dict:
    """The broker on the last core, this process on the others before Spark starts: the
    JVM that PySpark launches and the Python workers it forks inherit that set."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin-broker needs at least 2 cores")
    os.sched_setaffinity(broker_pid, {cores[-1]})
    os.sched_setaffinity(0, set(cores[:-1]))
    return {"broker": [cores[-1]], "spark": cores[:-1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    # sized so that per-query and per-batch fixed costs do not dominate: 4 batches of 50k
    ap.add_argument("--records", type=int, default=200000)
    ap.add_argument("--per-trigger", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the three writers (odd)")
    # ~240 triggers of 500 ms: a p99 over hundreds of batches, not the worst of a few dozen
    ap.add_argument("--latency-records", type=int, default=6000)
    ap.add_argument("--latency-rate", type=float, default=50)
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--pin-broker", action="store_true",
                    help="give the broker the last CPU core and Spark (driver, JVM, Python workers) the others, "
                         "so the ratios say what the sink costs rather than what a broker sharing Spark's "
                         "cores costs (needs 2 cores or more)")
    ap.add_argument("--before", type=Path, default=None,
                    help="a results file of this bench from the tree before a change: its headline figures "
                         "go into this run's results beside this run's")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="semel-spark-bench-"))
    trace = work / "sink-trace.jsonl"
    os.environ[spark_trace.TRACE_ENV] = str(trace)  # before the session: its Python workers inherit it
    loads = {"start": os.getloadavg()}
    with SemelBroker(work / "data", log_path=work / "broker.log") as broker:
        cores = pin(broker.pid) if a.pin_broker else None
        spark = session("local[2]", work)  # the demo job's session settings
        tp = throughput(spark, broker.bootstrap, work, a.records, a.per_trigger, a.rounds | 1)
        loads["after_throughput"] = os.getloadavg()
        ceil = rate_noop(spark, work, 20, 100000)
        loads["after_floor"] = os.getloadavg()
        lat = latency(spark, broker.bootstrap, work, a.latency_records, a.latency_rate, a.trigger_ms, trace)
        loads["after_latency"] = os.getloadavg()
        spark.stop()
    eos, alo, same = tp["exactly_once"], tp["at_least_once"], tp["noop_same_input"]
    # the least time a micro-batch pipeline here needs to show a record: one trigger interval
    # plus the median micro-batch of the transform into the noop sink
    floor_ms = a.trigger_ms + ceil["trigger_ms_p50"]
    result = {
        "throughput": tp, "rate_noop": ceil, "latency": lat,
        "micro_batch_floor_ms": floor_ms,
        "load_average_1_5_15": {k: [round(x, 2) for x in v] for k, v in loads.items()},
        "notes": "rows_per_s: wall time of an availableNow query after a warm-up query (includes query start-up "
                 "and, for exactly-once, the sink's broker probe); busy_rows_per_s: rows over the summed "
                 "micro-batch times. The ceiling is noop_same_input (the same topic, source, transform and "
                 "batch sizes into Spark's noop sink); at-least-once gets the same Arrow batches per task "
                 "(mapInArrow) and a plain idempotent confluent-kafka producer; rate_noop (no Kafka) only "
                 "gives the latency floor's micro-batch term. Each writer's figures are its median of "
                 f"{a.rounds | 1} rounds run interleaved (noop, exactly-once, at-least-once, repeated; "
                 "rounds_rows_per_s lists every round), and the ratios are of those medians. " + LATENCY_NOTE,
        "load": load_note(loads),
        "cores": cores or "shared: the broker, Spark's JVM and its Python workers on every core",
        "commit_cycle_cost_ms_per_batch": cycle_cost(lat["batches"]),
        "add_batch_eos_minus_alo_ms": (eos["add_batch_ms_p50"] - alo["add_batch_ms_p50"])
        if eos["add_batch_ms_p50"] is not None and alo["add_batch_ms_p50"] is not None else None,
        "targets": {
            "eos_vs_alo": round(eos["rows_per_s"] / alo["rows_per_s"], 3), "eos_vs_alo_target": 0.9,
            "eos_vs_ceiling": round(eos["rows_per_s"] / same["rows_per_s"], 3),
            "eos_vs_ceiling_target": 0.9,
            "p99_vs_floor": round(lat["p99_ms"] / floor_ms, 2) if lat["p99_ms"] else None, "p99_vs_floor_target": 1.5},
    }
    if a.before is not None:
        result["before"] = headline(json.loads(a.before.read_text()))
        result["after"] = headline(result)
    path = write_result(a.out, "spark_pipeline", result)
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
