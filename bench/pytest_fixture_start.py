"""Start time of the pytest plugin's single-broker fixture (target: median <= 1 s).

Each round does what `semel_broker_fresh` does at set-up: Broker.create(...).start()
(a `semel broker start` process until its port accepts a connection), then what a
test's first `semel_topic()` adds (CreateTopics and a leader in Metadata), then
closes it. For scale, each round also times the bare interpreter (`python -c pass`)
and the broker's imports (`python -c "import semel.broker.server"`), the floor a
broker process cannot start under. Rounds run one after another on the shared box;
the load average at start and end is in the file. Writes
bench/results/pytest_fixture_start.json.

    python -m bench.pytest_fixture_start [--quick]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import SHARED_BOX, load_fields, main, write_result
from semel.testing.broker import Broker


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _summary(xs: list[float]) -> dict:
    xs = sorted(xs)
    return {"median_s": round(statistics.median(xs), 3), "p90_s": round(xs[int(0.9 * (len(xs) - 1))], 3),
            "min_s": round(xs[0], 3), "max_s": round(xs[-1], 3), "n": len(xs)}


def one_round(base: Path) -> dict:
    broker = Broker.create(base)
    try:
        start = _seconds(broker.start)
        topic = _seconds(lambda: broker.topics("bench").make(partitions=3))
    finally:
        broker.close()
    py = _seconds(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True))
    imports = _seconds(lambda: subprocess.run([sys.executable, "-c", "import semel.broker.server"], check=True))
    return {"start": start, "first_topic": topic, "python": py, "broker_imports": imports}


def run(out_dir: Path, quick: bool) -> dict:
    n = 5 if quick else 21
    load = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="semel-fixture-bench-") as d:
        for i in range(n):
            rounds.append(one_round(Path(d) / f"r{i}"))
    result = {
        "what": "semel_broker_fresh set-up: Broker.create().start() until the port accepts; then the first "
                "semel_topic() (3 partitions)",
        "target": "start median <= 1 s",
        "machine_note": SHARED_BOX,
        **{k: _summary([r[k] for r in rounds]) for k in ("start", "first_topic", "python", "broker_imports")},
        "start_plus_topic": _summary([r["start"] + r["first_topic"] for r in rounds]),
        **load_fields(load),
    }
    write_result(out_dir, "pytest_fixture_start" + ("-quick" if quick else ""), result)
    print(f"start median {result['start']['median_s']}s p90 {result['start']['p90_s']}s; "
          f"imports median {result['broker_imports']['median_s']}s")
    return result


if __name__ == "__main__":
    main(run)
