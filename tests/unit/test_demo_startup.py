"""`semel demo` starts without platformdirs' RuntimeDirWarning where XDG_RUNTIME_DIR is
unset (a root shell, a container, CI): pgserver's import asks for that directory."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process   # each import runs in a fresh Python process

pytest.importorskip("pgserver")


def _stderr_of(code: str, tmp_path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    done = subprocess.run([sys.executable, "-W", "default::UserWarning", "-c", code], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_demo_imports_pgserver_without_the_warning(tmp_path):
    assert "RuntimeDirWarning" not in _stderr_of(
        "from semel.cli.spark_demo import import_pgserver; import_pgserver()", tmp_path)


def test_a_plain_import_of_pgserver_shows_it(tmp_path):
    # What the test above guards against, seen in the same environment.
    if not hasattr(pytest.importorskip("platformdirs"), "RuntimeDirWarning"):
        pytest.skip("this platformdirs has no RuntimeDirWarning")
    assert "RuntimeDirWarning" in _stderr_of("import pgserver", tmp_path)
