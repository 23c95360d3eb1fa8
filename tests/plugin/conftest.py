"""Fixtures of the plugin's tests (tests/support/plugin_projects.py runs them)."""
from __future__ import annotations

import pytest

from tests.support.plugin_projects import run_project


@pytest.fixture
def project(tmp_path):
    """project({"test_x.py": "source.py"}, *pytest_args) -> Outcome."""
    return lambda files, *args, **kw: run_project(tmp_path / "project", files, *args, **kw)
