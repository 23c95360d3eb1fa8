"""Quix Streams against the plugin, in an environment of its own: Quix Streams 3.28
requires confluent-kafka<2.13, which the dev set's pin excludes. The environment is
`pip install <this repo> quixstreams pytest` (no extras), as a user installs it, built
once per set of versions under .venv-extra/ and reused; needs the package index."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.plugin_projects import run_project

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
PINS = ["quixstreams==3.28.1", "pytest==9.2.0"]


def quix_env() -> Path:
    """The environment's python, built on first use; keyed by the pins and semel's
    pyproject.toml (a change to either builds a new one)."""
    key = hashlib.sha256(("\n".join(PINS) + (REPO / "pyproject.toml").read_text() + sys.version).encode())
    env = REPO / ".venv-extra" / f"quix-{key.hexdigest()[:12]}"
    python = env / "bin" / "python"
    if not (env / ".built").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        r = subprocess.run([str(python), "-m", "pip", "install", "-q", str(REPO), *PINS],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"building the Quix Streams environment failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        (env / ".built").write_text("")
    return python


def test_quix_streams_app(tmp_path):
    python = quix_env()
    # The environment's own installed semel: no PYTHONPATH from the suite's run.
    out = run_project(tmp_path, {"test_quix.py": "quix_app.py"}, python=str(python), env={"PYTHONPATH": ""},
                      timeout_s=300)
    assert out.results == {"test_round_trip": "passed",
                           "test_exactly_once_through_a_broker_kill": "passed"}, out.output[-5000:]
