"""Long wire fuzz run: a million schema-drawn, mutated requests of every
API and version the broker advertises, over many connections at once, at one real
broker process; a bystander process meanwhile asks ApiVersions every 20 ms on its
own connection and keeps its slowest answer.

Writes bench/results/fuzz_long.json: requests sent / answered / closed by the broker
/ left without answer, per API key; the bystander's slowest answer; the broker's RSS
before and after; whether the broker stayed up; stall lines and handler failures in
its log; and whether records written before the run read back byte for byte.

    .venv/bin/python -m bench.fuzz_long [--requests 1000000] [--workers 32] [--seed 1]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, write_result  # noqa: E402
from semel.broker.watchdog import STALL_MARKER  # noqa: E402
from semel.client import Client  # noqa: E402
from semel.launch.process import SemelBroker  # noqa: E402
from semel.protocol import records  # noqa: E402
from tests.support.wire_fuzz import FuzzStats, advertised, fuzz_worker  # noqa: E402

KEPT = "kept"   # never named by the generator: its bytes must not change


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def bystander(host: str, port: int, stop, out) -> None:
    """ApiVersions every 20 ms on one connection; reports (count, slowest seconds, failures)."""
    import socket
    import struct
    from semel.protocol.messages import encode_request, request_class
    body = request_class(18)(version=3, client_software_name="bystander", client_software_version="1")
    frame = encode_request(18, 3, 1, "bystander", body)
    n, slowest, failures = 0, 0.0, 0
    sock = socket.create_connection((host, port), timeout=60)
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            sock.sendall(frame)
            head = _exact(sock, 4)
            _exact(sock, struct.unpack(">i", head)[0])
        except OSError:
            failures += 1
            sock.close()
            sock = socket.create_connection((host, port), timeout=60)
            continue
        took = time.monotonic() - t0
        n += 1
        slowest = max(slowest, took)
        time.sleep(0.02)
    out.put((n, slowest, failures))


def _exact(sock, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def read_all(c: Client, topic: str, partition: int) -> bytes:
    out, offset = b"", 0
    while True:
        got = c.fetch(topic, partition, offset)
        if not got.records:
            return out
        out += got.records
        last = None
        for _, hdr in records.iter_batches(got.records):
            last = hdr
        offset = last.last_offset + 1


async def run_fuzz(host, port, pairs, total, workers, seed, broker, progress_every=50_000):
    stats = FuzzStats()
    per = total // workers
    rngs = [random.Random(seed * 1000 + i) for i in range(workers)]
    tasks = [asyncio.create_task(fuzz_worker(host, port, rngs[i], pairs, per, stats)) for i in range(workers)]
    next_report = progress_every
    t0 = time.monotonic()
    while not all(t.done() for t in tasks):
        await asyncio.sleep(1)
        if not broker.alive():
            raise RuntimeError(f"broker died after {stats.sent} requests")
        if stats.sent >= next_report:
            rate = stats.sent / (time.monotonic() - t0)
            print(f"{stats.sent} sent ({rate:.0f}/s), answered {stats.answered}, closed {stats.closed}, "
                  f"pending {stats.pending}", file=sys.stderr, flush=True)
            next_report += progress_every
    for t in tasks:
        t.result()
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    import semel.broker.handlers  # noqa: F401  (registers the routes the broker advertises)
    from semel.broker.router import supported_versions
    pairs = advertised(supported_versions())
    tmp = Path(tempfile.mkdtemp(prefix="semel-fuzz-long-"))
    broker = SemelBroker(tmp / "data", log_path=tmp / "broker.log", extra_args=["--max-request-bytes", "1000000"])
    broker.start()
    try:
        with Client(broker.bootstrap) as c:
            c.create_topic(KEPT, 1)
            c.create_topic("fuzz", 2)
            for i in range(50):
                c.produce(KEPT, 0, records.build_batch([(b"k%d" % i, b"value-%d" % i * 10)]))
            kept_before = read_all(c, KEPT, 0)
        rss_before = rss_kib(broker.pid)
        stop, out = multiprocessing.Event(), multiprocessing.Queue()
        by = multiprocessing.Process(target=bystander, args=(broker.host, broker.port, stop, out), daemon=True)
        by.start()
        t0 = time.monotonic()
        stats = asyncio.run(run_fuzz(broker.host, broker.port, pairs, args.requests, args.workers, args.seed,
                                     broker))
        seconds = time.monotonic() - t0
        stop.set()
        by_count, by_slowest, by_failures = out.get(timeout=120)
        by.join(30)
        alive = broker.alive()
        rss_after = rss_kib(broker.pid) if alive else -1
        with Client(broker.bootstrap) as c:
            kept_after = read_all(c, KEPT, 0)
        log_text = (tmp / "broker.log").read_text(errors="replace")
        failures = sorted(set(re.findall(r"ERROR semel[^:]*: (.*?)(?: for |;|$)", log_text, re.M)))
        result = {
            "requests": stats.as_dict(), "api_versions_fuzzed": len(pairs), "workers": args.workers,
            "seed": args.seed, "seconds": round(seconds, 1), "requests_per_second": round(stats.sent / seconds),
            "bystander": {"answers": by_count, "slowest_answer_s": round(by_slowest, 4),
                          "reconnects": by_failures},
            "broker_rss_kib": {"before": rss_before, "after": rss_after},
            "broker_alive_after": alive,
            "stall_lines": log_text.count(STALL_MARKER),
            "loop_lag_warnings": log_text.count("event loop lag"),
            "handler_failures": failures,
            "kept_records_byte_identical": kept_after == kept_before,
            "kept_bytes": len(kept_before),
        }
        path = write_result(args.out, "fuzz_long", result)
        print(path)
        ok = alive and result["kept_records_byte_identical"] and not result["stall_lines"]
        return 0 if ok else 1
    finally:
        broker.stop()
        broker.close()


if __name__ == "__main__":
    sys.exit(main())
