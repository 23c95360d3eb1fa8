"""Where FUSE is missing the power-cut tests skip with the reason, except in CI, where
they fail: the durability they show must not go unchecked silently."""
from __future__ import annotations

import pytest

import semel.launch.lazyfs as lazyfs
from tests.support.powercut import require_fuse


@pytest.fixture
def no_fuse(monkeypatch):
    monkeypatch.setattr(lazyfs, "fuse_unavailable_reason", lambda: "fusermount3 is not installed")


def test_missing_fuse_skips_outside_ci(no_fuse, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="fusermount3 is not installed"):
        require_fuse()


def test_missing_fuse_fails_in_ci(no_fuse, monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required in CI"):
        require_fuse()


def test_power_cut_disk_says_why_it_cannot_start(no_fuse, tmp_path):
    disk = lazyfs.PowerCutDisk(tmp_path / "b", tmp_path / "m")
    with pytest.raises(lazyfs.FuseUnavailable, match="fusermount3"):
        disk.start()
    assert disk.proc is None


def test_ci_script_installs_fuse_when_missing():
    from tests.support.markers import TESTS
    script = (TESTS.parent / ".ci" / "run").read_text()
    assert "command -v fusermount3" in script and "apt-get install" in script and "fuse3" in script
    assert script.index("apt-get install") < script.index("./run test")


def test_logged_errors_finds_failures_inside_the_layer(tmp_path):
    disk = lazyfs.PowerCutDisk(tmp_path / "b", tmp_path / "m", log_path=tmp_path / "lazyfs.log")
    assert disk.logged_errors() == []
    (tmp_path / "lazyfs.log").write_text(
        "2026-01-01 00:00:00,000 WARNING semel.lazyfs: slow\n"
        "2026-01-01 00:00:01,000 ERROR fuse: Uncaught exception from FUSE operation readdir_fuse_3\n"
        "Traceback (most recent call last):\n")
    assert len(disk.logged_errors()) == 2
