"""`semel --version` prints the installed version and exits 0."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from semel.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_version_prints_the_projects_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert capsys.readouterr().out.strip() == f"semel {project['version']}"
