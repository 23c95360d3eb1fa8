"""Run `semel check` as a real command and read back its outputs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TANSU_TEMPLATE = ("{tansu} broker --listener-url tcp://{{host}}:{{port}} "
                  "--advertised-listener-url tcp://{{host}}:{{port}}")


def run_check(out: Path, *args: str, timeout_s: float = 240) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "semel.cli.main", "check", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=timeout_s)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return proc, summary


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-3000:]}"
