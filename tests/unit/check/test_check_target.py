"""The managed-broker seam of the fault layer, on a stand-in server process:
start on a fixed port, SIGKILL, restart with fault environment, clean stop."""
from __future__ import annotations

import shlex
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.support.markers import starts_processes

from semel.check.target import BrokerStartError, ManagedBroker

# A stand-in "broker": records its environment's SEMEL_FS_FAULTS, then listens.
SERVER = (
    "import os, socket, sys, time\n"
    "open(sys.argv[2], 'a').write(os.environ.get('SEMEL_FS_FAULTS', '-') + '\\n')\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
    "while True: time.sleep(1)\n"
)


@pytest.fixture
@starts_processes
def stand_in(tmp_path):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    envlog = tmp_path / "env.log"
    template = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {{port}} {shlex.quote(str(envlog))}"
    broker = ManagedBroker(template, tmp_path / "data", tmp_path / "broker.log")
    yield broker, envlog
    broker.close()


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def test_kill_and_restart_on_the_same_port_with_fault_env(stand_in):
    broker, envlog = stand_in
    broker.start()
    first_pid = broker.proc.pid
    assert listening(broker.port)
    broker.kill()
    assert not broker.alive() and broker.proc.returncode == -9
    assert not listening(broker.port)
    broker.start({"SEMEL_FS_FAULTS": "fsync_delay_ms=50"})
    assert broker.alive() and broker.proc.pid != first_pid and listening(broker.port)
    broker.kill()
    broker.start()
    assert envlog.read_text().splitlines() == ["-", "fsync_delay_ms=50", "-"]
    assert (broker.data_dir).is_dir()
    broker.stop()
    assert not broker.alive()
    assert "=== start 2" in Path(broker.log_path).read_text()


def test_pause_and_resume(stand_in):
    broker, _ = stand_in
    broker.start()
    broker.pause()
    assert wait_state(broker.proc.pid, "T")  # stopped
    broker.resume()
    assert wait_state(broker.proc.pid, "S")
    assert listening(broker.port)


def wait_state(pid: int, want: str) -> bool:
    """Signals land asynchronously: look a few times for the process state."""
    for _ in range(100):
        with open(f"/proc/{pid}/stat") as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == want:
                return True
        time.sleep(0.02)
    return False


@pytest.mark.process
def test_a_command_that_exits_is_a_clear_error(tmp_path):
    broker = ManagedBroker(f"{shlex.quote(sys.executable)} -c 'raise SystemExit(3)'", tmp_path / "d",
                           tmp_path / "b.log")
    with pytest.raises(BrokerStartError, match="exited with status 3 before listening"):
        broker.start(timeout_s=10)


@pytest.mark.process
def test_a_missing_program_is_a_clear_error(tmp_path):
    broker = ManagedBroker("/nonexistent/broker --port {port}", tmp_path / "d", tmp_path / "b.log")
    with pytest.raises(BrokerStartError, match="cannot run broker command"):
        broker.start()


@pytest.mark.parametrize("template", ["broker --port {prt}", "   ", "broker {0}"])
def test_bad_templates_fail_at_construction(tmp_path, template):
    with pytest.raises(BrokerStartError):
        ManagedBroker(template, tmp_path / "d", tmp_path / "b.log")
