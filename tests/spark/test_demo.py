"""`semel demo` end to end as a user runs it: its own broker and pgserver, the Spark
job SIGKILLed twice (one random moment, one through the sink's commit-step hook),
then the verifier's table. Small N so it fits CI; the exit status and the table
are the assertions."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROWS = ("demo-output", "postgres", "files")


def run_demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "semel.cli.main", "demo", "--data-dir", str(tmp_path / "work"),
                           *args], capture_output=True, text=True, env=env, timeout=900)


def row(out: str, name: str) -> list[str]:
    """The cells of the final table's row `name`."""
    lines = [ln for ln in out.splitlines() if re.search(rf"│\s*{re.escape(name)}\s*│", ln)]
    assert lines, f"no row {name!r} in:\n{out}"
    return [c.strip() for c in lines[-1].split("│")[2:-1]]


def test_demo_survives_crashes_exactly_once(tmp_path):
    n = 90
    r = run_demo(tmp_path, "--records", str(n), "--crashes", "2", "--rate", "30", "--seed", "7")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert row(out, "inputs (demo-input)")[:1] == [str(n)]
    for name in ROWS:  # records, duplicates, missing, unexpected, verdict
        assert row(out, name) == [str(n), "0", "0", "0", "ok"], out
    assert row(out, "crashes survived")[0] == "2"
    assert list((tmp_path / "work").glob("processor-3.log")), "the job was not restarted after each crash"


def test_demo_broker_only_round_trip(tmp_path):
    r = run_demo(tmp_path, "--broker-only", "--records", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4/4 records back" in r.stdout
