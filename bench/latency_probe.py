"""Publish latency at a fixed rate: semel `always` beside semel `interval` (and Tansu).

A small probe of the durable path, not the full latency benchmark: one idempotent
acks=all confluent-kafka producer sends 1 KiB records at a fixed rate into 8
partitions of one broker (linger.ms 1); a record's latency is its delivery callback
minus the moment it was handed to the client. Per broker and rate: p50, p99, p99.9,
max (ms), after a warm-up second. The brokers run one after the other at each rate
(`--rounds N`: N times over), so their numbers come from the same minutes of this
shared machine; each row records the load average when it was taken. For semel each
row also gives the broker's own view from its Prometheus histogram
semel_request_seconds{api="produce"} (handled to answer ready, no client in it): the
bucket bounds under which 50% and 99% of Produce requests fell, and the share slower
than 5, 10 and 25 ms, which a busy client does not blur.

`--before DIR` also runs the semel source tree at DIR (a `git worktree add` of the
commit before a change) with `--flush-mode always`, so before/after come from one run.
`--broker-env NAME=VALUE` passes an environment setting to the semel brokers started
from this tree; `--variant 'LABEL:NAME=VALUE,...'` adds an `always` broker with its own
settings, `--only LABEL` keeps only the named brokers. docs/internals/latency.md says
what this probe found.

    python -m bench.latency_probe [--rates 5000,10000,20000] [--seconds 10] [--tansu] [--before DIR]
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.common import RESULTS, SHARED_BOX, load_fields, write_result
from semel.launch.process import ManagedProcess, SemelBroker, TansuBroker, free_port

PARTITIONS = 8
RECORD = b"x" * 1024
WARMUP_S = 1.0
PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 1, "compression.type": "none"}


def _create(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(60)


def percentiles(samples: list[float]) -> dict:
    s = sorted(samples)
    if not s:
        return {"count": 0}

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)
    return {"count": len(s), "p50_ms": at(0.50), "p99_ms": at(0.99), "p999_ms": at(0.999),
            "max_ms": round(s[-1] * 1000, 2)}


def publish(bootstrap: str, topic: str, rate: int, seconds: float) -> dict:
    """Send at `rate` records/s for WARMUP_S + seconds; the latencies after the warm-up."""
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    latencies: list[float] = []
    errors = [0]
    measure_from = [0.0]

    def delivered(sent: float):
        def cb(err, _msg):
            now = time.perf_counter()
            if err is not None:
                errors[0] += 1
            elif sent >= measure_from[0]:
                latencies.append(now - sent)
        return cb

    start = time.perf_counter()
    measure_from[0] = start + WARMUP_S
    end = measure_from[0] + seconds
    sent = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        due = int((now - start) * rate)
        while sent < due:   # the records due by now, each stamped with its own send time
            producer.produce(topic, value=RECORD, partition=sent % PARTITIONS, on_delivery=delivered(time.perf_counter()))
            sent += 1
        producer.poll(0.0002)
    producer.flush(30)
    return {"rate": rate, "sent": sent, "errors": errors[0], **percentiles(latencies)}


_BUCKET = re.compile(r'^semel_request_seconds_bucket\{api="produce",le="([^"]+)"\} ([0-9.e+]+)$', re.M)


def produce_histogram(broker: ManagedProcess) -> dict[float, float] | None:
    """A semel broker's semel_request_seconds buckets for Produce (cumulative counts by
    upper bound, s): handled to answer ready, the fsync wait included, the client left
    out. None for a broker without a metrics port (Tansu)."""
    port = getattr(broker, "metrics_port", None)
    if port is None:
        return None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {float(le): float(n) for le, n in _BUCKET.findall(text)}


def broker_side(before: dict[float, float] | None, after: dict[float, float] | None) -> dict:
    """The broker's own Produce latency over one point, from its histogram's buckets:
    the bucket bound under which 50% and 99% of requests fell, and the share slower
    than 5, 10 and 25 ms."""
    if before is None or after is None:
        return {}
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if not total:
        return {}

    def bound_of(q: float) -> float:
        return next(b for b, n in zip(bounds, counts) if n >= q * total) * 1000

    def slower(ms: float) -> float:
        return round(1 - counts[bounds.index(ms / 1000)] / total, 4)
    return {"broker_requests": int(total), "broker_p50_le_ms": bound_of(0.5), "broker_p99_le_ms": bound_of(0.99),
            "broker_share_over_5ms": slower(5), "broker_share_over_10ms": slower(10),
            "broker_share_over_25ms": slower(25)}


def _semel(data_dir: Path, mode: str, env: dict) -> SemelBroker:
    port = free_port()
    b = SemelBroker(data_dir, extra_args=["--flush-mode", mode, "--metrics-port", str(port)], env=env)
    b.metrics_port = port   # type: ignore[attr-defined]
    return b


def _brokers(tmp: Path, before: Path | None, tansu: bool, env: dict,
             variants: list[str]) -> dict[str, ManagedProcess]:
    out: dict[str, ManagedProcess] = {"semel always": _semel(tmp / "always", "always", env),
                                      "semel interval": _semel(tmp / "interval", "interval", env)}
    if before is not None:
        out["semel always (before)"] = _semel(tmp / "before", "always",
                                              {"PYTHONPATH": str(before), "PYTHONSAFEPATH": "1"})
    for i, v in enumerate(variants):   # 'LABEL:NAME=VALUE,...': `always` with other settings
        label, _, settings = v.partition(":")
        extra = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
        out[f"semel always ({label})"] = _semel(tmp / f"variant{i}", "always", {**env, **extra})
    if tansu:
        out["tansu (memory)"] = TansuBroker()
    return out


def run(out_dir: Path, rates: list[int], seconds: float, tansu: bool, before: Path | None,
        env: dict, name: str, note: str | None, only: list[str] | None = None,
        variants: list[str] = (), rounds: int = 1) -> dict:
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="semel-latency-") as tmp:
        brokers = {k: v for k, v in _brokers(Path(tmp), before, tansu, env, variants).items() if not only or k in only}
        try:
            for b in brokers.values():
                b.start()
            for round_no in range(rounds):
                for rate in rates:
                    for label, b in brokers.items():
                        topic = f"probe-{rate}-{round_no}"
                        _create(b.bootstrap, topic)
                        hist0 = produce_histogram(b)
                        row = {"broker": label, "round": round_no, **publish(b.bootstrap, topic, rate, seconds),
                               **broker_side(hist0, produce_histogram(b)),
                               "load_average": round(os.getloadavg()[0], 2)}
                        print(row, flush=True)
                        rows.append(row)
        finally:
            for b in brokers.values():
                b.close()
    data = {"machine_note": SHARED_BOX, "record_bytes": len(RECORD), "partitions": PARTITIONS,
            "producer": PRODUCER, "seconds_per_point": seconds, "warmup_s": WARMUP_S,
            "note": note, "rows": rows, **load_fields(load0)}
    write_result(out_dir, name, data)
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="5000,10000,20000", help="records/s, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per point")
    ap.add_argument("--rounds", type=int, default=1, help="measure every rate and broker this many times")
    ap.add_argument("--tansu", action="store_true", help="also run Tansu (memory storage)")
    ap.add_argument("--before", type=Path, default=None, help="a semel source tree to run as 'always (before)'")
    ap.add_argument("--broker-env", action="append", default=[], help="NAME=VALUE for this tree's brokers")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default="latency_probe", help="results file name (bench/results/NAME.json)")
    ap.add_argument("--note", default=None)
    ap.add_argument("--variant", action="append", default=[],
                    help="'LABEL:NAME=VALUE,...': also `always` with these environment settings")
    ap.add_argument("--only", action="append", default=None, help="only this broker label (repeatable)")
    a = ap.parse_args()
    env = dict(kv.split("=", 1) for kv in a.broker_env)
    run(a.out, [int(r) for r in a.rates.split(",")], a.seconds, a.tansu, a.before, env, a.name, a.note, a.only, a.variant, a.rounds)


if __name__ == "__main__":
    main()
