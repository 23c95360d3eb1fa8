"""Broker CPU-seconds per GB with a SASL_SSL listener against PLAINTEXT, produce and fetch.

Per source tree (this one, and with `--before DIR` a second tree such as
`git archive main | tar -x -C DIR`), two brokers run side by side as in
bench/security.py: one plain (PLAINTEXT, no ACLs), one secured (SASL_SSL listener,
SCRAM-SHA-512 login, authorizer on with a few hundred ACLs). Each round, on each
broker in alternating order: a confluent-kafka producer (logged in before the clock
starts) writes RECORDS records of 1 KiB with acks=all into a fresh topic, then a
consumer reads them back; the broker's CPU (utime+stime from /proc, 10 ms ticks)
over each phase, divided by the GB moved, is the result, user and system apart.
Half a GB per phase keeps a broker busy for hundreds of ticks.

This VM backs a guest page on its first touch at about 4 s of system time per GiB
(hotpath_bench.warm_guest_memory): GiB are touched before any broker starts, and the
topics are deleted after each round so the page cache recycles warm pages; the
alternation makes every broker meet the same conditions.

py-spy --native of each secured broker during a produce and during a fetch gives the
top frames. Writes bench/results/security_cpu.json.

    python -m bench.security_cpu [--quick] [--before /tmp/tls-base] [--rounds 5] [--scale 1]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, produce_all, write_result
from bench.hotpath_bench import PRODUCER, cpu_times, record_profile, tree_env, warm_guest_memory
from bench.security import certs, secure_args, secure_conf, secure_data
from semel.launch.process import SemelBroker, free_port, wait_for_port

RECORDS = 500_000
SIZE = 1024
CONSUMER = {"group.id": "bench-cpu", "enable.auto.commit": False, "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760}
LISTENERS = ("plain", "sasl_ssl")


class Pair:
    """The plain and the secured broker of one source tree, and their client settings."""

    def __init__(self, tmp: Path, label: str, tree: Path | None):
        (tmp / f"{label}-certs").mkdir()
        ca, cert, key = certs(tmp / f"{label}-certs")
        sdata = tmp / f"{label}-secure"
        self.acls = secure_data(sdata)
        self.tls_port = free_port()
        env = tree_env(tree)
        self.brokers = {
            "plain": SemelBroker(tmp / f"{label}-plain", log_path=tmp / f"{label}-plain.log", env=env),
            "sasl_ssl": SemelBroker(sdata, log_path=tmp / f"{label}-secure.log", env=env,
                                    extra_args=secure_args(self.tls_port, cert, key)),
        }
        self.ca = ca

    def start(self) -> None:
        for b in self.brokers.values():
            b.start()
        wait_for_port("127.0.0.1", self.tls_port, 60)
        self.confs = {"plain": {"bootstrap.servers": self.brokers["plain"].bootstrap},
                      "sasl_ssl": secure_conf(self.tls_port, self.ca)}
        self.admin = {"plain": self.confs["plain"], "sasl_ssl": secure_conf(self.tls_port, self.ca, "admin")}

    def close(self) -> None:
        for b in self.brokers.values():
            b.close()


def _admin(conf: dict, topic: str, create: bool) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient(conf)    # must outlive the future
    fut = admin.create_topics([NewTopic(topic, 1, 1)]) if create else admin.delete_topics([topic])
    fut[topic].result(60)


def loop_sleeps(pid: int) -> int:
    """Times the broker's main thread (its event loop) went to sleep and was woken:
    its voluntary context switches (/proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    return 0


def io_calls(pid: int | str) -> tuple[int, int]:
    """(read, write) system calls the process has made (/proc/PID/io syscr, syscw). A
    TLS client's writes are about its TLS records: librdkafka writes each with its own."""
    with open(f"/proc/{pid}/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def _phase(pid: int, gb: float, work) -> dict:
    """Runs work(); the broker's CPU over it per GB (user, system, total), its event
    loop's wake-ups and read calls per GB, this client process's CPU (user, system, total)
    and write calls per GB, MB/s."""
    u0, s0 = cpu_times(pid)
    w0, (r0, _), (_, cw0) = loop_sleeps(pid), io_calls(pid), io_calls("self")
    c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    work()
    wall = time.perf_counter() - t0
    u1, s1 = cpu_times(pid)
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cu, cs = c1.ru_utime - c0.ru_utime, c1.ru_stime - c0.ru_stime
    (r1, _), (_, cw1) = io_calls(pid), io_calls("self")
    return {"broker_cpu_s_per_gb": round((u1 - u0 + s1 - s0) / gb, 3),
            "broker_user_s_per_gb": round((u1 - u0) / gb, 3), "broker_system_s_per_gb": round((s1 - s0) / gb, 3),
            "broker_loop_wakeups_per_gb": round((loop_sleeps(pid) - w0) / gb),
            "broker_read_calls_per_gb": round((r1 - r0) / gb), "client_write_calls_per_gb": round((cw1 - cw0) / gb),
            "client_cpu_s_per_gb": round((cu + cs) / gb, 3), "client_user_s_per_gb": round(cu / gb, 3),
            "client_system_s_per_gb": round(cs / gb, 3), "mb_s": round(gb * 1000 / wall, 1)}


def _produce(conf: dict, topic: str, count: int):
    """A logged-in producer (a warm-up record delivered: offset 0) and the work that sends count records."""
    from confluent_kafka import Producer
    p = Producer({**PRODUCER, **conf})
    errors: list = []
    cb = lambda err, msg: errors.append(err) if err else None  # noqa: E731
    p.produce(topic, value=b"warm-up", partition=0, on_delivery=cb)
    if p.flush(60) or errors:
        raise RuntimeError(f"the warm-up record was not delivered: {errors}")

    def work():
        produce_all(p, topic, 1, b"x" * SIZE, count, cb)
        if p.flush(300) or errors:
            raise RuntimeError(f"produce did not finish: {errors[:1]}")
    return work


def _fetch(conf: dict, topic: str, count: int):
    """A consumer of the topic past the warm-up record (connected and logged in on the
    bootstrap connection first) and the work that reads the count records."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({**conf, **CONSUMER})
    c.list_topics(topic, timeout=60)

    def work():
        c.assign([TopicPartition(topic, 0, 1)])
        got, deadline = 0, time.monotonic() + 300
        while got < count and time.monotonic() < deadline:
            for m in c.consume(num_messages=min(10_000, count - got), timeout=1.0):
                if m.error() is None:
                    got += 1
        c.close()
        if got < count:
            raise RuntimeError(f"fetched {got}/{count}")
    return work


def measure(pair: Pair, tree: str, listener: str, round_no: int, count: int) -> dict:
    conf, pid = pair.confs[listener], pair.brokers[listener].pid
    topic = f"bench-cpu-{round_no}"
    gb = count * SIZE / 1e9
    _admin(pair.admin[listener], topic, create=True)
    produce = _phase(pid, gb, _produce(conf, topic, count))
    fetch = _phase(pid, gb, _fetch(conf, topic, count))
    _admin(pair.admin[listener], topic, create=False)    # its pages go back to the page cache, warm
    row = {"tree": tree, "listener": listener, "round": round_no, "load_average_1m": round(os.getloadavg()[0], 2),
           "produce": produce, "fetch": fetch}
    print(row, flush=True)
    return row


def summarise(rows: list[dict], trees: list[str]) -> dict:
    out = {}
    for tree in trees:
        med = {}
        for listener in LISTENERS:
            rs = [r for r in rows if r["tree"] == tree and r["listener"] == listener]
            med[listener] = {phase: {k: round(statistics.median(r[phase][k] for r in rs), 3) for k in rs[0][phase]}
                             for phase in ("produce", "fetch")}
        ratio = {phase: round(med["sasl_ssl"][phase]["broker_cpu_s_per_gb"]
                              / max(med["plain"][phase]["broker_cpu_s_per_gb"], 1e-9), 3)
                 for phase in ("produce", "fetch")}
        # Each round's plain and secured runs are back to back: their ratio sees about the same load.
        per_round = {phase: [round(s[phase]["broker_cpu_s_per_gb"] / max(p[phase]["broker_cpu_s_per_gb"], 1e-9), 3)
                             for p, s in zip(*([r for r in rows if r["tree"] == tree and r["listener"] == lst]
                                               for lst in LISTENERS))]
                     for phase in ("produce", "fetch")}
        out[tree] = {"median": med, "broker_cpu_sasl_ssl_over_plain": ratio,
                     "broker_cpu_sasl_ssl_over_plain_per_round": per_round,
                     "meets_target_1_4": {phase: v <= 1.4 for phase, v in ratio.items()}}
    return out


def run(out_dir: Path = RESULTS, quick: bool = False, before: Path | None = None, rounds: int | None = None,
        scale: float = 1.0, warm_gib: float = 4.0, profile_s: float = 12.0, name: str = "security_cpu",
        note: str | None = None) -> dict:
    rounds = rounds or (2 if quick else 5)
    count = int(RECORDS * (0.1 if quick else scale))
    trees = {"after": None, **({"before": before} if before else {})}
    rows: list[dict] = []
    prof: dict = {}
    with tempfile.TemporaryDirectory(prefix="semel-seccpu-") as tmp:
        tmp = Path(tmp)
        pairs = {label: Pair(tmp, label, tree) for label, tree in trees.items()}
        warmup = warm_guest_memory(0.5 if quick else warm_gib)
        load_start = [round(x, 2) for x in os.getloadavg()]
        try:
            for pair in pairs.values():
                pair.start()
            runs = [(t, lst) for t in pairs for lst in LISTENERS]
            for r in range(rounds):
                # Alternate who goes first: page cache, CPU boost, neighbours.
                for t, lst in (runs if r % 2 == 0 else reversed(runs)):
                    rows.append(measure(pairs[t], t, lst, r, count))
            for t, pair in pairs.items():
                prof[t] = _profile(pair, 4 if quick else profile_s, count)
        finally:
            for pair in pairs.values():
                pair.close()
    result = {
        "what": "broker CPU-seconds (utime+stime) per GB moved, SASL_SSL (SCRAM-SHA-512, authorizer on) "
                "against PLAINTEXT (no ACLs); produce: confluent-kafka, acks=all, 1 KiB records, 1 partition, "
                "flush=always, logged in before the clock; fetch: a confluent-kafka consumer reading the same "
                "records back (50 MB fetches, 10 MB per partition); rounds alternated",
        "machine_role": SHARED_BOX, "trees": {k: str(v) if v else "this tree" for k, v in trees.items()},
        "record_bytes": SIZE, "records_per_phase": count, "gb_per_phase": round(count * SIZE / 1e9, 3),
        "rounds": rounds, "acls_in_store": pairs["after"].acls, "producer_settings": PRODUCER,
        "consumer_settings": CONSUMER, "memory_warmup": warmup,
        "load_average_1_5_15_min": {"start": load_start, "end": [round(x, 2) for x in os.getloadavg()]},
        "target": "SASL_SSL broker CPU per GB at most 1.4x PLAINTEXT's, produce and fetch",
        "summary": summarise(rows, list(pairs)),
        "profile_what": "py-spy --native at 250 Hz on the SASL_SSL broker of each tree during a produce and "
                        "during fetches of the same size; idle waits left out (hotpath_bench.top_frames)",
        "profile_sasl_ssl": prof,
        "rows": rows,
    }
    if note:
        result["note"] = note
    write_result(out_dir, name, result)
    return result


def _profile(pair: Pair, seconds: float, count: int) -> dict:
    conf, pid = pair.confs["sasl_ssl"], pair.brokers["sasl_ssl"].pid
    out = {}
    for phase in ("produce", "fetch"):
        topic = f"bench-cpu-profile-{phase}"
        _admin(pair.admin["sasl_ssl"], topic, create=True)
        if phase == "fetch":     # written before py-spy starts: only the reads are sampled
            _produce(conf, topic, count)()

        def load(end: float) -> None:
            while True:
                (_produce if phase == "produce" else _fetch)(conf, topic, count)()
                if time.monotonic() >= end:
                    break
        out[phase] = record_profile(pid, seconds, load)
        _admin(pair.admin["sasl_ssl"], topic, create=False)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--before", type=Path, default=None, help="a semel source tree to run as 'before'")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--scale", type=float, default=1.0, help=f"multiply the {RECORDS} records per phase")
    ap.add_argument("--warm-memory-gib", type=float, default=4.0,
                    help="touch this much memory before the brokers start (hotpath_bench.warm_guest_memory)")
    ap.add_argument("--profile-seconds", type=float, default=12.0)
    ap.add_argument("--name", default="security_cpu", help="results file name (bench/results/NAME.json)")
    ap.add_argument("--note", default=None)
    a = ap.parse_args()
    run(a.out, a.quick, a.before, a.rounds, a.scale, a.warm_memory_gib, a.profile_seconds, a.name, a.note)
