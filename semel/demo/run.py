"""The crash loop of `semel demo`: feed numbers 1..N into demo-input, run the Spark
processor (semel.demo.job) as its own process group, SIGKILL it K times and start
it again, and verify every output under read_committed while it runs.

Crashes alternate between two kinds: a SIGKILL of the whole group at a random
moment once the processor is busy, and the sink's own hook, which kills the group
at a named step of a commit (semel.spark.sink.KILL_ENV, e.g. "commit:decided@7").
Input is released in K+1 slices, each after the previous crash, so every crash
lands with work in flight and the last slice proves the recovered processor still
makes progress."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from semel.client import Client
from semel.client.quiet import quiet_logger
from semel.protocol.errors import KafkaError

from . import verify
from .job import INPUT, OUTPUT

HOOK_STEPS = ("write:produced", "commit:parent-offsets", "commit:decided")
PARTITIONS = 2
HOOK_WAIT_S = 60  # of a busy processor, before an armed hook that never fired is replaced by a SIGKILL
MAX_FAILURES = 3  # processor runs that end on their own, not by a crash, before the demo gives up


@dataclass
class Config:
    bootstrap: str
    postgres: str
    work: Path
    records: int = 3000
    crashes: int = 3
    rate: float = 60.0  # input records per second
    seed: int | None = None
    master: str = "local[2]"
    stall_s: float = 180.0  # no output progress for this long ends the demo as failed


@dataclass
class Outcome:
    produced: int
    inputs: int
    tallies: list[verify.Tally]
    crashes: int
    failures: int
    notes: list[str] = field(default_factory=list)

    def ok(self, cfg: Config) -> bool:
        return (self.inputs == cfg.records and self.crashes == cfg.crashes
                and all(t.ok and t.count == cfg.records for t in self.tallies))


class Feeder(threading.Thread):
    """Idempotent producer of 1..N at a steady rate, released slice by slice."""

    def __init__(self, cfg: Config):
        super().__init__(daemon=True)
        self.cfg, self.acked, self.allowed, self.error = cfg, 0, 0, None
        self.cond = threading.Condition()

    def release(self, upto: int) -> None:
        with self.cond:
            self.allowed = max(self.allowed, upto)
            self.cond.notify_all()

    def run(self) -> None:
        from confluent_kafka import Producer
        p = Producer({"bootstrap.servers": self.cfg.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5, "logger": quiet_logger("semel.demo.librdkafka")})

        def ack(err, _msg):
            if err is None:
                self.acked += 1
            else:
                self.error = str(err)
        start = time.monotonic()
        for i in range(1, self.cfg.records + 1):
            with self.cond:
                while i > self.allowed:
                    self.cond.wait()
            delay = start + i / self.cfg.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # pacing the input, not waiting for a condition
            p.produce(INPUT, key=str(i % 8).encode(), value=str(i).encode(), on_delivery=ack)
            p.poll(0)
        if p.flush(120):
            self.error = "input records not acknowledged within 120 s"


class Processor:
    """One run after another of semel.demo.job, each in its own process group."""

    def __init__(self, cfg: Config):
        self.cfg, self.proc, self.runs = cfg, None, 0

    def start(self, kill_at: str | None = None) -> None:
        from semel.spark import hooks   # here: the semel.spark package imports pyspark
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
        env.pop(hooks.KILL_ENV, None)
        env.pop(hooks.KILL_PGID_ENV, None)
        if kill_at:
            env[hooks.KILL_ENV] = kill_at
        self.runs += 1
        log = open(self.cfg.work / f"processor-{self.runs}.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "semel.demo.job", "--bootstrap", self.cfg.bootstrap, "--work",
             str(self.cfg.work), "--postgres", self.cfg.postgres, "--master", self.cfg.master],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # driver, JVM and Python workers at once
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stop(self, timeout_s: float = 90) -> None:
        (self.cfg.work / "stop").touch()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


def next_batch(work: Path) -> int:
    """The first batch the restarted Kafka query plans anew: one past the last in its
    offset log. (The last one itself may be a replay of a batch decided before the
    crash, which the sink only rolls forward, so a hook armed there would never fire.)"""
    planned = work / "ck" / "kafka" / "offsets"
    done = [int(f.name) for f in planned.iterdir() if f.name.isdigit()] if planned.is_dir() else []
    return max(done, default=-1) + 1


class Watch:
    """The verifier's live view: what each output shows under read_committed."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.kafka = verify.TopicReader(cfg.bootstrap, OUTPUT)
        self.values: dict[str, list[int]] = {"demo-output": [], "postgres": [], "files": []}
        self.last_growth = time.monotonic()

    def refresh(self) -> None:
        before = sum(map(len, self.values.values()))
        self.values["demo-output"] = list(self.kafka.poll(0.5))
        self.values["postgres"] = verify.sql_values(self.cfg.postgres)
        self.values["files"] = verify.file_values(self.cfg.work / "files")
        if sum(map(len, self.values.values())) != before:
            self.last_growth = time.monotonic()

    def least(self) -> int:
        return min(len(v) for v in self.values.values())

    def complete(self) -> bool:
        return self.least() >= self.cfg.records


