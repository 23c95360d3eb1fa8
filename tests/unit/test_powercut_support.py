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


def _ensure_test_packages(tmp_path, present: list[str]) -> tuple[int, str, str]:
    """Run ./run's ensure_test_packages as root on a PATH holding only `present` of the
    tools it looks for and a fake apt-get that records its arguments."""
    import subprocess
    from tests.support.markers import TESTS
    text = (TESTS.parent / "run").read_text()
    start = text.index("ensure_test_packages() {")
    func = text[start:text.index("\n}\n", start) + 3]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / ".venv").mkdir()
    fakes = {"apt-get": 'echo "$@" >> "$APT_LOG"', "id": "echo 0"}
    fakes.update({name: "true" for name in present})
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = f"set -euo pipefail\n{func}\nensure_test_packages\n"
    got = subprocess.run(["/bin/bash", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                         env={"PATH": str(bin_dir), "APT_LOG": str(tmp_path / "apt-args")})
    apt = (tmp_path / "apt-args").read_text() if (tmp_path / "apt-args").exists() else ""
    return got.returncode, apt, got.stderr


def test_run_test_installs_the_packages_the_tests_need_when_missing(tmp_path):
    rc, apt, err = _ensure_test_packages(tmp_path, present=[])
    assert rc == 0, err
    assert "install -y -qq fuse3 libfuse3-3 chromium" in apt, apt
    assert apt.index("update") < apt.index("install")


def test_run_test_installs_nothing_when_the_packages_are_there(tmp_path):
    rc, apt, err = _ensure_test_packages(tmp_path, present=["fusermount3", "chromium"])
    assert (rc, apt, err) == (0, "", "")


def test_ci_runs_the_readme_test_command_with_ci_set():
    from tests.support.markers import TESTS
    script = (TESTS.parent / ".ci" / "run").read_text()
    assert 'export CI="${CI:-true}"' in script and script.rstrip().endswith("./run test")
    assert "ensure_test_packages; exec .venv/bin/python -m pytest" in (TESTS.parent / "run").read_text()


def test_logged_errors_finds_failures_inside_the_layer(tmp_path):
    disk = lazyfs.PowerCutDisk(tmp_path / "b", tmp_path / "m", log_path=tmp_path / "lazyfs.log")
    assert disk.logged_errors() == []
    (tmp_path / "lazyfs.log").write_text(
        "2026-01-01 00:00:00,000 WARNING semel.lazyfs: slow\n"
        "2026-01-01 00:00:01,000 ERROR fuse: Uncaught exception from FUSE operation readdir_fuse_3\n"
        "Traceback (most recent call last):\n")
    assert len(disk.logged_errors()) == 2
