"""Restart benchmark: how long PartitionLog.open takes on big logs.

For each size (64 MiB, 256 MiB, 1 GiB of 1 KiB records in 16-record batches):
- clean: the log was closed normally, then opened again;
- crash: the recovery checkpoint is 64 MiB behind the end (as after a SIGKILL with
  64 MiB never flushed) and the last batch is torn in half.
Target: well under 5 s for 1 GiB in both cases.

    python bench/restart_bench.py [--quick] [--out bench/results]

`run(out_dir, quick)` is the entry point for `semel bench`; quick stops at 256 MiB.
Results go to <out_dir>/restart.json (restart-quick.json for quick runs).
Timings are of a warm page cache (the benchmark cannot drop the kernel's cache).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from semel.protocol.records import build_batch, iter_batches, split_batches
from semel.storage import LogConfig, PartitionLog
from semel.storage.checkpoint import FILE_NAME as CHECKPOINT

MiB = 1024 * 1024
RECORD = 1024
PER_BATCH = 16
UNFLUSHED = 64 * MiB
TARGET_S = 5.0

CONFIG = LogConfig(flush_mode="never", checkpoint_interval_bytes=1 << 40, checkpoint_interval_ms=1 << 40)


def _payload() -> tuple[bytes, list]:
    data = build_batch([(b"k%05d" % i, os.urandom(RECORD)) for i in range(PER_BATCH)])
    batches, err = split_batches(data)
    assert err == 0
    return data, batches


def build_log(directory: Path, size: int, *, unflushed: int = 0) -> tuple[float, bytes | None]:
    """Append size bytes; with unflushed > 0, save the checkpoint taken that far from the end.

    Returns (seconds, checkpoint bytes to restore or None)."""
    data, batches = _payload()
    plog = PartitionLog.open(directory, CONFIG)
    started = time.perf_counter()
    saved = None
    mark = size - unflushed
    while plog.size_bytes() < size:
        plog.append(data, batches)
        if unflushed and saved is None and plog.size_bytes() >= mark:
            plog.flush(checkpoint=True)
            saved = (directory / CHECKPOINT).read_bytes()
    if unflushed:
        plog.abandon()         # the process dies: nothing more reaches the disk's bookkeeping
    else:
        plog.close()
    return time.perf_counter() - started, saved


def simulate_crash(directory: Path, saved_checkpoint: bytes) -> int:
    """Put back the old checkpoint and tear the last batch; returns the bytes of it left behind."""
    (directory / CHECKPOINT).write_bytes(saved_checkpoint)
    last = sorted(p for p in directory.iterdir() if p.suffix == ".log")[-1]
    pos, hdr = list(iter_batches(last.read_bytes()))[-1]   # not timed: a plain walk is fine
    cut = pos + hdr.size // 2
    with open(last, "r+b") as f:
        f.truncate(cut)
    return cut - pos


def time_open(directory: Path, repeats: int = 1) -> tuple[float, PartitionLog]:
    times, plog = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        plog = PartitionLog.open(directory, CONFIG)
        times.append(time.perf_counter() - started)
        if len(times) < repeats:
            plog.close()
    return statistics.median(times), plog


def bench_size(work: Path, size: int) -> dict:
    clean_dir, crash_dir = work / f"clean-{size}", work / f"crash-{size}"
    build_s, _ = build_log(clean_dir, size)
    clean_s, plog = time_open(clean_dir, repeats=3)
    clean_info = plog.recovery
    end = plog.log_end_offset
    plog.close()
    shutil.rmtree(clean_dir)

    _, saved = build_log(crash_dir, size, unflushed=UNFLUSHED)
    torn = simulate_crash(crash_dir, saved)
    crash_s, plog = time_open(crash_dir)
    info = plog.recovery
    result = {
        "size_bytes": size,
        "records": end,
        "build_seconds": round(build_s, 3),
        "clean_open_seconds": round(clean_s, 4),
        "clean_open_checked_bytes": clean_info.crc_checked_bytes,
        "crash_open_seconds": round(crash_s, 4),
        "crash_crc_checked_bytes": info.crc_checked_bytes,
        "crash_truncated_bytes": info.truncated_bytes,
        "crash_torn_batch_bytes_left": torn,
        "crash_lost_records": end - plog.log_end_offset,
    }
    plog.close()
    shutil.rmtree(crash_dir)
    return result


def run(out_dir: str | Path = "bench/results", quick: bool = False) -> dict:
    sizes = [64 * MiB, 256 * MiB] + ([] if quick else [1024 * MiB])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="semel-restart-") as tmp:
        rows = [bench_size(Path(tmp), s) for s in sizes]
    worst = max(max(r["clean_open_seconds"], r["crash_open_seconds"]) for r in rows)
    result = {
        "benchmark": "restart",
        "what": "PartitionLog.open after a clean close and after a crash with 64 MiB unflushed + torn last batch",
        "record_bytes": RECORD, "records_per_batch": PER_BATCH, "unflushed_bytes": UNFLUSHED,
        "target_seconds": TARGET_S,
        "target_met": worst < TARGET_S,
        "page_cache": "warm",
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": rows,
    }
    path = out_dir / ("restart-quick.json" if quick else "restart.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    result["path"] = str(path)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="stop at 256 MiB")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    logging.getLogger("semel.storage").setLevel(logging.ERROR)   # the torn tail is expected
    result = run(args.out, args.quick)
    for r in result["rows"]:
        print(f"{r['size_bytes'] // MiB:5d} MiB  clean open {r['clean_open_seconds']:.3f} s   "
              f"crash open {r['crash_open_seconds']:.3f} s  (checked {r['crash_crc_checked_bytes'] // MiB} MiB, "
              f"cut {r['crash_truncated_bytes']} B)")
    print(f"target < {TARGET_S} s met: {result['target_met']}  -> {result['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
