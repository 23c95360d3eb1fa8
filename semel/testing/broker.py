"""`Broker`: one semel broker process as a test holds it, with faults on call.

A fault acts on the real process or its surroundings: kill() is SIGKILL (the page
cache keeps what was written), pause() is SIGSTOP, power_cut() loses what was not
fsynced (the data dir lives on semel.launch.lazyfs' power-cut file system), and
partition() drops its traffic in a router namespace (semel.launch.netns). The last
two need the broker set up for them at start (`power_cut=True`, `network=True`).
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..launch.lazyfs import PowerCutDisk, fuse_unavailable_reason
from ..launch.netns import Network, place
from ..launch.netns import available as netns_unavailable_reason
from ..launch.process import SemelBroker
from . import reaper
from .security import ClientSecurity, client_configs
from .topics import TopicFactory

# Brokers in tests: groups rebalance at once and accept short sessions, and topics are
# created on first use, as a Kafka broker's defaults do.
TEST_BROKER_ARGS = ("--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000",
                    "--auto-create-topics")


# What `semel broker start` prints once it serves (semel/broker/server.py).
READY_LINE = "semel broker ready on"


class BrokerStartError(RuntimeError):
    """A broker did not come up: one line with its own last words."""


class FaultUnavailable(RuntimeError):
    """A fault cannot be set up on this machine (no FUSE, not root): why, in one line."""


def last_line(path: Path | None) -> str:
    """The last non-empty line of a log (a broker that cannot start says why there)."""
    try:
        lines = [x.strip() for x in Path(path).read_text(errors="replace").splitlines() if x.strip()] if path else []
    except OSError:
        return ""
    return lines[-1] if lines else ""


def start_or_explain(proc, what: str, timeout_s: float, ready_line: str | None = None) -> None:
    """proc.start(timeout_s), or BrokerStartError naming `what` and the process's last
    log line; a process that neither listens nor exits in time is killed.

    `ready_line`: also wait for this line in the log from this start on: a port that
    accepts may be another program's (a taken port), the line only this process writes."""
    log = Path(proc.log_path)
    offset = log.stat().st_size if log.exists() else 0
    deadline = time.monotonic() + timeout_s
    try:
        proc.start(timeout_s)
        while ready_line is not None and ready_line not in _read_from(log, offset):
            if not proc.alive():
                raise RuntimeError(f"process exited with status {proc.proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {timeout_s}s")
            time.sleep(0.01)
    except (RuntimeError, TimeoutError, OSError) as exc:
        proc.close()
        said = last_line(proc.log_path)
        raise BrokerStartError(f"{what} did not start ({exc})" + (f": {said}" if said else "")) from None


