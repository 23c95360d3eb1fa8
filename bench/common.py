"""Shared pieces for benchmarks: machine description, result files, broker spawning."""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# What results files call this project's development machine.
SHARED_BOX = "the 2-core shared development VM of this project (other sessions' tests ran meanwhile)"


def load_fields(start: tuple[float, float, float]) -> dict:
    """The load average at a run's start (os.getloadavg() then) and now: the box is shared."""
    return {"load_average_start": [round(x, 2) for x in start],
            "load_average_end": [round(x, 2) for x in os.getloadavg()]}


def machine() -> dict:
    mem_kb = 0
    try:
        with open("/proc/meminfo") as f:
            mem_kb = int(f.readline().split()[1])
    except OSError:
        pass
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory_gib": round(mem_kb / 1024 / 1024, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def write_result(out_dir: Path, name: str, data: dict) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(), **data}
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def main(run) -> None:
    """`python -m bench.NAME [--quick] [--out DIR]` for a module's run(out_dir, quick)."""
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder")
    a = ap.parse_args()
    run(a.out, a.quick)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def produce_all(producer, topic: str, partitions: int, value: bytes, count: int, on_delivery,
                every_record=None) -> None:
    """confluent-kafka: send count records round-robin over partitions, waiting out a full
    local queue; every_record(i) runs after record i (a transaction commit, say)."""
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=value, partition=i % partitions, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.001)
        if i % 1000 == 0:
            producer.poll(0)
        if every_record is not None:
            every_record(i)
