"""Throughput against the number of broker processes on one machine.

For each count N in --processes (default 1,2: as far as a 2-core machine goes) one local
cluster is started through the cluster's own path (semel.launch.local_cluster.LocalCluster:
etcd, then N broker processes), and all of them stay up for the whole run. Every round
measures every cluster, alternating the order, on a topic of its own with replication
factor 1 and the same partition count, spread over its brokers by CreateTopics. Producers
are separate client processes (confluent-kafka, acks=all, idempotent, 1 KiB records,
bench.hotpath_bench's workers); consumers are as many processes, each reading its share
of the partitions to their high watermarks CONSUME_PASSES times. Per row: produce MB/s, consume records/s, and
each broker process's CPU (utime+stime from /proc/PID/stat) over the produce and the
consume, with the load average when the row was taken.

On a bigger machine the same command takes more counts:

    python -m bench.processes_bench [--quick] [--processes 1,2,4,8] [--partitions P] [--producers K]

Defaults: partitions = 2 x the largest count (at least 4), producers = consumers = the
largest count (at least 2).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, load_fields, write_result
from bench.hotpath_bench import cpu_seconds
from bench.hotpath_bench import produce as produce_in_processes

SIZE = 1024


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)


def _leaders(cluster, topic: str, partitions: int) -> dict[int, int]:
    """{partition: leader}, once every partition has one."""
    from tests.support.cluster import partitions as states
    from tests.support.wait import until
    return until(lambda: (st := states(cluster, topic)) and len(st) == partitions
                 and all(s[0] >= 0 for s in st.values()) and {p: s[0] for p, s in st.items()},
                 f"{topic}: a leader per partition", 60)


# Each consumer reads its partitions this many times: one pass of a round's records takes
# a fraction of a second, a few clock ticks of broker CPU (/proc counts in 10 ms ticks).
CONSUME_PASSES = 4


def _consume_worker(bootstrap, topic, parts, start_at, q):
    """One consumer process: reads `parts` from 0 to their high watermarks, CONSUME_PASSES
    times, each pass a new consumer timed from its assign: it has already connected and asked
    every partition's high watermark, and librdkafka prefetches, so timing from the first
    record would leave most of the reading out."""
    from confluent_kafka import Consumer, TopicPartition
    conf = {"bootstrap.servers": bootstrap, "group.id": "bench-processes", "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760}
    time.sleep(max(0.0, start_at - time.time()))
    busy, got, want = 0.0, 0, 0
    for _ in range(CONSUME_PASSES):
        c = Consumer(conf)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in parts}
        upto = got + sum(ends.values())
        want = upto
        t0, deadline = time.perf_counter(), time.time() + 300
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        while got < upto and time.time() < deadline:
            got += sum(1 for m in c.consume(num_messages=min(10000, upto - got), timeout=1.0) if not m.error())
        busy += time.perf_counter() - t0
        c.close()
    q.put((busy, got, want))


def consume_in_processes(bootstrap: str, topic: str, partitions: int, consumers: int) -> tuple[float, int]:
    """(seconds, records): consumer i reads partitions i, i + consumers, ...; all start together.
    The seconds are the longest consumer's reading time."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    start_at = time.time() + 3.0     # spawning, connecting and watermarks before the clock starts
    procs = [ctx.Process(target=_consume_worker,
                         args=(bootstrap, topic, list(range(i, partitions, consumers)), start_at, q))
             for i in range(consumers)]
    for pr in procs:
        pr.start()
    done = [q.get(timeout=600) for _ in procs]
    for pr in procs:
        pr.join(60)
    short = [d for d in done if d[1] < d[2]]
    if short:
        raise RuntimeError(f"consumers short of the end: {short}")
    return max(d[0] for d in done), sum(d[1] for d in done)


def measure(cluster, n: int, round_no: int, partitions: int, producers: int, per_producer: int) -> dict:
    topic = f"proc-{n}-r{round_no}"
    _create(cluster.bootstrap, topic, partitions)
    leaders = _leaders(cluster, topic, partitions)
    pids = [b.pid for b in cluster.brokers]
    c0 = [cpu_seconds(p) for p in pids]
    pt = produce_in_processes(cluster.bootstrap, topic, partitions, SIZE, producers, per_producer, False)
    c1 = [cpu_seconds(p) for p in pids]
    ct, read = consume_in_processes(cluster.bootstrap, topic, partitions, producers)
    c2 = [cpu_seconds(p) for p in pids]
    total = producers * per_producer
    row = {"processes": n, "round": round_no, "records": total, "partitions": partitions,
           "partitions_per_broker": [sum(1 for x in leaders.values() if x == b) for b in range(n)],
           "load_average_1m": round(os.getloadavg()[0], 2),
           "produce_mb_s": round(total * SIZE / pt / 1e6, 2), "produce_rec_s": round(total / pt),
           "consume_rec_s": round(read / ct), "consume_mb_s": round(read * SIZE / ct / 1e6, 2),
           # Per broker process: CPU seconds over the phase and the share of one core it used.
           "broker_cpu_s_produce": [round(b - a, 2) for a, b in zip(c0, c1)],
           "broker_cores_produce": [round((b - a) / pt, 2) for a, b in zip(c0, c1)],
           "broker_cpu_s_consume": [round(b - a, 2) for a, b in zip(c1, c2)],
           "broker_cores_consume": [round((b - a) / ct, 2) for a, b in zip(c1, c2)]}
    print(row, flush=True)
    return row


