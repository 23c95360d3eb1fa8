"""A broker process that `semel check` manages itself, so it may kill and restart it.

Broker faults are possible only here: against a broker somebody else runs
(`--bootstrap`), check can reach it only over the wire.

The command is a template: {port}, {data} and {host} are filled in, e.g.
    semel broker start --data-dir {data} --port {port}
Extra environment (SEMEL_FS_FAULTS for storage faults) is given per start, so
a fault episode is: kill, start with the fault, kill, start without it.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from ..launch.process import free_port, wait_for_port

SEMEL_TEMPLATE = f"{shlex.quote(sys.executable)} -m semel.cli.main broker start --data-dir {{data}} --port {{port}}"


class BrokerStartError(RuntimeError):
    pass


class ManagedBroker:
    def __init__(self, template: str, data_dir: Path, log_path: Path, port: int | None = None,
                 host: str = "127.0.0.1"):
        self.template = template
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path)
        self.host = host
        self.port = port or free_port(host)
        self.proc: subprocess.Popen | None = None
        self.env_extra: dict = {}
        self.starts = 0
        # The power-cut disk (semel.launch.lazyfs) the data directory is mounted from,
        # when the power-loss fault is asked for; the caller starts and stops it.
        self.disk = None
        self.command()  # a bad template fails now, not at the first restart

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        try:
            text = self.template.format(port=self.port, data=shlex.quote(str(self.data_dir)), host=self.host)
        except (KeyError, IndexError, ValueError) as exc:
            raise BrokerStartError(f"broker command template {self.template!r}: {exc}; "
                                   "use {port}, {data} and {host}") from None
        argv = shlex.split(text)
        if not argv:
            raise BrokerStartError("broker command is empty")
        return argv

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, env_extra: dict | None = None, timeout_s: float = 60.0) -> None:
        if self.alive():
            raise BrokerStartError("broker already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.env_extra = dict(env_extra or {})
        env = dict(os.environ, **self.env_extra)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts} env={self.env_extra} ===\n".encode())
            try:
                self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                raise BrokerStartError(f"cannot run broker command: {exc.strerror or exc}") from None
        self.starts += 1
        self._wait_listening(timeout_s)

    def _wait_listening(self, timeout_s: float) -> None:
        try:
            wait_for_port(self.host, self.port, timeout_s, self.proc)
        except RuntimeError:
            raise BrokerStartError(f"broker exited with status {self.proc.returncode} before listening "
                                   f"(log: {self.log_path})") from None
        except TimeoutError:
            raise BrokerStartError(f"broker not listening on {self.bootstrap} after {timeout_s:.0f}s") from None

    def _signal_group(self, sig: int) -> None:
        # The broker runs in its own session: signal its group so helpers die too.
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, unflushed state is gone."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGCONT)
        self._signal_group(signal.SIGKILL)
        self.proc.wait(30)

    def pause(self) -> None:
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait for a clean exit; SIGKILL if it does not come."""
        if not self.alive():
            return
        self._signal_group(signal.SIGCONT)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def close(self) -> None:
        if self.alive():
            self.kill()
