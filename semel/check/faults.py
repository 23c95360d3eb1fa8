"""The check's nemesis: which faults it can inject and how each one is carried out.

Client faults kill or pause worker processes; broker faults (when check runs the
broker itself) kill and restart it, or restart it on a full or slow disk through the
storage seam's fault injection (SEMEL_FS_FAULTS); cluster faults are CheckCluster's.

FaultInjection is the part of Workload (semel.check.workload) that does this, given the
workload's settings, its stop event, its worker processes and how to write the history.
"""
from __future__ import annotations

import asyncio
import random
import signal
from typing import Any, Callable

from .cluster import CLUSTER_FAULTS
from .errors import WorkloadError
from .history import NEMESIS
from .processes import WorkerProcesses, signal_worker
from .target import BrokerStartError
from .threads import blocking

FAULTS = tuple(dict.fromkeys(("client-kill", "client-pause", "broker-kill", "power-loss", "disk-full", "slow-fsync")
                             + CLUSTER_FAULTS))
# Faults of a broker check runs itself; power-loss is one of the cluster's as well.
BROKER_FAULTS = frozenset({"broker-kill", "power-loss", "disk-full", "slow-fsync"})


class FaultInjection:
    """The nemesis loop and one method per fault, `fault_<name>`. `cfg` is the
    WorkloadConfig; the nemesis runs until `stop` is set; `record(event)` writes a
    history event, `note(f, **value)` an info event (CheckCluster's faults note theirs
    through it too)."""

    def __init__(self, cfg: Any, stop: asyncio.Event, workers: WorkerProcesses,
                 record: Callable[[dict], dict], note: Callable[..., None]) -> None:
        self.cfg = cfg
        self.stop = stop
        self.workers = workers
        self.record = record
        self.note = note
        # Its own stream of the seed: the schedule of faults is reproducible.
        self.rng = random.Random(f"{cfg.seed}/nemesis")

    async def nemesis(self) -> None:
        faults = list(self.cfg.faults)
        rng = self.rng
        while faults:
            delay = rng.uniform(*self.cfg.fault_interval_s)
            try:
                await asyncio.wait_for(self.stop.wait(), delay)
                return
            except asyncio.TimeoutError:
                pass
            fault = rng.choice(faults)
            if fault in CLUSTER_FAULTS and self.cfg.cluster is not None:
                await self.cfg.cluster.fault(fault, rng, self)
            else:
                await getattr(self, "fault_" + fault.replace("-", "_"))(rng)

    async def fault_client_kill(self, rng: random.Random) -> None:
        live = self.workers.live_slots()
        if not live:
            return
        victim = rng.choice(live)
        self.record({"process": NEMESIS, "type": "invoke", "f": "kill-client",
                     "value": {"slot": victim.name, "process": victim.process}})
        signal_worker(victim.proc, signal.SIGKILL)
        self.note("kill-client", slot=victim.name, process=victim.process)

    async def fault_client_pause(self, rng: random.Random) -> None:
        live = self.workers.live_slots()
        if not live:
            return
        victim = rng.choice(live)
        seconds = round(rng.uniform(0.3, 3.0), 2)
        self.record({"process": NEMESIS, "type": "invoke", "f": "pause-client",
                     "value": {"slot": victim.name, "process": victim.process, "seconds": seconds}})
        proc = victim.proc
        victim.paused = True
        try:
            signal_worker(proc, signal.SIGSTOP)
            await asyncio.sleep(seconds)
        finally:
            signal_worker(proc, signal.SIGCONT)
            victim.paused = False
        self.note("pause-client", slot=victim.name, process=victim.process, seconds=seconds)

    async def _restart_broker(self, env: dict | None = None) -> None:
        broker = self.cfg.broker
        await blocking(broker.kill)
        for attempt in range(5):
            try:
                await blocking(broker.start, env)
                return
            except BrokerStartError as exc:
                self.note("broker-start-failed", attempt=attempt, error=str(exc))
                await asyncio.sleep(1.0)
        raise WorkloadError(f"the broker did not come back after a fault (log: {broker.log_path})")

    async def fault_broker_kill(self, rng: random.Random) -> None:
        down = round(rng.uniform(0.1, 1.5), 2)
        self.record({"process": NEMESIS, "type": "invoke", "f": "kill-broker", "value": {"down_s": down}})
        await blocking(self.cfg.broker.kill)
        await asyncio.sleep(down)
        await self._restart_broker()
        self.note("kill-broker", down_s=down)

    async def fault_power_loss(self, rng: random.Random) -> None:
        """The broker's power goes: SIGKILL, then its power-cut disk drops everything
        it had not fsynced (creations, renames and removals too); then on again."""
        down = round(rng.uniform(0.1, 1.0), 2)
        self.record({"process": NEMESIS, "type": "invoke", "f": "power-loss", "value": {"down_s": down}})
        broker = self.cfg.broker
        await blocking(broker.kill)
        await blocking(broker.disk.cut)
        await asyncio.sleep(down)
        await self._restart_broker()
        self.note("power-loss", down_s=down)

    async def _fs_episode(self, f: str, spec: str, hold_s: float) -> None:
        """Restart the broker with a storage fault, hold it, restart it healthy."""
        self.record({"process": NEMESIS, "type": "invoke", "f": f, "value": {"spec": spec, "hold_s": hold_s}})
        broker = self.cfg.broker
        await blocking(broker.kill)
        try:
            await blocking(broker.start, {"SEMEL_FS_FAULTS": spec})
            started = True
        except BrokerStartError as exc:
            # A broker may refuse to start on a full disk; that is its right.
            self.note("fault-start-failed", spec=spec, error=str(exc))
            started = False
        if started:
            await asyncio.sleep(hold_s)
        await self._restart_broker()
        self.note(f, spec=spec, hold_s=hold_s, started=started)

    async def fault_disk_full(self, rng: random.Random) -> None:
        # The storage seam fails writes with ENOSPC once this many bytes were written.
        await self._fs_episode("disk-full", f"enospc_after_bytes={rng.randint(1, 64) * 1024}",
                               round(rng.uniform(2.0, 5.0), 2))

    async def fault_slow_fsync(self, rng: random.Random) -> None:
        await self._fs_episode("slow-fsync", f"fsync_delay_ms={rng.choice([20, 50, 100])}",
                               round(rng.uniform(3.0, 8.0), 2))
