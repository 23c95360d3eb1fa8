"""Produce throughput of a replicated topic: RF3 with acks=all against RF1 with acks=1.

One local cluster (etcd + three broker processes, semel.launch.local_cluster), two topics
created through CreateTopics: `rf3` (replication factor 3, min.insync.replicas 2)
and `rf1` (replication factor 1). The same confluent-kafka producer settings write
1 KiB records to one partition of each, alternating which goes first each round;
the ratio is of the medians of one run (with RF1 acks=all and RF3 acks=1 beside
them to split the gap). Target: RF3 acks=all at least
0.7 of RF1 acks=1. Every broker keeps its default flush policy (acks=all also waits
for the leader's fsync; acks=1 waits for nothing but the append).

    python -m bench.replication_bench [--quick] [--profile SECONDS] [--variant 'LABEL:BROKER ARGS']
                                      [--before DIR]

`--before DIR` also starts a cluster from the semel source tree at DIR (e.g. `git archive`
of an earlier commit) and runs all four cases on it in the same alternating rounds; the
results then hold its medians and this tree's over them (`before`, `after_over_before`).

Each broker's CPU seconds per 100 MB produced are in the results
(`broker_cpu_s_per_100mb`, leader first): on a box with few cores the ratio follows them.

`--profile S` also records S seconds of py-spy on each of the three brokers (the
leader and both followers of `rf3`) while RF3 acks=all records are produced, and
puts each one's top functions in the results ("profile").
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, load_fields, write_result
from bench.hotpath_bench import cpu_seconds, top_frames, tree_env
from bench.throughput_bench import produce

SIZE = 1024
TOPICS = {"rf3": (3, {"min.insync.replicas": "2"}), "rf1": (1, {})}
# (topic, acks): the two the target compares, then the two that split the gap into
# what replication costs (rf3 vs rf1 at acks=all) and what the leader's fsync costs.
CASES = [("rf3", "all"), ("rf1", "1"), ("rf1", "all"), ("rf3", "1")]


def _create_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, 1, rf, config=cfg) for name, (rf, cfg) in TOPICS.items()])
    for f in futures.values():
        f.result(30)


def _leaders_ready(cluster) -> None:
    from tests.support.cluster import partitions
    from tests.support.wait import until
    until(lambda: all(partitions(cluster, t)[0][0] >= 0 and len(partitions(cluster, t)[0][3]) == rf
                      for t, (rf, _) in TOPICS.items()), "leaders elected and ISRs full")


def _profile(cluster, seconds: int, count: int, tmp: Path) -> dict:
    """py-spy on every broker at once while RF3 acks=all records are produced; top frames
    per broker, labelled leader/follower by rf3's partition state."""
    from tests.support.cluster import partitions
    leader = partitions(cluster, "rf3")[0][0]
    spy_bin = str(Path(sys.executable).parent / "py-spy")
    tmp = tmp / "profile"     # inside the run's temporary directory: removed with it
    tmp.mkdir()
    spies = {n: subprocess.Popen([spy_bin, "record", "--pid", str(b.pid), "--duration", str(seconds),
                                  "--rate", "100", "--format", "raw", "-o", str(tmp / f"{n}.txt"), "--nonblocking"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for n, b in enumerate(cluster.brokers)}
    time.sleep(1.0)
    end = time.monotonic() + seconds - 2
    while time.monotonic() < end:
        produce(cluster.bootstrap, "rf3", 1, SIZE, count, {"acks": "all"})
    out = {}
    for n, spy in spies.items():
        spy.wait(seconds + 60)
        out[f"broker {n} ({'leader' if n == leader else 'follower'})"] = top_frames(tmp / f"{n}.txt", 20)
    return out


def _start(tmp: Path, name: str, broker_args: list[str], tree: Path | None = None):
    """A started cluster with both topics led and fully in sync; {topic: leader}.
    `tree`: run the brokers from that semel source tree (None: this one)."""
    from semel.launch.local_cluster import LocalCluster
    from tests.support.cluster import partitions, wait_brokers
    cluster = LocalCluster(tmp / name, 3, lease_ttl_s=6, broker_args=broker_args, env=tree_env(tree) or None)
    cluster.start()
    wait_brokers(cluster, {0, 1, 2})
    _create_topics(cluster.bootstrap)
    _leaders_ready(cluster)
    produce(cluster.bootstrap, "rf3", 1, SIZE, 1000, {"acks": "all"})   # warm-up: connections, caches
    produce(cluster.bootstrap, "rf1", 1, SIZE, 1000, {"acks": "1"})
    return cluster, {t: partitions(cluster, t)[0][0] for t in TOPICS}


def _measure(cluster, leaders: dict, label: str, topic: str, acks: str, r: int, count: int) -> dict:
    before = [cpu_seconds(b.pid) for b in cluster.brokers]
    client_before = time.process_time()      # the producer runs here (librdkafka's threads)
    elapsed = produce(cluster.bootstrap, topic, 1, SIZE, count, {"acks": acks})
    client_cpu = time.process_time() - client_before
    cpu = [round(cpu_seconds(b.pid) - c, 2) for b, c in zip(cluster.brokers, before)]
    row = {"cluster": label, "round": r, "topic": topic, "replication_factor": TOPICS[topic][0], "acks": acks,
           "records": count, "seconds": round(elapsed, 3), "load_average_1m": round(os.getloadavg()[0], 2),
           # CPU seconds of each broker process (leader first) during the run
           "broker_cpu_s": [cpu[leaders[topic]]] + [x for n, x in enumerate(cpu) if n != leaders[topic]],
           "client_cpu_s": round(client_cpu, 2),
           "mb_per_s": round(count * SIZE / elapsed / 1e6, 2)}
    print(row, flush=True)
    return row


def _summary(rows: list[dict]) -> tuple[dict, dict]:
    """Median MB/s per case, and each broker's CPU seconds per 100 MB produced (leader first):
    the per-broker median over the rounds, what the three together take, and the producer's."""
    med = {f"{t}_acks_{a}": statistics.median(x["mb_per_s"] for x in rows if (x["topic"], x["acks"]) == (t, a))
           for t, a in CASES}
    cpu = {}
    for t, a in CASES:
        per = [[x * 1e8 / (r["records"] * SIZE) for x in r["broker_cpu_s"]]
               for r in rows if (r["topic"], r["acks"]) == (t, a)]
        client = [r["client_cpu_s"] * 1e8 / (r["records"] * SIZE) for r in rows if (r["topic"], r["acks"]) == (t, a)]
        cpu[f"{t}_acks_{a}"] = {"per_broker": [round(statistics.median(col), 3) for col in zip(*per)],
                                "all_brokers": round(statistics.median(sum(p) for p in per), 3),
                                "client": round(statistics.median(client), 3)}
    return med, cpu


def _before_fields(rows: list[dict], tree: Path, med: dict, cpu: dict) -> dict:
    """The 'before' cluster's medians beside this tree's, and this tree over it."""
    bmed, bcpu = _summary(rows)
    return {"before": {"tree": str(tree), "median_mb_per_s": bmed,
                       "ratio_rf3_acks_all_to_rf1_acks_1": round(bmed["rf3_acks_all"] / bmed["rf1_acks_1"], 3),
                       "broker_cpu_s_per_100mb": bcpu},
            "after_over_before": {
                **{f"mb_per_s_{k}": _ratio(med[k], bmed[k]) for k in med},
                **{f"all_brokers_cpu_per_100mb_{k}": _ratio(cpu[k]["all_brokers"], bcpu[k]["all_brokers"])
                   for k in cpu}}}


def _ratio(a: float, b: float) -> float | None:
    """a / b, None where b rounds to nothing (a --quick run's CPU is below the clock's tick)."""
    return round(a / b, 3) if b else None


def run(out_dir: Path = RESULTS, quick: bool = False, profile_s: int = 0, variants: list[str] = (),
        before: Path | None = None, records: int | None = None, rounds: int | None = None) -> dict:
    """`variants`: 'LABEL:BROKER ARGS' clusters (e.g. 'no fsync:--flush-mode never') whose RF3
    acks=all and RF1 acks=1 cases run in the same rounds as the default cluster's. `before`: a
    semel source tree (e.g. `git archive` of an earlier commit) whose cluster runs all four
    cases in the same rounds, labelled 'before'."""
    count = records or (5_000 if quick else 100_000)
    rounds = rounds or (1 if quick else 5)
    rows = []
    prof = None
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="semel-replication-") as tmp:
        clusters = {}
        try:
            clusters["default"] = _start(Path(tmp), "default", [])
            if before:
                clusters["before"] = _start(Path(tmp), "before", [], before)
            for k, spec in enumerate(variants):
                label, _, args = spec.partition(":")
                clusters[label] = _start(Path(tmp), f"variant{k}", args.split())
            for r in range(rounds):
                order = [(label, t, a) for label in ("default", "before") if label in clusters for t, a in CASES] + [
                    (label, t, a) for label in clusters if label not in ("default", "before") for t, a in CASES[:2]]
                for label, topic, acks in (order if r % 2 == 0 else list(reversed(order))):
                    rows.append(_measure(*clusters[label], label, topic, acks, r, count))
            if profile_s:
                prof = _profile(clusters["default"][0], profile_s, count, Path(tmp))
        finally:
            for cluster, _ in clusters.values():
                cluster.stop()
                cluster.close()
    variant_medians = {}
    for label in clusters:
        if label not in ("default", "before"):
            m = {f"{t}_acks_{a}": statistics.median(x["mb_per_s"] for x in rows if x["cluster"] == label
                                                    and (x["topic"], x["acks"]) == (t, a)) for t, a in CASES[:2]}
            variant_medians[label] = {**m, "ratio": round(m["rf3_acks_all"] / m["rf1_acks_1"], 3)}
    rows_all, rows = rows, [x for x in rows if x["cluster"] == "default"]
    med, cpu = _summary(rows)
    ratio = round(med["rf3_acks_all"] / med["rf1_acks_1"], 3)
    result = {
        "what": "produce MB/s, 1 KiB records, one partition, confluent-kafka; RF3 acks=all vs RF1 acks=1",
        "cluster": "etcd + 3 semel broker processes on this machine (semel.launch.local_cluster)",
        "settings": {"record_bytes": SIZE, "records_per_run": count, "rounds": rounds, "quick": quick,
                     "rf3_topic": "min.insync.replicas=2", "flush_mode": "always (leader fsync before acks=all)"},
        "median_mb_per_s": med,
        "ratio_rf3_acks_all_to_rf1_acks_1": ratio, "target": 0.7, "target_met": ratio >= 0.7,
        "ratio_rf3_to_rf1_both_acks_all": round(med["rf3_acks_all"] / med["rf1_acks_all"], 3),
        "broker_cpu_s_per_100mb": cpu,
        "ratio_rf1_acks_all_to_acks_1": round(med["rf1_acks_all"] / med["rf1_acks_1"], 3),
        "machine_name": SHARED_BOX,
        "note": ("Three broker processes, etcd and the client share both cores, so the followers' work "
                 "competes with the leader's; ratios of medians from one run on this box. acks=all also waits "
                 "for the leader's fsync (semel's flush policy), which acks=1 never does: the rf1 acks=all row "
                 "shows that part of the gap, rf3 vs rf1 at acks=all the part replication adds."),
        **load_fields(load_start),
        **({"profile": prof} if prof else {}),
        **(_before_fields([x for x in rows_all if x["cluster"] == "before"], before, med, cpu) if before else {}),
        **({"variants": {spec.partition(":")[0]: spec.partition(":")[2] for spec in variants},
            "variant_median_mb_per_s": variant_medians} if variants else {}),
        "rows": rows_all,
    }
    write_result(out_dir, "replication", result)
    print(f"medians {med}, RF3 acks=all / RF1 acks=1 = {ratio}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    ap.add_argument("--profile", type=int, default=0, metavar="SECONDS",
                    help="also py-spy every broker for this long during RF3 acks=all produce")
    ap.add_argument("--variant", action="append", default=[], metavar="'LABEL:BROKER ARGS'",
                    help="also a cluster with these broker flags, its two target cases in the same rounds")
    ap.add_argument("--before", type=Path, default=None, metavar="DIR",
                    help="also a cluster running the semel source tree at DIR, all cases in the same rounds")
    ap.add_argument("--records", type=int, default=None, help="records per case and round (default 100,000)")
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (default 5)")
    a = ap.parse_args()
    run(a.out, a.quick, a.profile, a.variant, a.before, a.records, a.rounds)