def progress(cfg: Config, feeder: Feeder, watch: Watch, crashes: int, state: str, t0: float) -> Table:
    t = Table(title=f"semel demo: {cfg.records} records, {crashes}/{cfg.crashes} crashes "
                    f"({time.monotonic() - t0:.0f} s)")
    for col in ("input acked", *watch.values, "processor"):
        t.add_column(col, justify="right")
    t.add_row(str(feeder.acked), *(str(len(v)) for v in watch.values.values()), state)
    return t


def crash_loop(cfg: Config, console: Console) -> Outcome:
    rng = random.Random(cfg.seed)
    (cfg.work / "stop").unlink(missing_ok=True)
    feeder, proc, watch = Feeder(cfg), Processor(cfg), Watch(cfg)
    slice_n = -(-cfg.records // (cfg.crashes + 1))
    feeder.release(slice_n)
    feeder.start()
    crashes = failures = 0
    notes: list[str] = []
    t0 = time.monotonic()
    state = {"plan": None, "busy_mark": 0}

    def restart() -> None:
        # every second crash is the sink's own hook, armed when the processor starts
        hook = crashes < cfg.crashes and crashes % 2 == 1
        proc.start(f"{rng.choice(HOOK_STEPS)}@{next_batch(cfg.work)}" if hook else None)
        state["plan"] = ("hook", None) if hook else None  # its deadline starts once busy
        state["busy_mark"] = watch.least()

    restart()
    with Live(console=console, refresh_per_second=2, transient=False) as live:
        while True:
            watch.refresh()
            plan = state["plan"]
            label = f"run {proc.runs}" + (" (hook armed)" if plan and plan[0] == "hook" else "")
            live.update(progress(cfg, feeder, watch, crashes, label, t0))
            if crashes >= cfg.crashes and watch.complete():
                break
            if time.monotonic() - watch.last_growth > cfg.stall_s:
                notes.append(f"no progress for {cfg.stall_s:.0f} s; gave up")
                break
            if not proc.alive():
                if plan and plan[0] == "hook" and proc.proc.returncode == -signal.SIGKILL:
                    crashes += 1
                    feeder.release(slice_n * (crashes + 1))
                else:
                    failures += 1
                    notes.append(f"processor run {proc.runs} exited with {proc.proc.returncode} "
                                 f"(log: processor-{proc.runs}.log); restarted")
                    if failures > MAX_FAILURES:
                        notes.append("too many processor failures; gave up")
                        break
                restart()
                continue
            if crashes >= cfg.crashes or watch.least() <= state["busy_mark"]:
                continue  # crash only a processor that is busy writing
            if plan is None:
                state["plan"] = plan = ("kill", time.monotonic() + rng.uniform(0.0, 3.0))
            elif plan[1] is None:
                state["plan"] = plan = ("hook", time.monotonic() + HOOK_WAIT_S)
            if time.monotonic() >= plan[1]:  # the random moment (or a hook that never fired)
                if plan[0] == "hook":
                    notes.append(f"sink kill hook did not fire within {HOOK_WAIT_S} s of work; SIGKILLed instead")
                proc.kill()
                crashes += 1
                feeder.release(slice_n * (crashes + 1))
                restart()
        proc.stop()
    feeder.join(timeout=5)
    if feeder.error:
        notes.append(f"input producer: {feeder.error}")
    return finish(cfg, feeder, watch, crashes, failures, notes)


def finish(cfg: Config, feeder: Feeder, watch: Watch, crashes: int, failures: int, notes: list[str]) -> Outcome:
    watch.refresh()
    watch.kafka.close()
    expected = {2 * i for i in range(1, cfg.records + 1)}
    inputs = verify.TopicReader(cfg.bootstrap, INPUT)
    deadline = time.monotonic() + 30
    while len(inputs.poll(0.5)) < cfg.records and time.monotonic() < deadline:
        pass
    n_in = len(set(inputs.values)) if len(inputs.values) == len(set(inputs.values)) else -1
    inputs.close()
    tallies = [verify.tally(name, vals, expected) for name, vals in watch.values.items()]
    return Outcome(feeder.acked, n_in, tallies, crashes, failures, notes)


def report(cfg: Config, out: Outcome, console: Console) -> Table:
    t = Table(title="exactly-once check (read_committed, SQL, committed files)")
    for col in ("", "records", "duplicates", "missing", "unexpected", "verdict"):
        t.add_column(col, justify="right")
    t.add_row("inputs (demo-input)", str(out.inputs), "", "", "", "ok" if out.inputs == cfg.records else "BAD")
    for tl in out.tallies:
        good = tl.ok and tl.count == cfg.records
        t.add_row(tl.name, str(tl.count), str(tl.duplicates), str(tl.missing), str(tl.unexpected),
                  "ok" if good else "BAD")
    t.add_row("crashes survived", str(out.crashes), "", "", "", "ok" if out.crashes == cfg.crashes else "BAD")
    t.add_row("processor failures (restarted)", str(out.failures), "", "", "", "")
    console.print(t)
    for n in out.notes:
        console.print(f"  note: {n}")
    return t


def prepare(cfg: Config) -> None:
    """Topics and the table; existing ones are reused (`--bootstrap` of a broker used before)."""
    with Client(cfg.bootstrap) as client:
        for topic in (INPUT, OUTPUT):
            err = client.create_topic(topic, PARTITIONS)
            if err not in (KafkaError.NONE, KafkaError.TOPIC_ALREADY_EXISTS):
                raise RuntimeError(f"cannot create {topic}: {err.name}")
    verify.create_table(cfg.postgres)
