"""Power-cut disks (semel.launch.lazyfs) for tests: skip where FUSE is missing, except
in CI (CI=true), where a missing FUSE is a failure: the durability tests must run there."""
from __future__ import annotations

import os
from contextlib import contextmanager

import pytest

from tests.support.markers import starts_processes


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_fuse() -> None:
    from semel.launch.lazyfs import fuse_unavailable_reason
    reason = fuse_unavailable_reason()
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"FUSE is required in CI for the power-cut tests: {reason}")
    pytest.skip(f"FUSE unavailable: {reason}")


@contextmanager
def power_cut_disk(base, name: str = "disk", seed: int | None = None):
    """A started PowerCutDisk with backing dir base/NAME-backing mounted at base/NAME;
    on a clean exit its daemons must have logged no error."""
    from semel.launch.lazyfs import PowerCutDisk
    require_fuse()
    disk = PowerCutDisk(base / f"{name}-backing", base / name, seed=seed)
    disk.start()
    try:
        yield disk
    finally:
        disk.stop()
    assert disk.logged_errors() == [], f"the power-cut disk failed inside (log: {disk.log_path})"


@pytest.fixture
@starts_processes
def disk(tmp_path):
    """One power-cut disk per test, at tmp_path/disk."""
    with power_cut_disk(tmp_path) as d:
        yield d
