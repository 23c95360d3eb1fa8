"""CPU seconds per GB of each process role while a replicated topic is produced to, for
two source trees side by side (this one and an earlier one, each with its own .venv).

Each round starts a fresh local cluster from one tree (bench.replication_bench's
cluster: etcd + three brokers, topics `rf3` and `rf1`), produces the same 1 KiB
records in the four cases (RF3/RF1 x acks all/1, order reversed every other round)
and appends one row per case to a JSON-lines file; the trees take turns round by
round. `--summarize` turns the rows into medians per role (leader, each follower,
all brokers, the producer) and the replication ratios, and adds py-spy flame summaries
(top frames, made with `--profile`) of both trees.

    python -m bench.replication_cpu --round 0 --tree new --rows rows.jsonl     (once per tree and round)
    python -m bench.replication_cpu --profile DIR                              (native py-spy, RF3 acks=all)
    python -m bench.replication_cpu --summarize rows.jsonl --before DIR --after DIR

CPU is read from /proc (clock ticks of 10 ms): use enough records per case that a
follower's share is many ticks (300 000 records, 0.3 GB, by default).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, write_result
from bench.hotpath_bench import top_frames
from bench.replication_bench import SIZE, _measure, _start
from bench.throughput_bench import produce

CASES = [("rf3", "all"), ("rf1", "all"), ("rf1", "1"), ("rf3", "1")]
GB = 1e9


def one_round(tree: str, r: int, rows: Path, count: int) -> None:
    with tempfile.TemporaryDirectory(prefix="semel-repl-cpu-") as tmp:
        cluster, leaders = _start(Path(tmp), "default", [])
        try:
            with rows.open("a") as f:
                for topic, acks in (CASES if r % 2 == 0 else CASES[::-1]):
                    f.write(json.dumps(_measure(cluster, leaders, tree, topic, acks, r, count)) + "\n")
        finally:
            cluster.stop()
            cluster.close()


def profile(out: Path, seconds: int) -> None:
    """Native py-spy (blocking: native stacks need the process stopped while sampled) of
    every broker while RF3 acks=all records are produced; top frames to out/top.json."""
    from tests.support.cluster import partitions
    out.mkdir(parents=True, exist_ok=True)
    spy_bin = str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory(prefix="semel-repl-prof-") as tmp:
        cluster, _ = _start(Path(tmp), "default", [])
        try:
            leader = partitions(cluster, "rf3")[0][0]
            spies = {n: subprocess.Popen([spy_bin, "record", "--pid", str(b.pid), "--duration", str(seconds),
                                          "--rate", "100", "--native", "--format", "raw", "-o", str(out / f"{n}.txt")],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for n, b in enumerate(cluster.brokers)}
            time.sleep(1.0)
            end = time.monotonic() + seconds - 2
            while time.monotonic() < end:
                produce(cluster.bootstrap, "rf3", 1, SIZE, 20_000, {"acks": "all"})
            tops = {}
            for n, spy in spies.items():
                spy.wait(seconds + 60)
                tops[f"broker {n} ({'leader' if n == leader else 'follower'})"] = top_frames(out / f"{n}.txt", 15)
        finally:
            cluster.stop()
            cluster.close()
    (out / "top.json").write_text(json.dumps(tops, indent=1))


def _per_gb(cpu: float, row: dict) -> float:
    return cpu * GB / (row["records"] * SIZE)


def _tree_summary(rows: list[dict]) -> dict:
    out = {}
    for topic, acks in CASES:
        c = [r for r in rows if (r["topic"], r["acks"]) == (topic, acks)]
        med = lambda f: round(statistics.median(f(r) for r in c), 3)   # noqa: E731
        out[f"{topic}_acks_{acks}"] = {
            "rounds": len(c),
            "cpu_s_per_gb": {"leader": med(lambda r: _per_gb(r["broker_cpu_s"][0], r)),
                             "follower_a": med(lambda r: _per_gb(r["broker_cpu_s"][1], r)),
                             "follower_b": med(lambda r: _per_gb(r["broker_cpu_s"][2], r)),
                             "all_brokers": med(lambda r: _per_gb(sum(r["broker_cpu_s"]), r)),
                             "producer_client": med(lambda r: _per_gb(r["client_cpu_s"], r))},
            "mb_per_s": med(lambda r: r["mb_per_s"]),
            "load_average_1m": [r["load_average_1m"] for r in c]}
    rounds = {}
    for r in rows:
        rounds.setdefault(r["round"], {})[(r["topic"], r["acks"])] = r

    def ratio(f):   # per round, then the median: both cases of a ratio ran minutes apart at most
        return round(statistics.median(f(b) for b in rounds.values()), 3)
    rf3, rf1, rf1_1 = ("rf3", "all"), ("rf1", "all"), ("rf1", "1")
    out["item1_follower_cpu_s_per_gb"] = ratio(lambda b: max(_per_gb(x, b[rf3]) for x in b[rf3]["broker_cpu_s"][1:]))
    out["item1_leader_extra_cpu_s_per_gb_per_follower"] = ratio(
        lambda b: (_per_gb(b[rf3]["broker_cpu_s"][0], b[rf3]) - _per_gb(b[rf1]["broker_cpu_s"][0], b[rf1])) / 2)
    out["item2_all_brokers_rf3_acks_all_over_rf1_acks_all"] = ratio(
        lambda b: sum(b[rf3]["broker_cpu_s"]) / max(sum(b[rf1]["broker_cpu_s"]), 0.01))
    out["item2_mb_per_s_rf3_acks_all_over_rf1_acks_1"] = ratio(lambda b: b[rf3]["mb_per_s"] / b[rf1_1]["mb_per_s"])
    out["targets_met"] = {"item1_follower_at_most_1.5": out["item1_follower_cpu_s_per_gb"] <= 1.5,
                          "item1_leader_extra_at_most_0.4": out["item1_leader_extra_cpu_s_per_gb_per_follower"] <= 0.4,
                          "item2_cpu_ratio_at_most_1.6": out["item2_all_brokers_rf3_acks_all_over_rf1_acks_all"] <= 1.6,
                          "item2_throughput_ratio_at_least_0.6": out["item2_mb_per_s_rf3_acks_all_over_rf1_acks_1"] >= 0.6}
    return out


def summarize(rows_file: Path, before: Path | None, after: Path | None, extra: dict, out_dir: Path) -> dict:
    rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
    trees = list(dict.fromkeys(r["cluster"] for r in rows))
    result = {
        "what": "CPU seconds per GB (1e9 bytes of 1 KiB record values produced) of each process role, "
                "one partition, confluent-kafka producer, RF3 (min.insync.replicas 2) and RF1 topics",
        "cluster": "etcd + 3 semel broker processes on this machine (semel.launch.local_cluster), a fresh one per round",
        "machine_name": "2-core shared VM: " + SHARED_BOX,
        "settings": {"record_bytes": SIZE, "records_per_case": rows[0]["records"],
                     "rounds_per_tree": {t: len({r["round"] for r in rows if r["cluster"] == t}) for t in trees},
                     "alternation": "trees take turns round by round (which goes first alternates); the four "
                                    "cases' order reverses every other round"},
        "load_average_1m_range": [min(r["load_average_1m"] for r in rows), max(r["load_average_1m"] for r in rows)],
        "load_note": "the VM was shared with other sessions' test runs throughout (1-minute load average "
                     "on 2 cores in load_average_1m_range and per row): CPU seconds are charged per process "
                     "so they depend on load less than MB/s does, but MB/s and the throughput ratio are noisy",
        "roles": "leader = rf3's (or rf1's) leader; follower_a/b = the other two brokers (for rf1 they do "
                 "nothing but upkeep); producer_client = the bench process (librdkafka's threads)",
        "medians": {t: _tree_summary([r for r in rows if r["cluster"] == t]) for t in trees},
        **extra,
        "profiles": {name: json.loads((d / "top.json").read_text()) for name, d in
                     (("before", before), ("after", after)) if d is not None and (d / "top.json").exists()},
        "rows": rows,
    }
    write_result(out_dir, "replication_cpu", result)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--round", type=int)
    ap.add_argument("--tree", default="this")
    ap.add_argument("--rows", type=Path)
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--profile", type=Path, metavar="DIR")
    ap.add_argument("--seconds", type=int, default=15)
    ap.add_argument("--summarize", type=Path, metavar="ROWS")
    ap.add_argument("--before", type=Path)
    ap.add_argument("--after", type=Path)
    ap.add_argument("--extra", type=Path, help="a JSON object of fields to add (notes, trees' commits)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    if a.profile:
        profile(a.profile, a.seconds)
    elif a.summarize:
        summarize(a.summarize, a.before, a.after, json.loads(a.extra.read_text()) if a.extra else {}, a.out)
    else:
        one_round(a.tree, a.round, a.rows, a.records)
