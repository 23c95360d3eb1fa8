"""The controller's side of the check's client worker processes (semel.check.worker):
slots (stable client identities), starting a worker, one command and its answer over
the worker's stdin/stdout, and reaping it.

WorkerProcesses is the part of Workload (semel.check.workload) that does this, given
the workload's settings, topic, the file the workers' stderr goes to, and how to note an
event in the history.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
from dataclasses import dataclass
from typing import IO, Any, Callable

CONSUMER_SLOTS = (
    # name, mode, isolation, group suffix
    ("assign-rc", "assign", "read_committed", None),
    ("assign-ru", "assign", "read_uncommitted", None),
    ("group-rc-1", "subscribe", "read_committed", "rc"),
    ("group-rc-2", "subscribe", "read_committed", "rc"),
    ("group-ru", "subscribe", "read_uncommitted", "ru"),
)


def signal_worker(proc: asyncio.subprocess.Process, sig: int) -> None:
    """os.kill, not proc.send_signal: the latter polls (and may reap) a child that
    just exited, racing asyncio's own child watcher. An exited but unreaped
    child still holds its pid, so this cannot hit a stranger."""
    try:
        os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


@dataclass
class Slot:
    """A stable client identity; its worker process is replaced when killed."""

    name: str
    role: str                      # producer | consumer
    wcfg: dict
    rng: random.Random
    proc: asyncio.subprocess.Process | None = None
    process: int | None = None     # history process id of the current incarnation
    paused: bool = False


class WorkerProcesses:
    """Slots and their worker processes. `cfg` is the WorkloadConfig; `note(f, **value)`
    records an info event in the history."""

    def __init__(self, cfg: Any, topic: str, worker_log: IO[bytes], note: Callable[..., None]) -> None:
        self.cfg = cfg
        self.topic = topic
        self.worker_log = worker_log
        self.note = note
        self.next_process = 0
        self.slots: list[Slot] = []
        self.zombies: list[Slot] = []   # also in slots; driven together (Workload.drive_zombies)

    def base_cfg(self) -> dict:
        """What every worker is configured with."""
        return {"bootstrap": self.cfg.bootstrap, "topic": self.topic, "keys": self.cfg.keys,
                "max_seconds": self.cfg.duration_s + self.cfg.drain_timeout_s + 300}

    def build_slots(self) -> None:
        for i in range(self.cfg.producers):
            name = f"producer-{i}"
            wcfg = dict(self.base_cfg(), role="producer", txn_id=f"{self.topic}-{name}")
            self.slots.append(Slot(name, "producer", wcfg, random.Random(f"{self.cfg.seed}/{name}")))
        for i in range(self.cfg.zombies):
            name = f"zombie-{i}"
            wcfg = dict(self.base_cfg(), role="producer", txn_id=f"{self.topic}-zombie")
            self.zombies.append(Slot(name, "producer", wcfg, random.Random(f"{self.cfg.seed}/{name}")))
        self.slots += self.zombies
        for name, mode, iso, group in CONSUMER_SLOTS:
            wcfg = dict(self.base_cfg(), role="consumer", mode=mode, isolation=iso,
                        group=f"{self.topic}-{group}" if group else None)
            self.slots.append(Slot(name, "consumer", wcfg, random.Random(f"{self.cfg.seed}/{name}")))

    async def spawn(self, slot: Slot, ready_timeout_s: float | None = None, start_at: float | None = None) -> bool:
        self.next_process += 1
        slot.process = self.next_process
        slot.paused = False
        wcfg = dict(slot.wcfg, client_id=f"semel-check-{slot.name}-{slot.process}")
        if start_at is not None:
            wcfg["start_at"] = start_at
        slot.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "semel.check.worker", json.dumps(wcfg),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self.worker_log,
            limit=1 << 24)
        hello = await self._read(slot, ready_timeout_s or self.cfg.ready_timeout_s)
        if hello is None or not hello.get("ready"):
            why = (hello or {}).get("error", "no answer")
            self.note("worker-start-failed", slot=slot.name, process=slot.process, error=why)
            await self.reap(slot)
            return False
        return True

    async def _read(self, slot: Slot, timeout_s: float) -> dict | None:
        try:
            line = await asyncio.wait_for(slot.proc.stdout.readline(), timeout_s)
        except (asyncio.TimeoutError, ValueError, ConnectionError):
            return None
        if not line:
            return None
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            return None

    async def call(self, slot: Slot, cmd: dict, timeout_s: float) -> dict | None:
        """Send one command; None when the worker died or did not answer in time."""
        if slot.proc is None or slot.proc.returncode is not None:
            return None
        try:
            slot.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            await slot.proc.stdin.drain()
        except (ConnectionError, BrokenPipeError):
            return None
        return await self._read(slot, timeout_s)

    async def reap(self, slot: Slot) -> None:
        proc, slot.proc = slot.proc, None
        if proc is None:
            return
        if proc.returncode is None:
            signal_worker(proc, signal.SIGCONT)
            signal_worker(proc, signal.SIGKILL)
        await proc.wait()

    def live_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.proc is not None and s.proc.returncode is None and not s.paused]
