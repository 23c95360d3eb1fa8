"""Broker restart time against log size: a real broker process is filled over
the wire, SIGKILLed, and restarted; we time from spawn to serving Metadata and
check that every acknowledged record is still readable.

    python -m bench.broker_restart_bench [--quick]
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.common import RESULTS, main, write_result
from semel.client import Client
from semel.launch.process import SemelBroker
from semel.protocol import records

MiB = 1024 * 1024
BATCH = records.build_batch([(None, b"r" * 1024)] * 256)  # 256 KiB per batch, 256 records


def fill(client: Client, topic: str, partitions: int, size: int) -> int:
    """Produce `size` bytes spread over the partitions; returns records acknowledged."""
    acked = 0
    for i in range(size // len(BATCH)):
        err, _ = client.produce(topic, i % partitions, BATCH, acks=-1)
        if err:
            raise RuntimeError(f"produce failed: {err.name}")
        acked += 256
    return acked


def timed_restart(broker: SemelBroker) -> float:
    t0 = time.perf_counter()
    broker.start(timeout_s=120)
    with Client(broker.bootstrap) as c:
        c.metadata(None)
    return time.perf_counter() - t0


def measure(tmp: Path, size: int, partitions: int = 4) -> dict:
    broker = SemelBroker(tmp / f"data-{size}", log_path=tmp / f"broker-{size}.log")
    broker.start()
    try:
        with Client(broker.bootstrap) as c:
            c.create_topic("fill", partitions)
            acked = fill(c, "fill", partitions, size)
        broker.stop()                       # clean shutdown: checkpoints written
        clean = timed_restart(broker)
        with Client(broker.bootstrap) as c:  # a tail written just before the kill
            fill(c, "fill", partitions, 32 * MiB)
            acked += 32 * MiB // len(BATCH) * 256
        broker.kill()                       # SIGKILL: recovery scans the unflushed tail
        crash = timed_restart(broker)
        with Client(broker.bootstrap) as c:
            present = sum(c.list_offset("fill", p, -1) for p in range(partitions))
        return {"log_bytes": size + 32 * MiB, "partitions": partitions, "restart_after_clean_stop_s": round(clean, 3),
                "restart_after_sigkill_s": round(crash, 3), "acked_records": acked, "records_after_restart": present,
                "nothing_lost": present == acked}
    finally:
        broker.close()


def run(out_dir: Path = RESULTS, quick: bool = False) -> dict:
    sizes = [64 * MiB, 256 * MiB] + ([] if quick else [1024 * MiB])
    with tempfile.TemporaryDirectory(prefix="semel-brestart-") as tmp:
        rows = [measure(Path(tmp), s) for s in sizes]
    for r in rows:
        print(r, flush=True)
    result = {"what": "broker process restart (spawn to serving) after filling it over the wire",
              "target_seconds_at_1GiB": 5.0, "rows": rows, "quick": quick}
    write_result(out_dir, "broker_restart", result)
    return result


if __name__ == "__main__":
    main(run)
