"""A 3-broker cluster, its etcd and its clients each in a network namespace
(semel.launch.netns), and one cut measured: the longest time without an
acknowledgement on each partition and between two commits of a transactional copier,
across the cut.

Hosts: b0, b1, b2 (node ids 0-2), etcd, client. Brokers run with a 3 s lease,
min.insync.replicas 2 and replica.lag.time.max.ms 3000; the test topic has 3
partitions of RF 3. The clients run as tests.support.partition_load in the client's
namespace.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from semel.client.client import Client, ClientError
from semel.launch.etcd import EtcdProcess
from semel.launch.netns import Network, place
from semel.launch.process import SemelBroker
from semel.protocol import records
from semel.protocol.errors import KafkaError

from .wait import until

BROKERS = ("b0", "b1", "b2")
HOSTS = (*BROKERS, "etcd", "client")
LEASE_S = 3
LAG_MS = 3000
PARTS = 3
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "partition_gaps.json"


class NetnsCluster:
    def __init__(self, data_dir: Path):
        self.data_dir = Path(data_dir)
        self.net = Network(HOSTS)
        self.etcd = None
        self.brokers: list[SemelBroker] = []

    def start(self) -> "NetnsCluster":
        self.net.create()
        try:
            self.etcd = place(EtcdProcess(self.data_dir / "etcd", 2379, 2380, log_path=self.data_dir / "etcd.log"),
                              self.net, "etcd")
            self.etcd.start()
            for n, host in enumerate(BROKERS):
                b = SemelBroker(self.data_dir / f"broker-{n}", 9092, log_path=self.data_dir / f"broker-{n}.log",
                                extra_args=["--node-id", str(n), "--metadata", self.etcd.bootstrap,
                                            "--lease-ttl-s", str(LEASE_S), "--min-insync-replicas", "2",
                                            "--replica-lag-time-max-ms", str(LAG_MS)])
                self.brokers.append(place(b, self.net, host))
                b.start()
            until(lambda: self.live() == {0, 1, 2}, "three brokers registered")
        except BaseException:
            self.close()
            raise
        return self

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers)

    def client(self, fn, node: int = 0):
        """fn(semel Client connected to broker `node`) from the client's namespace."""
        def run():
            with Client(self.brokers[node].bootstrap, timeout_s=5) as c:
                return fn(c)
        return self.net.within("client", run)

    def live(self) -> set[int]:
        try:
            seen = [{b.node_id for b in self.client(lambda c: c.metadata([]), n).brokers} for n in range(3)]
        except (ClientError, OSError):
            return set()
        return seen[0] if all(s == seen[0] for s in seen) else set()

    def metadata(self, node: int, topics):
        return self.client(lambda c: c.metadata(topics), node)

    def close(self) -> None:
        for b in self.brokers:
            b.kill()
        if self.etcd is not None:
            self.etcd.kill()
        for b in self.brokers:
            b.close()
        if self.etcd is not None:
            self.etcd.close()
        self.net.close()


def leaders(md) -> dict[int, int]:
    (t,) = md.topics
    return {p.partition_index: p.leader_id for p in t.partitions}


def create_topic(cluster: NetnsCluster, topic: str) -> None:
    """`topic` and the copier's `topic`-copy."""
    for name in (topic, topic + "-copy"):
        def create(c):
            err = c.create_topic(name, PARTS, {"min.insync.replicas": "2"}, replication_factor=3)
            assert err in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS), err
        cluster.client(create)
        until(lambda: all(l >= 0 for l in leaders(cluster.metadata(0, [name])).values()), f"{name} has leaders")


