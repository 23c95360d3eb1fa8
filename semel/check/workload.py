"""The check workload: a seeded controller drives client worker processes and
injects faults, writing every operation to the history.

Shape of a run:
  setup    create the topic (one partition per key)
  main     producers run transactions (sends to several partitions, sometimes
           a poll inside; commit or abort at random); zombie instances (two or
           more processes with one transactional id) are started together again
           and again, so their InitProducerIds coincide and the broker must fence
           all but the last; consumers poll by
           assignment and by group subscription at both isolation levels;
           the nemesis kills and pauses clients and, when check runs the
           broker itself, kills/restarts it and gives it a full or slow disk
  heal     faults stop, paused processes continue, the broker runs normally
  fence    every transactional id is initialised once more, which resolves
           any transaction a killed producer left open
  drain    fresh read_committed and read_uncommitted consumers read every
           partition from the beginning to its end

Everything random comes from the seed (one stream per slot and one for the
nemesis), so a run's schedule is reproducible; the timing of a real broker
is not, and the history records what actually happened.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from .cluster import CLUSTER_FAULTS, CheckCluster
from .errors import WorkloadError
from .faults import BROKER_FAULTS, FAULTS, FaultInjection
from .history import NEMESIS, HistoryWriter
from .processes import Slot, WorkerProcesses
from .target import ManagedBroker
from .threads import blocking

__all__ = ["BROKER_FAULTS", "CLUSTER_FAULTS", "FAULTS", "Workload", "WorkloadConfig",
           "WorkloadError", "run_workload"]


@dataclass
class WorkloadConfig:
    bootstrap: str
    out_dir: Path
    seed: int = 0
    duration_s: float = 60.0
    faults: tuple = ()
    keys: int = 4
    producers: int = 3
    zombies: int = 2                 # processes sharing one transactional id (0: none)
    topic: str | None = None
    broker: ManagedBroker | None = None
    cluster: CheckCluster | None = None   # --cluster: the nemesis kills and pauses its brokers
    replication_factor: int = 1
    topic_config: dict | None = None
    fault_interval_s: tuple = (2.0, 6.0)
    op_timeout_s: float = 45.0
    ready_timeout_s: float = 45.0
    setup_timeout_s: float = 30.0
    finish_timeout_s: float = 30.0   # after the main phase, for running ops to end (then killed: info)
    fence_timeout_s: float = 30.0
    drain_timeout_s: float = 40.0
    abort_probability: float = 0.3
    poll_probability: float = 0.3
    max_sends: int = 4

    def validate(self) -> None:
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise WorkloadError(f"unknown fault {sorted(unknown)[0]!r}; known: {', '.join(FAULTS)}")
        asked = set(self.faults)
        if self.cluster is not None:
            single = sorted(asked & (BROKER_FAULTS - set(CLUSTER_FAULTS)))
            if single:
                raise WorkloadError(f"{single[0]} is a fault of a single broker, not of --cluster")
        elif (set(CLUSTER_FAULTS) - BROKER_FAULTS) & asked:
            raise WorkloadError("cluster faults need --cluster")
        elif BROKER_FAULTS & asked and self.broker is None:
            raise WorkloadError("broker faults need a broker that check starts itself "
                                "(--broker-cmd or --spawn-semel)")
        if self.keys < 1 or self.producers < 1:
            raise WorkloadError("need at least one key and one producer")
        if self.zombies == 1 or self.zombies < 0:
            raise WorkloadError("zombie instances come in twos or more (0: none)")
        if self.duration_s <= 0:
            raise WorkloadError("duration must be positive")


class Workload:
    """One run: the history it writes, its phases and the clients' operations, composed
    of its worker processes (`workers`, semel.check.processes) and its nemesis
    (`faults`, semel.check.faults)."""

    def __init__(self, cfg: WorkloadConfig):
        cfg.validate()
        self.cfg = cfg
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        self.topic = cfg.topic or f"semel-check-{cfg.seed}-{os.getpid()}-{int(time.time())}"
        self.t0 = time.monotonic_ns()
        self.history = HistoryWriter(cfg.out_dir / "history.jsonl")
        self.worker_log = open(cfg.out_dir / "workers.log", "ab")
        self.stop = asyncio.Event()
        self.next_value = 0
        self.drained: dict = {}
        self.workers = WorkerProcesses(cfg, self.topic, self.worker_log, self.note)
        self.faults = FaultInjection(cfg, self.stop, self.workers, self.record, self.note)

    # ------------------------------------------------------------------ history

    def now(self) -> int:
        return time.monotonic_ns() - self.t0

    def record(self, event: dict) -> dict:
        return self.history.write(dict(event, time=self.now()))

    def note(self, f: str, **value) -> None:
        self.record({"process": NEMESIS, "type": "info", "f": f, "value": value})

    # ------------------------------------------------------------------ ops

    def _value(self) -> int:
        self.next_value += 1
        return self.next_value

    def next_op(self, slot: Slot) -> tuple[dict, dict]:
        """(command for the worker, invoke event for the history)."""
        rng, cfg = slot.rng, self.cfg
        if slot.role == "producer":
            mops: list = [["send", rng.randrange(cfg.keys), self._value()]
                          for _ in range(rng.randint(1, cfg.max_sends))]
            if rng.random() < cfg.poll_probability:
                mops.insert(rng.randint(0, len(mops)), ["poll"])
            decision = "abort" if rng.random() < cfg.abort_probability else "commit"
            cmd = {"op": "txn", "mops": mops, "decision": decision, "gap_ms": rng.choice([0, 0, 0, 5, 20])}
            event = {"f": "txn", "value": mops, "txn_id": slot.wcfg["txn_id"], "decision": decision,
                     "isolation": "read_committed"}
            return cmd, event
        if slot.wcfg["mode"] == "assign" and rng.random() < 0.03:
            keys = sorted(rng.sample(range(cfg.keys), rng.randint(1, cfg.keys)))
            return {"op": "assign", "keys": keys}, {"f": "assign", "value": keys}
        return {"op": "poll", "timeout_s": 0.2}, {"f": "poll", "value": [["poll"]],
                                                   "isolation": slot.wcfg["isolation"]}

    def completion(self, slot: Slot, invoke: dict, reply: dict | None) -> dict:
        ev = {k: v for k, v in invoke.items() if k not in ("type", "index", "time", "decision")}
        if reply is None:
            # The process died or hung: whatever it did may or may not have happened.
            ev["type"] = "info"
            ev["error"] = "worker lost"
            return ev
        ev["type"] = reply["type"]
        if "value" in reply:
            ev["value"] = reply["value"]
        for k in ("error", "rebalance", "commit_error", "errors", "at_end", "slow_steps"):
            if k in reply:
                ev[k] = reply[k]
        if reply.get("commit_ns") is not None:
            ev["commit_ns"] = reply["commit_ns"] - self.t0
        return ev

    async def run_op(self, slot: Slot, cmd: dict, invoke: dict, timeout_s: float | None = None) -> dict | None:
        inv = self.record(dict(invoke, process=slot.process, type="invoke"))
        reply = await self.workers.call(slot, cmd, timeout_s or self.cfg.op_timeout_s)
        self.record(dict(self.completion(slot, inv, reply), process=slot.process))
        if reply is None or reply.get("exit"):
            await self.workers.reap(slot)
        return reply

    async def drive(self, slot: Slot) -> None:
        try:
            while not self.stop.is_set():
                if slot.proc is None:
                    if not await self.workers.spawn(slot):
                        await asyncio.sleep(0.5)
                    continue
                cmd, invoke = self.next_op(slot)
                await self.run_op(slot, cmd, invoke)
                await asyncio.sleep(slot.rng.uniform(0, 0.02))
        except asyncio.CancelledError:
            # Cut off mid-op: the worker would answer a command we no longer wait
            # for, so it goes; its op stays open in the history (an unknown outcome).
            await self.workers.reap(slot)
            raise

    async def drive_zombies(self) -> None:
        """Rounds of all zombie instances started at one moment: each round kills the
        survivors, starts every instance with one InitProducerId instant, and lets
        them run transactions for a few seconds. A broker that hands two of them the
        same producer id/epoch lets both commit and drops one's records as
        duplicates (a lost write in the analysis); a correct one fences all but one."""
        rng = random.Random(f"{self.cfg.seed}/zombies")
        try:
            while not self.stop.is_set():
                for slot in self.workers.zombies:
                    await self.workers.reap(slot)
                start_at = time.time() + 1.0 + 0.5 * len(self.workers.zombies)   # all connected by then
                await asyncio.gather(*(self.workers.spawn(s, start_at=start_at) for s in self.workers.zombies))
                running = [s for s in self.workers.zombies if s.proc is not None]
                if not running:
                    await asyncio.sleep(0.5)
                    continue
                over = asyncio.Event()
                loops = [asyncio.create_task(self._zombie_round(s, over)) for s in running]
                try:
                    await asyncio.wait_for(self.stop.wait(), rng.uniform(1.0, 4.0))
                except asyncio.TimeoutError:
                    pass
                over.set()
                await asyncio.gather(*loops)
        except asyncio.CancelledError:
            for slot in self.workers.zombies:
                await self.workers.reap(slot)
            raise

    async def _zombie_round(self, slot: Slot, over: asyncio.Event) -> None:
        while not over.is_set() and slot.proc is not None:
            cmd, invoke = self.next_op(slot)
            await self.run_op(slot, cmd, invoke)
            await asyncio.sleep(slot.rng.uniform(0, 0.02))

    # ------------------------------------------------------------------ phases

    async def setup_topic(self) -> None:
        from confluent_kafka import KafkaError
        from confluent_kafka.admin import AdminClient, NewTopic

        def create() -> str | None:
            admin = AdminClient({"bootstrap.servers": self.cfg.bootstrap, "log_level": 3})
            deadline = time.monotonic() + self.cfg.setup_timeout_s
            last = "no answer"
            while time.monotonic() < deadline:
                wait = max(1.0, min(10.0, deadline - time.monotonic()))
                new = NewTopic(self.topic, self.cfg.keys, self.cfg.replication_factor,
                               config=dict(self.cfg.topic_config or {}))
                fut = admin.create_topics([new],
                                          operation_timeout=wait, request_timeout=wait)[self.topic]
                try:
                    fut.result(wait + 5)
                except Exception as exc:  # KafkaException carries a KafkaError
                    err = exc.args[0] if exc.args else exc
                    if getattr(err, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                        last = str(err)
                        time.sleep(0.5)
                        continue
                md = admin.list_topics(self.topic, timeout=wait).topics.get(self.topic)
                if md is not None and md.error is None and len(md.partitions) >= self.cfg.keys:
                    return None
                last = f"topic has {len(md.partitions) if md else 0} partitions, want {self.cfg.keys}"
                time.sleep(0.5)
            return last

        err = await blocking(create)
        if err is not None:
            raise WorkloadError(f"cannot create topic {self.topic} on {self.cfg.bootstrap}: {err}")
        view = None
        if self.cfg.cluster is not None:
            view = await blocking(self.cfg.cluster.topic_ready, self.topic)
            if view is None:
                raise WorkloadError(f"topic {self.topic}: partitions without a leader or a full ISR")
        self.note("setup", topic=self.topic, keys=self.cfg.keys, seed=self.cfg.seed,
                  faults=list(self.cfg.faults), bootstrap=self.cfg.bootstrap, duration_s=self.cfg.duration_s,
                  fault_interval_s=list(self.cfg.fault_interval_s), producers=self.cfg.producers,
                  zombies=self.cfg.zombies)
        if view is not None:   # after setup: the history's first line must be the setup
            self.note("cluster-view", controller=view.controller, epochs=view.epochs(),
                      leaders={p: leader for p, (leader, _, _) in view.partitions.items()})

    async def fence(self) -> None:
        """Initialise every transactional id once more: a killed producer's open
        transaction is aborted (or its decided commit completed) right here."""
        producers = [s for s in self.workers.slots if s.role == "producer"]
        ok = await self._bounded([self._fence_one(s) for s in producers], self.cfg.fence_timeout_s)
        for slot, fenced in zip(producers, ok):
            if not fenced:
                self.note("fence-failed", slot=slot.name)

    async def _fence_one(self, slot: Slot) -> bool:
        try:
            if slot.proc is None and not await self.workers.spawn(slot):
                return False
            reply = await self.workers.call(slot, {"op": "close"}, self.cfg.op_timeout_s)
            self.note("fenced", slot=slot.name, process=slot.process, ok=reply is not None)
            return reply is not None
        finally:
            await self.workers.reap(slot)

    async def _bounded(self, coros: list, timeout_s: float) -> list:
        """Run coroutines together for at most timeout_s; a late one counts as False."""
        tasks = [asyncio.create_task(c) for c in coros]
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return [t in done and not t.cancelled() and t.exception() is None and bool(t.result()) for t in tasks]

    async def drain(self) -> None:
        drains = []
        for iso, tag in (("read_committed", "rc"), ("read_uncommitted", "ru")):
            wcfg = dict(self.workers.base_cfg(), role="consumer", mode="assign", isolation=iso, group=None)
            drains.append(Slot(f"drain-{tag}", "consumer", wcfg, random.Random(f"{self.cfg.seed}/drain-{tag}")))
        await asyncio.gather(*(self._drain_one(s) for s in drains))

    async def _drain_one(self, slot: Slot) -> None:
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        want = set(range(self.cfg.keys))
        at_end: set = set()
        while time.monotonic() < deadline:
            left = max(1.0, deadline - time.monotonic())
            if slot.proc is None and not await self.workers.spawn(slot, ready_timeout_s=left):
                await asyncio.sleep(0.5)
                continue
            reply = await self.run_op(slot, {"op": "poll", "timeout_s": 1.0},
                                      {"f": "poll", "value": [["poll"]], "isolation": slot.wcfg["isolation"]},
                                      timeout_s=left + 2)
            if reply is None:
                continue
            at_end = set(reply.get("at_end", []))
            if at_end >= want:
                break
        self.drained[slot.name] = sorted(at_end)
        if not at_end >= want:
            self.note("drain-incomplete", slot=slot.name, at_end=sorted(at_end))
        await self.workers.reap(slot)

    async def close_consumers(self) -> None:
        async def close(slot: Slot) -> bool:
            try:
                return await self.workers.call(slot, {"op": "close"}, 5) is not None
            finally:
                await self.workers.reap(slot)

        await self._bounded([close(s) for s in self.workers.slots if s.role == "consumer" and s.proc is not None], 10)

    async def run(self) -> Path:
        try:
            await self.setup_topic()
            self.workers.build_slots()
            drivers = [asyncio.create_task(self.drive(s)) for s in self.workers.slots if s not in self.workers.zombies]
            if self.workers.zombies:
                drivers.append(asyncio.create_task(self.drive_zombies()))
            nemesis = asyncio.create_task(self.faults.nemesis())
            try:
                await asyncio.wait_for(self.stop.wait(), self.cfg.duration_s)
            except asyncio.TimeoutError:
                pass
            self.stop.set()
            await nemesis  # lets a running episode finish: paused clients continue, the broker runs normally
            self.note("heal")
            done, pending = await asyncio.wait(drivers, timeout=self.cfg.finish_timeout_s)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                task.result()
            await self.close_consumers()
            await self.fence()
            await self.drain()
            self.note("end", drained=self.drained)
        finally:
            for slot in self.workers.slots:
                await self.workers.reap(slot)
            self.history.close()
            self.worker_log.close()
        return self.history.path


def run_workload(cfg: WorkloadConfig) -> Path:
    """Run the workload to completion; returns the history path."""
    return asyncio.run(Workload(cfg).run())
