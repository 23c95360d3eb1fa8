"""Scale-out (issue 10 point 6): examples/spark_standalone.py starts a Spark standalone
master and two workers from the pyspark installation and runs the unchanged demo job
on them against its own semel broker, with one SIGKILL of the job; the demo's
verifier must find every output exactly once. The workers run in their own mount
namespace in which the job's checkpoint directory is an empty tmpfs, as on a
cluster whose nodes cannot see the driver's disk: no task may need the checkpoint."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spark.test_demo import ROWS, row

SCRIPT = Path(__file__).parents[2] / "examples" / "spark_standalone.py"


@pytest.mark.slow
def test_demo_job_exactly_once_on_standalone_cluster(tmp_path):
    n = 60
    env = dict(os.environ, COLUMNS="200", PYTHONUNBUFFERED="1")
    work = tmp_path / "work"
    r = subprocess.run([sys.executable, str(SCRIPT), "--cluster-dir", str(tmp_path / "cluster"), "--records", str(n),
                        "--crashes", "1", "--rate", "30", "--seed", "5", "--data-dir", str(work),
                        "--hide-from-workers", str(work / "ck")],
                       capture_output=True, text=True, env=env, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "Spark standalone cluster at spark://" in out
    assert f"the workers cannot see {work / 'ck'}" in out
    assert list((work / "ck" / "kafka" / "offsets").iterdir()), "the sink's checkpoint is not in the hidden directory"
    for name in ROWS:
        assert row(out, name) == [str(n), "0", "0", "0", "ok"], out
    # the executors ran on the workers, not in the driver
    assert list((tmp_path / "cluster").glob("worker-*/app-*/*/stderr")), "no executor ran on a worker"