class Load:
    """tests.support.partition_load running in the client namespace."""

    def __init__(self, cluster: NetnsCluster, topic: str, work: Path):
        self.out = work / f"{topic}.jsonl"
        self.stop_file = work / f"{topic}.stop"
        self.proc = subprocess.Popen(
            cluster.net.exec_argv("client") + [sys.executable, "-m", "tests.support.partition_load",
                                               cluster.bootstrap, topic, str(PARTS), str(self.out),
                                               str(self.stop_file)],
            cwd=ROOT, stdout=open(work / f"{topic}.load.log", "ab"), stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)))

    def records(self) -> list[dict]:
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def warm(self) -> None:
        def ready():
            recs = self.records()
            acked = {r["p"] for r in recs if r["kind"] == "ack"}
            return acked == set(range(PARTS)) and any(r["kind"] == "commit" for r in recs)
        until(ready, "acks on every partition and a copier commit", timeout_s=120)

    def finish(self) -> list[dict]:
        self.stop_file.touch()
        try:
            self.proc.wait(400)
        except BaseException:    # timed out or interrupted: no client outlives the run
            self.proc.kill()
            self.proc.wait()
            raise
        return self.records()


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch inside [start, end] with no time of `times` (sorted) in it,
    counting from the last one before `start`."""
    before = [t for t in times if t < start]
    points = [before[-1] if before else start] + [t for t in times if start <= t <= end] + [end]
    return max(b - a for a, b in zip(points, points[1:]))


def measure(recs: list[dict], t_cut: float, t_heal: float) -> dict:
    """Per partition the longest time without an acknowledgement across the cut, the
    time to the first acknowledgement sent after the cut began, and how many came in
    the cut's second half and how many after the heal; the same for the copier's commits
    (its gap runs on past the heal when it committed nothing during the cut)."""
    acks = {p: sorted(r["t"] for r in recs if r["kind"] == "ack" and r["p"] == p) for p in range(PARTS)}
    commits = sorted(r["t"] for r in recs if r["kind"] == "commit")
    half = (t_cut + t_heal) / 2
    first_commit = next((t for t in commits if t > t_cut), None)
    later = next((t for t in commits if t >= t_heal), t_heal)
    return {
        "cut_s": round(t_heal - t_cut, 1),
        "ack_gap_s": {p: round(longest_gap(ts, t_cut, t_heal), 2) for p, ts in acks.items()},
        "acks_in_second_half": {p: sum(1 for t in ts if half <= t <= t_heal) for p, ts in acks.items()},
        "copier_gap_s": round(longest_gap(commits, t_cut, t_heal if first_commit and first_commit <= t_heal
                                          else later), 2),
        "copier_commits_in_cut": sum(1 for t in commits if t_cut <= t <= t_heal),
        "copier_first_commit_after_cut_s": round(first_commit - t_cut, 2) if first_commit else None,
        "acks_after_heal": {p: sum(1 for t in ts if t > t_heal) for p, ts in acks.items()},
        "copier_commits_after_heal": sum(1 for t in commits if t > t_heal),
    }


def check_safety(recs: list[dict], load_log: Path | None = None) -> None:
    """Every acknowledged value is in its partition's log, no value is there twice, and the
    committed copy holds no value twice. `load_log`: the clients' log, whose idempotence
    lines (librdkafka's eos debug) a failure quotes."""
    (log,) = [r["values"] for r in recs if r["kind"] == "log"]
    (copy,) = [r["values"] for r in recs if r["kind"] == "copy"]
    for p in range(PARTS):
        values = log[str(p)]
        assert len(values) == len(set(values)), _twice(recs, p, values, load_log)
        acked = {r["v"] for r in recs if r["kind"] == "ack" and r["p"] == p}
        missing = acked - set(values)
        assert not missing, f"partition {p} lost {len(missing)} acknowledged records, e.g. {sorted(missing)[:3]}"
        copied = copy[str(p)]
        assert len(copied) == len(set(copied)), f"the committed copy of partition {p} holds a value twice"
        assert set(copied) <= set(values)


def _twice(recs: list[dict], p: int, values: list[str], load_log: Path | None) -> str:
    """What a duplicate's cause is read from: each repeated value's offsets in the log,
    its acknowledgements and failures, and the producer's idempotence events."""
    seen: dict[str, list[int]] = {}
    for offset, v in enumerate(values):
        seen.setdefault(v, []).append(offset)
    twice = {v: offsets for v, offsets in seen.items() if len(offsets) > 1}
    told = [{k: r[k] for k in ("kind", "t", "off", "err") if k in r} | {"v": r["v"]}
            for r in recs if r.get("p") == p and r.get("v") in twice and r["kind"] in ("ack", "fail")]
    events = []
    if load_log is not None and load_log.exists():
        events = [line for line in load_log.read_text(errors="replace").splitlines()
                  if any(w in line for w in ("DRAIN", "BUMP", "PID", "RESETSEQ", "FATAL", "ERROR"))][-40:]
    return (f"partition {p} holds a value twice: {dict(list(twice.items())[:5])} ({len(twice)} values); "
            f"their acks and failures: {told[:10]}; producer idempotence events:\n" + "\n".join(events))


def save(scenario: str, when: str | None, result: dict) -> None:
    """Merge one scenario's numbers into bench/results/partition_gaps.json under `when`
    (PARTITION_RESULT_KEY: "before" or "after"); nothing when it is None."""
    if when is None:
        return
    data = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    data.setdefault(when, {})[scenario] = result
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def produce_once(cluster: NetnsCluster, node: int, topic: str, partition: int) -> KafkaError:
    """One acks=all record sent straight to broker `node` from the client namespace: its error."""
    batch = records.build_batch([(None, b"probe")])

    def send(c):
        return c.produce(topic, partition, batch)[0]
    try:
        return cluster.client(send, node)
    except (ClientError, OSError) as exc:
        return getattr(exc, "error", None) or KafkaError.REQUEST_TIMED_OUT


def zombie_answers(cluster: NetnsCluster, node: int, topic: str, partition: int, until_t: float) -> list:
    """[(seconds since the first probe, error name)] of acks=all probes sent straight to
    `node` until `until_t` or its first NOT_LEADER_OR_FOLLOWER."""
    t0 = time.time()
    out = []
    while time.time() < until_t:
        err = produce_once(cluster, node, topic, partition)
        out.append((round(time.time() - t0, 2), KafkaError(err).name))
        if err == KafkaError.NOT_LEADER_OR_FOLLOWER:
            break
        time.sleep(0.25)
    return out
