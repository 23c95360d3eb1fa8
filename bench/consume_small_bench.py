"""Reading 100 B records back: semel (fsync) and Tansu (memory), and which side bounds it.

The hot path's 4 x 8 100 B case (bench.hotpath_bench): four idempotent producers fill
8 partitions with 100 B records, then one confluent-kafka consumer reads every
partition from the start, in its own process, alternating brokers for `rounds`
rounds. Per pass: records/s, the consumer process's CPU seconds (all its threads:
librdkafka's fetch and parse threads and the Python loop), the broker's CPU seconds,
and for semel the Fetch requests it answered and the seconds it spent in them (its
semel_request_seconds histogram), and the longest wait between two batches of records
the client handed over. Each pass runs twice: with the hot path's consumer settings and
with librdkafka's fetch.queue.backoff.ms at 0 (see CLIENTS). When the consumer's CPU is many times the broker's and
the broker spends a small part of the pass answering Fetch, the client is the bound. On a
shared box a pass's wall time is also the consumer waiting for a core: compare the
brokers' CPU and the profiles' busy shares, not only the rates.

`--profile S` also records S seconds of py-spy --native on the consumer process while
it reads each broker (and on the semel broker), top functions by self samples.

    python -m bench.consume_small_bench [--quick] [--rounds N] [--profile S]
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, load_fields, write_result
from bench.hotpath_bench import _create, cpu_seconds, produce, record_profile
from bench.latency_stats import scrape
from semel.launch.process import SemelBroker, TansuBroker, free_port

PRODUCERS, PARTITIONS, SIZE = 4, 8, 100
TOPIC = "small-records"
# The hot path's consumer settings, then the same with librdkafka's fetch.queue.backoff.ms
# at 0: by default (1000 ms) a partition whose local queue is over queued.min.messages or
# queued.max.messages.kbytes is not fetched again for a second.
CONSUMER = {"group.id": "bench", "enable.auto.commit": False, "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760}
CLIENTS = {"client defaults": {}, "fetch.queue.backoff.ms=0": {"fetch.queue.backoff.ms": 0}}


def consume(bootstrap: str, total: int, extra: dict) -> tuple[float, float]:
    """One full read: (seconds from the first record to the last, the longest wait between
    two consume() calls that returned records)."""
    from confluent_kafka import Consumer, TopicPartition
    c = Consumer({"bootstrap.servers": bootstrap, **CONSUMER, **extra})
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    got, first, last, stall = 0, None, None, 0.0
    deadline = time.monotonic() + 300
    try:
        while got < total and time.monotonic() < deadline:
            msgs = c.consume(num_messages=min(10000, total - got), timeout=1.0)
            if not msgs:
                continue
            now = time.perf_counter()
            first = first or now
            stall = max(stall, now - (last or now))
            last = now
            got += sum(1 for m in msgs if m.error() is None)
    finally:
        c.close()
    if got < total:
        raise RuntimeError(f"consumed {got}/{total}")
    return (last or 0) - (first or 0), stall


def _reader(bootstrap: str, total: int, extra: dict, passes: int, until: float, go, q) -> None:
    """Child process: `passes` full reads (or reads until `until`, for a profile), once `go`."""
    go.wait(60)
    cpu0 = time.process_time()
    elapsed, stall, n = 0.0, 0.0, 0
    while n < passes or time.monotonic() < until:
        e, s = consume(bootstrap, total, extra)
        elapsed, stall, n = elapsed + e, max(stall, s), n + 1
    q.put((elapsed / n, (time.process_time() - cpu0) / n, stall))


def _spawn(bootstrap: str, total: int, extra: dict, passes: int = 1, until: float = 0.0):
    ctx = multiprocessing.get_context("spawn")
    go, q = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_reader, args=(bootstrap, total, extra, passes, until, go, q), daemon=True)
    proc.start()
    return proc, go, q


def _collect(proc, q) -> tuple[float, float, float]:
    try:
        return q.get(timeout=300)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def one_pass(label: str, broker, ports: list[int], total: int, client: str) -> dict:
    proc, go, q = _spawn(broker.bootstrap, total, CLIENTS[client])
    time.sleep(1.0)   # the child's interpreter and imports start before the clocks do
    before, cpu0 = scrape(ports), cpu_seconds(broker.pid)
    go.set()
    wall, client_cpu, stall = _collect(proc, q)
    broker_cpu, after = cpu_seconds(broker.pid) - cpu0, scrape(ports)
    row = {"broker": label, "client": client, "records": total, "records_per_s": round(total / wall),
           "wall_s": round(wall, 3), "longest_stall_s": round(stall, 3),
           "consumer_cpu_s": round(client_cpu, 3), "broker_cpu_s": round(broker_cpu, 3),
           "load_average_1m": round(os.getloadavg()[0], 2)}
    if ports:
        key = (("api", "fetch"),)
        row["fetch_requests"] = int(after.get(("semel_requests_total", key), 0)
                                    - before.get(("semel_requests_total", key), 0))
        row["broker_fetch_s"] = round(after.get(("semel_request_seconds_sum", key), 0)
                                      - before.get(("semel_request_seconds_sum", key), 0), 3)
    print(row, flush=True)
    return row


def _profile(label: str, broker, total: int, seconds: float) -> dict:
    """py-spy on the consumer process (and on a semel broker) while it reads for `seconds`."""
    proc, go, q = _spawn(broker.bootstrap, total, {}, 0, time.monotonic() + seconds + 3)
    time.sleep(1.0)
    out: dict = {}

    def load(end: float) -> None:
        go.set()
        if isinstance(broker, SemelBroker):
            out["broker"] = record_profile(broker.pid, seconds - 2, lambda e: time.sleep(max(0.0, e - time.monotonic())))
        else:
            time.sleep(max(0.0, end - time.monotonic()))
    out["consumer"] = record_profile(proc.pid, seconds, load)
    _collect(proc, q)
    return {f"{label} {k}": v for k, v in out.items()}


def run(out_dir: Path = RESULTS, quick: bool = False, rounds: int | None = None, profile_s: float = 0) -> dict:
    rounds = rounds or (2 if quick else 5)
    count = 25_000 if quick else 100_000
    total = PRODUCERS * count
    load0 = os.getloadavg()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="semel-consume-") as tmp:
        brokers = {"semel (fsync)": (SemelBroker(Path(tmp) / "semel", log_path=Path(tmp) / "semel.log",
                                                 extra_args=["--metrics-port", str(port)]), [port]),
                   "tansu (memory)": (TansuBroker(), [])}
        rows, profiles = [], {}
        try:
            for b, _ in brokers.values():
                b.start()
                _create(b.bootstrap, TOPIC, PARTITIONS)
                produce(b.bootstrap, TOPIC, PARTITIONS, SIZE, PRODUCERS, count, False)
            for r in range(rounds):
                order = list(brokers) if r % 2 == 0 else list(reversed(brokers))
                for label in order:
                    for client in CLIENTS:
                        rows.append({"round": r, **one_pass(label, *brokers[label], total, client)})
            if profile_s:
                for label, (b, _) in brokers.items():
                    profiles.update(_profile(label, b, total, profile_s))
        finally:
            for b, _ in brokers.values():
                b.close()
    med = {client: {label: {k: statistics.median(r[k] for r in rows if (r["broker"], r["client"]) == (label, client))
                            for k in ("records_per_s", "wall_s", "longest_stall_s", "consumer_cpu_s", "broker_cpu_s")}
                    for label in brokers} for client in CLIENTS}
    semel = med["client defaults"]["semel (fsync)"]
    fetch_s = statistics.median(r["broker_fetch_s"] for r in rows
                                if "broker_fetch_s" in r and r["client"] == "client defaults")
    result = {"case": f"{PRODUCERS}x{PARTITIONS} {SIZE}B idempotent, one consumer", "records": total,
              "rounds": rounds, "consumer": CONSUMER, "median": med,
              "semel_over_tansu_records_per_s": {
                  c: round(m["semel (fsync)"]["records_per_s"] / m["tansu (memory)"]["records_per_s"], 2)
                  for c, m in med.items()},
              # the consumer's CPU against the broker's, per pass, and the share of a semel
              # pass's wall time the broker spent answering Fetch
              "consumer_cpu_over_broker_cpu": {k: round(v["consumer_cpu_s"] / max(v["broker_cpu_s"], 0.001), 1)
                                               for k, v in med["client defaults"].items()},
              "semel_broker_fetch_share": round(fetch_s / semel["wall_s"], 3),
              # py-spy: the share of samples each process was working, not waiting
              "profile_busy_share": {k: round(v["busy_samples"] / max(1, v["busy_samples"]
                                                                    + v["idle_samples_left_out"]), 2)
                                     for k, v in profiles.items() if v},
              **load_fields(load0), "rows": rows, "profile": profiles}
    write_result(out_dir, "consume_small", result)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--profile", type=float, default=0, help="seconds of py-spy on the consumer (and semel)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    r = run(a.out, a.quick, a.rounds, a.profile)
    print({k: v for k, v in r.items() if k not in ("rows", "profile")})


if __name__ == "__main__":
    main()
