"""Bad input and ends that go wrong: a broker that cannot start fails the set-up with
one readable line (its own last words) and no wait past the bound; no broker outlives
the run, after a failing test, Ctrl-C, or the run being killed."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

from tests.support.plugin_projects import PROJECTS, plugin_args, run_project

FILES = {"test_failures.py": "failures.py"}


def setup_error(out_dir) -> str:
    """The message of the one set-up error in the project's junit file."""
    errors = [e.get("message") for e in ET.parse(out_dir / "junit.xml").getroot().iter("error")]
    assert len(errors) == 1, errors
    return errors[0]


def test_port_taken_fails_setup_with_the_brokers_reason(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = run_project(tmp_path, FILES, "-k", "needs_the_broker", f"--semel-port={port}", timeout_s=120)
    msg = setup_error(tmp_path)
    assert out.results == {"test_needs_the_broker": "error"}, out.output[-3000:]
    assert "\n" not in msg.strip() and f"127.0.0.1:{port} did not start" in msg and "address already in use" in msg, msg


def test_unusable_data_dir_fails_setup_with_the_brokers_reason(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = run_project(tmp_path / "p", FILES, "-k", "needs_the_broker",
                      f"--semel-data-dir={tmp_path / 'a-file' / 'data'}", timeout_s=120)
    msg = setup_error(tmp_path / "p")
    assert out.results == {"test_needs_the_broker": "error"}, out.output[-3000:]
    assert "\n" not in msg.strip() and "cannot use data dir" in msg and "Not a directory" in msg, msg


def test_start_timeout_bounds_the_wait(tmp_path):
    """A broker that does not listen in time (a 10 ms bound no start meets) fails
    the set-up instead of waiting on."""
    out = run_project(tmp_path, FILES, "-k", "needs_the_broker", "--semel-start-timeout=0.01", timeout_s=120)
    assert out.results == {"test_needs_the_broker": "error"}, out.output[-3000:]
    assert "did not start (nothing listening" in setup_error(tmp_path)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"   # exited, not yet reaped
    except FileNotFoundError:
        return True


def wait_gone(pids: list[int], timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if not gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def pids(path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def test_no_broker_outlives_a_failing_test(tmp_path):
    pid_file = tmp_path / "pids"
    out = run_project(tmp_path / "p", FILES, "-k", "fails_holding", env={"PIDS_FILE": str(pid_file)})
    assert out.results == {"test_fails_holding_brokers": "failed"}, out.output[-3000:]
    held = pids(pid_file)
    assert len(held) == 2 and wait_gone(held, 5) == []


def start_and_wait_for_pids(tmp_path):
    """The project's waiting test in a pytest process of its own; returns it and the pids."""
    pid_file = tmp_path / "pids"
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "test_failures.py").write_text((PROJECTS / "failures.py").read_text())
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(),
                            "-k", "interrupted_holding"], cwd=tmp_path / "p",
                           env=dict(os.environ, PIDS_FILE=str(pid_file)),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        assert run.poll() is None, "the project's run ended before its test started"
        time.sleep(0.1)
    return run, pids(pid_file)


def test_no_broker_outlives_ctrl_c(tmp_path):
    run, held = start_and_wait_for_pids(tmp_path)
    run.send_signal(signal.SIGINT)
    assert run.wait(60) != 0
    assert len(held) == 2 and wait_gone(held, 5) == []


def test_no_broker_outlives_a_killed_run(tmp_path):
    run, held = start_and_wait_for_pids(tmp_path)
    run.kill()
    run.wait(10)
    assert len(held) == 2 and wait_gone(held, 10) == []