def summarise(rows: list[dict], counts: list[int]) -> dict:
    med = {}
    for n in counts:
        rs = [r for r in rows if r["processes"] == n]
        med[str(n)] = {k: statistics.median(r[k] for r in rs)
                       for k in ("produce_mb_s", "consume_rec_s", "load_average_1m")}
        med[str(n)]["broker_cores_produce_total"] = statistics.median(sum(r["broker_cores_produce"]) for r in rs)
        med[str(n)]["broker_cores_consume_total"] = statistics.median(sum(r["broker_cores_consume"]) for r in rs)
    base = med[str(counts[0])]
    scaling = {f"{n}_over_{counts[0]}": {"produce": round(med[str(n)]["produce_mb_s"] / base["produce_mb_s"], 2),
                                         "consume": round(med[str(n)]["consume_rec_s"] / base["consume_rec_s"], 2)}
               for n in counts[1:]}
    # Pairs from the same round: the ratio that does not depend on the load between rounds.
    per_round = []
    for r in sorted({x["round"] for x in rows}):
        by_n = {x["processes"]: x for x in rows if x["round"] == r}
        if counts[0] in by_n:
            per_round.append({f"{n}_over_{counts[0]}": round(by_n[n]["produce_mb_s"] / by_n[counts[0]]["produce_mb_s"], 2)
                              for n in counts[1:] if n in by_n})
    return {"median": med, "scaling_of_medians": scaling, "produce_ratio_per_round": per_round}


def run(out_dir: Path = RESULTS, quick: bool = False, counts: list[int] = (1, 2), partitions: int | None = None,
        producers: int | None = None, rounds: int | None = None, machine_name: str = SHARED_BOX) -> dict:
    from semel.launch.local_cluster import LocalCluster
    from tests.support.cluster import wait_brokers
    counts = sorted(counts)
    partitions = partitions or max(4, 2 * counts[-1])
    producers = producers or max(2, counts[-1])
    rounds = rounds or (1 if quick else 5)
    per_producer = (10_000 if quick else 120_000) // producers
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="semel-processes-") as tmp:
        clusters = {n: LocalCluster(Path(tmp) / f"n{n}", n, lease_ttl_s=6) for n in counts}
        try:
            for n, c in clusters.items():
                c.start()
                wait_brokers(c, set(range(n)))
            for r in range(rounds):
                for n in (counts if r % 2 == 0 else list(reversed(counts))):
                    rows.append(measure(clusters[n], n, r, partitions, producers, per_producer))
        finally:
            for c in clusters.values():
                c.stop()
                c.close()
    result = {
        "what": ("produce MB/s and consume records/s against the number of semel broker processes on one "
                 "machine; RF1, partitions spread over the brokers"),
        "cluster": "semel.launch.local_cluster.LocalCluster per count (etcd + N broker processes), all up for the run",
        "client": (f"{producers} confluent-kafka producer processes (acks=all, idempotent, linger.ms 5, "
                   f"{SIZE} B records, round-robin over every partition), then {producers} consumer processes "
                   f"each reading its share of the partitions {CONSUME_PASSES} times"),
        "settings": {"processes": counts, "partitions": partitions, "producers": producers,
                     "consumers": producers, "records_per_round": per_producer * producers, "rounds": rounds,
                     "quick": quick},
        "command": "python -m bench.processes_bench --processes " + ",".join(map(str, counts)),
        "machine_name": machine_name,
        **load_fields(load_start),
        **summarise(rows, counts),
        "note": ("Every count's cluster runs through the whole run and the order alternates per round, so "
                 "the counts see the same load. On a 2-core machine the brokers, etcd and the client "
                 "processes share both cores, so 1 vs 2 is as far as it goes here; run the same command "
                 "with --processes 1,2,4,8 on a machine with more cores. broker_cores_*: CPU seconds of "
                 "each broker process over the phase divided by the phase's seconds."),
        "rows": rows,
    }
    write_result(out_dir, "processes", result)
    print({k: result[k] for k in ("median", "scaling_of_medians", "produce_ratio_per_round")})
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    ap.add_argument("--processes", default="1,2", help="broker process counts, e.g. 1,2,4,8")
    ap.add_argument("--partitions", type=int, help="partitions per topic (default 2 x the largest count, >= 4)")
    ap.add_argument("--producers", type=int, help="producer (and consumer) processes (default the largest count, >= 2)")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--machine-name", default=SHARED_BOX)
    a = ap.parse_args()
    run(a.out, a.quick, [int(x) for x in a.processes.split(",")], a.partitions, a.producers, a.rounds,
        a.machine_name)


if __name__ == "__main__":
    main()