def _read_from(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


class Broker:
    """A started semel broker: `bootstrap_servers` and the faults.

    kill() and power_cut() leave it down until restart(); pause() until resume() (or
    use `with broker.paused():`); partition() until heal()."""

    def __init__(self, process: SemelBroker, security: ClientSecurity | None = None, *,
                 disk: PowerCutDisk | None = None, network: Network | None = None, start_timeout_s: float = 30.0):
        self.process = process
        self.process.die_with_parent = True
        self.security = security or ClientSecurity()
        self.disk, self.network = disk, network
        self.start_timeout_s = start_timeout_s
        self._network_up = False

    @classmethod
    def create(cls, base: Path, *, data_dir: Path | None = None, port: int | None = None,
               extra_args: tuple[str, ...] = (), security: ClientSecurity | None = None, power_cut: bool = False,
               network: bool = False, start_timeout_s: float = 30.0) -> "Broker":
        """A broker (not started) with its log (and certificates, power-cut disk) under
        `base` and its data in `data_dir` (default base/data); FaultUnavailable when
        power_cut or network cannot be had here."""
        base = Path(base)
        base.mkdir(parents=True, exist_ok=True)
        security = security or ClientSecurity()
        disk = _power_cut_disk(base) if power_cut else None
        broker_dir = disk.mount / "data" if disk else Path(data_dir or base / "data")
        process = SemelBroker(broker_dir, port=port, log_path=base / "broker.log",
                              extra_args=[*TEST_BROKER_ARGS, *security.setup(base), *extra_args])
        broker = cls(process, security, disk=disk, network=_network(process) if network else None,
                     start_timeout_s=start_timeout_s)
        reaper.track(broker)
        return broker

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> "Broker":
        try:
            if self.disk is not None and not self.disk.mounted:
                self.disk.start()
            if self.network is not None and not self._network_up:
                self.network.create()
                self._network_up = True
            self.security.prepare(self.process.data_dir)
            start_or_explain(self.process, f"semel broker on {self.process.bootstrap}", self.start_timeout_s,
                             READY_LINE)
        except BaseException:
            self.close()
            raise
        return self

    def recover(self) -> None:
        """Undo what a test left: resumed, healed, running (a shared broker's next test
        starts from a working one)."""
        self.resume()
        if self.network is not None and self._network_up:
            self.network.heal()
        if not self.alive():
            self.start()

    def topics(self, prefix: str = "t") -> TopicFactory:
        """A TopicFactory on this broker (names start with `prefix`)."""
        return TopicFactory(lambda: self.security.connect(self.bootstrap_servers), prefix)

    def close(self) -> None:
        """Kill the broker and take down what it stood on; safe to call twice."""
        self.process.close()
        if self.network is not None:
            self.network.close()
            self._network_up = False
        if self.disk is not None:
            self.disk.stop()
        reaper.untrack(self)

    # -- addresses -------------------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        return self.process.bootstrap

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def data_dir(self) -> Path:
        return self.process.data_dir

    @property
    def log_path(self) -> Path:
        return Path(self.process.log_path)

    def client_configs(self) -> dict[str, dict]:
        """{"confluent": ..., "kafka_python": ..., "aiokafka": ...}: settings to splat into
        each library's producer, consumer or admin client."""
        return client_configs(self.bootstrap_servers, self.security)

    # -- faults ----------------------------------------------------------------------------
    def alive(self) -> bool:
        return self.process.alive()

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs; what it wrote stays in the page cache."""
        self.process.resume()   # a stopped process takes SIGKILL too, but say what it is
        self.process.kill()

    def restart(self) -> "Broker":
        """Kill it if it runs, then start it again on the same port and data."""
        if self.process.alive():
            self.kill()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open and nothing is answered."""
        self.process.pause()

    def resume(self) -> None:
        self.process.resume()

    @contextmanager
    def paused(self) -> Iterator["Broker"]:
        self.pause()
        try:
            yield self
        finally:
            self.resume()

    def power_cut(self, torn: bool = False) -> None:
        """The machine loses power: the broker dies and its disk keeps only what was
        fsynced (`torn`: also a random part of each pending write)."""
        if self.disk is None:
            raise FaultUnavailable("power_cut() needs a broker started with power_cut=True "
                                   "(semel_broker_factory(power_cut=True))")
        self.process.kill()
        self.disk.power_off(torn)

    def partition(self) -> None:
        """Cut the broker off the network: packets to and from it are dropped without an
        answer (a connect times out, an open connection stalls)."""
        self._net().isolate("broker")

    def heal(self) -> None:
        self._net().heal()

    def _net(self) -> Network:
        if self.network is None:
            raise FaultUnavailable("partition() needs a broker started with network=True "
                                   "(semel_broker_factory(network=True))")
        return self.network

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<semel Broker {self.bootstrap_servers} {'up' if self.alive() else 'down'}>"


def _power_cut_disk(base: Path) -> PowerCutDisk:
    reason = fuse_unavailable_reason()
    if reason:
        raise FaultUnavailable(f"power cuts need FUSE: {reason}")
    return PowerCutDisk(base / "disk-backing", base / "disk", log_path=base / "lazyfs.log")


def _network(proc: SemelBroker) -> Network:
    """The broker alone in a namespace behind a router, this process the other host."""
    reason = netns_unavailable_reason()
    if reason:
        raise FaultUnavailable(f"network partitions need namespaces: {reason}")
    net = Network(["broker", "tests"], here="tests")
    place(proc, net, "broker")
    return net
