"""Stress run of the follower-truncation model (tests/cluster/test_truncation_model.py)
with followers writing in worker threads, over many seeds, in each way the workers
can be timed:

- "stepped": the workers are a StepRunner, so each seed picks one ordering of the
  pwrites against the loop's steps (role changes, truncations, restarts, awaits of
  earlier roles' writes); every seed is a different ordering, replayed exactly;
- "threads": the logs' real worker pool, where the OS decides; run once as is and once
  beside busy-loop processes (`--busy`), which is how a thread's pwrite comes late.

Every invariant of the model is checked after every step. Writes
bench/results/truncation_stress.json: seeds and runs per phase, failures (each with
its seed and message; the expected count is 0), seconds, load average.

    .venv/bin/python -m bench.truncation_stress [--seeds 300] [--busy 2] [--dir /dev/shm]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS, SHARED_BOX, load_fields, write_result  # noqa: E402
from tests.cluster.test_truncation_model import run_model  # noqa: E402


def spin() -> None:
    while True:
        pass


def phase(name: str, seeds: int, real_threads: bool, busy: int, base_dir: str | None) -> dict:
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(busy)]
    for s in spinners:
        s.start()
    started, load = time.perf_counter(), os.getloadavg()
    failures, runs = [], 0
    try:
        for seed in range(seeds):
            for via_fetch in (False, True):
                runs += 1
                with tempfile.TemporaryDirectory(dir=base_dir) as d:
                    try:
                        asyncio.run(run_model(Path(d), seed, via_fetch, True, real_threads=real_threads))
                    except Exception as exc:     # any failure is a finding: record it, go on
                        failures.append({"seed": seed, "via_fetch": via_fetch, "error": repr(exc),
                                         "where": traceback.format_exc(limit=3).splitlines()[-3:]})
            if seed % 50 == 49:
                print(f"{name}: {seed + 1} seeds, {len(failures)} failures", flush=True)
    finally:
        for s in spinners:
            s.terminate()
            s.join()
    return {"phase": name, "workers": "real threads" if real_threads else "StepRunner",
            "busy_loop_processes": busy, "seeds": seeds, "runs": runs, "failures_found": len(failures),
            "failures": failures, "seconds": round(time.perf_counter() - started, 1), **load_fields(load)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=300, help="seeds per phase (each runs both truncation ways)")
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes beside the loaded phase")
    ap.add_argument("--dir", default=None, help="where the logs go (a tmpfs makes fsyncs free)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    phases = [phase("stepped", a.seeds, False, 0, a.dir),
              phase("threads", a.seeds, True, 0, a.dir),
              phase("threads under load", a.seeds, True, a.busy, a.dir)]
    total = sum(p["failures_found"] for p in phases)
    path = write_result(a.out, "truncation_stress", {
        "what": "test_truncation_model's threaded follower model over many seeds; invariants after every step",
        "box": SHARED_BOX, "logs_on": a.dir or tempfile.gettempdir(), "runs": sum(p["runs"] for p in phases),
        "failures_found": total, "phases": phases})
    print(f"{path}: {total} failures in {sum(p['runs'] for p in phases)} runs")
    sys.exit(1 if total else 0)


if __name__ == "__main__":
    main()
