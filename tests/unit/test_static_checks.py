"""The linter and the type checker, run as part of the suite.

`ruff check` and `mypy` read their settings from pyproject.toml (which rules, which
packages at which level: docs/architecture.md "Static checks"). Each runs as a
subprocess from the same virtual environment as the tests, and its findings are the
failure message.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process   # ruff and mypy run as subprocesses

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_COLOR="1")
    return subprocess.run([str(BIN / tool), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def test_ruff_finds_nothing():
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing():
    # --cache-dir under the venv: parallel worktrees and a read-only checkout keep their own
    done = _run("mypy", "--cache-dir", str(BIN.parent / ".mypy_cache"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_checks_would_see_a_fault(tmp_path):
    # The same settings fail an unused import and an untyped protocol-style function.
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\n\ndef f(x):\n    return x\n")
    lint = _run("ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"), str(bad))
    assert lint.returncode != 0 and "F401" in lint.stdout, lint.stdout + lint.stderr
    typed = _run("mypy", "--no-incremental", "--strict", "--ignore-missing-imports", str(bad))
    assert typed.returncode != 0 and "no-untyped-def" in typed.stdout, typed.stdout + typed.stderr
