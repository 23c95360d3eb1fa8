"""One transactional producer across a broker SIGKILL and restart.

A case: a fresh broker on its own data directory; an unmodified client
(confluent-kafka, kafka-python or aiokafka) commits transactions that each
produce one record and call send_offsets_to_transaction; during the third (the
victim) the broker is SIGKILLed `delay_ms` after a chosen step returned (or
after commit_transaction was called) and restarted at once on the same data
directory. The application then goes on as a real one would: a failed
transaction is aborted (a client that cannot abort is re-created, which
fences the old instance), and the next transaction is retried until it
commits. Every client call runs under a deadline, so a call that ignores its
own timeout shows up as `hung`, never as a stuck test.

The result says how long after the restart the first transaction committed and
what a read_committed reader and the group's committed offset show; `check()`
states what exactly-once demands of them. Shared by
tests/integration/test_restart_txn_resume.py and bench/restart_resume.py.
"""
from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from semel.client import Client
from semel.client.txn import committed_with_metadata
from semel.eos.deadline import DeadlineExceeded, call_with_deadline
from semel.eos.kafka import RESTART_SAFE_CONFIG
from semel.launch.process import SemelBroker
from tests.support.read_end import read_to_end

OUT, IN, GROUP, TXN_ID = "out", "in", "restart-group", "restart-app"
CLIENTS = ("ck", "kp", "aio")
# Where the victim transaction is when the broker dies: after the named step returned.
POINTS = ("begin", "produce", "send_offsets", "commit")
BEFORE = 2            # transactions committed before the victim
CALL_DEADLINE_S = 45  # a client call running longer than this is hung (its own timeouts are 20-30 s)
RESUME_BOUND_S = 60   # the next transaction must commit within this of the restart


class Hung(Exception):
    """A client call outlived its deadline."""


@dataclass
class CaseResult:
    client: str
    point: str
    delay_ms: int
    victim_committed: bool = False          # the victim's commit call returned success
    victim_error: str = ""
    resume_s: float | None = None           # restart finished -> next transaction committed
    attempts: int = 0
    next_error: str = ""                    # why the last failed attempt at the next transaction failed
    hung: str = ""                          # the call that outlived its deadline, if any
    values: list[str] = field(default_factory=list)
    committed_offset: int = -1

    def check(self) -> list[str]:
        """What is wrong with this case (empty: exactly-once and live)."""
        problems = []
        if self.hung:
            problems.append(f"call hung: {self.hung}")
        if self.resume_s is None:
            problems.append("the next transaction never committed")
        if len(self.values) != len(set(self.values)):
            problems.append(f"duplicates: {self.values}")
        must = {f"v{i}" for i in range(BEFORE)} | {"next"}
        may = must | {"victim"}
        if not must <= set(self.values) or not set(self.values) <= may:
            problems.append(f"read_committed saw {sorted(self.values)}, want {sorted(must)} (+ victim maybe)")
        if self.victim_committed and "victim" not in self.values:
            problems.append("the victim's commit succeeded but its record is not visible")
        if self.committed_offset != BEFORE + 2:
            problems.append(f"committed offset {self.committed_offset}, want {BEFORE + 2} (the next transaction's)")
        return problems


# --- the three clients, behind one small synchronous surface -----------------------

class _App:
    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def call(self, what: str, fn):
        try:
            return call_with_deadline(fn, CALL_DEADLINE_S, name=f"restart-{what}")
        except DeadlineExceeded:
            raise Hung(what) from None


class CkApp(_App):
    def __init__(self, bootstrap: str):
        super().__init__(bootstrap)
        from confluent_kafka import Consumer, Producer
        self.p = Producer({"bootstrap.servers": bootstrap, "transactional.id": TXN_ID, "linger.ms": 1,
                           **RESTART_SAFE_CONFIG})
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, **RESTART_SAFE_CONFIG})

    def init(self):
        self.call("init_transactions", lambda: self.p.init_transactions(30))

    def begin(self):
        self.p.begin_transaction()

    def produce(self, value: str):
        self.p.produce(OUT, value=value.encode())

    def send_offsets(self, offset: int):
        from confluent_kafka import TopicPartition
        meta = self.c.consumer_group_metadata()
        self.call("send_offsets_to_transaction",
                  lambda: self.p.send_offsets_to_transaction([TopicPartition(IN, 0, offset)], meta, 20))

    def commit(self):
        self.call("commit_transaction", lambda: self.p.commit_transaction(30))

    def abort(self):
        self.call("abort_transaction", lambda: self.p.abort_transaction(30))

    def close(self):
        self.c.close()


class KpApp(_App):
    def __init__(self, bootstrap: str):
        super().__init__(bootstrap)
        from kafka import KafkaProducer
        self.p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=TXN_ID, linger_ms=1)

    def init(self):
        self.call("init_transactions", self.p.init_transactions)

    def begin(self):
        self.p.begin_transaction()

    def produce(self, value: str):
        self.p.send(OUT, value.encode())

    def send_offsets(self, offset: int):
        from kafka import OffsetAndMetadata, TopicPartition
        offsets = {TopicPartition(IN, 0): OffsetAndMetadata(offset, "", -1)}
        self.call("send_offsets_to_transaction", lambda: self.p.send_offsets_to_transaction(offsets, GROUP))

    def commit(self):
        self.call("commit_transaction", self.p.commit_transaction)

    def abort(self):
        self.call("abort_transaction", self.p.abort_transaction)

    def close(self):
        self.call("close", lambda: self.p.close(timeout=5))


class AioApp(_App):
    """aiokafka on its own event loop thread, as an asyncio application runs it."""

    def __init__(self, bootstrap: str):
        super().__init__(bootstrap)
        from aiokafka import AIOKafkaProducer
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="restart-aio", daemon=True)
        self.thread.start()

        async def make():
            return AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=TXN_ID, linger_ms=1)
        self.p = self._run("create", make())
        self.started = False

    def _run(self, what: str, coro):
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return self.call(what, lambda: fut.result())

    def init(self):
        self._run("start", self.p.start())   # InitProducerId
        self.started = True

    def begin(self):
        self._run("begin_transaction", self.p.begin_transaction())

    def produce(self, value: str):
        self._run("send", self.p.send(OUT, value.encode()))

    def send_offsets(self, offset: int):
        from aiokafka import TopicPartition
        self._run("send_offsets_to_transaction", self.p.send_offsets_to_transaction({TopicPartition(IN, 0): offset},
                                                                                    GROUP))

    def commit(self):
        self._run("commit_transaction", self.p.commit_transaction())

    def abort(self):
        self._run("abort_transaction", self.p.abort_transaction())

    def close(self):
        try:
            if self.started:
                self._run("stop", self.p.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


APPS = {"ck": CkApp, "kp": KpApp, "aio": AioApp}


# --- the scenario --------------------------------------------------------------------

class BackgroundRestart:
    """SIGKILL the broker after a delay and restart it at once, in the background."""

    def __init__(self, broker: SemelBroker):
        self.broker = broker
        self.restarted_at: float | None = None
        self.thread: threading.Thread | None = None

    def arm(self, delay_ms: int) -> None:
        """Once: the kill comes delay_ms from now."""
        if self.thread is not None:
            return

        def run():
            time.sleep(delay_ms / 1000)
            self.broker.kill()
            self.broker.start()
            self.restarted_at = time.monotonic()
        self.thread = threading.Thread(target=run, name="restart-chaos", daemon=True)
        self.thread.start()

    def join(self) -> None:
        """Wait for a restart under way (one must not outlive the test's broker.close())."""
        if self.thread is not None:
            self.thread.join(120)

    def wait(self) -> float:
        self.join()
        assert self.restarted_at is not None, "the broker did not come back"
        return self.restarted_at


def _transaction(app: _App, value: str, offset: int, after=None) -> None:
    """begin, produce, send_offsets, commit; after(step) runs once each step returned."""
    steps = (("begin", app.begin), ("produce", lambda: app.produce(value)),
             ("send_offsets", lambda: app.send_offsets(offset)), ("commit", app.commit))
    for name, step in steps:
        if after is not None and name == "commit":
            after("commit")       # the kill is timed from the moment commit is called
            step()
            continue
        step()
        if after is not None:
            after(name)


def _recover(app: _App, make) -> _App:
    """After a failed transaction: abort it, or re-create the client if it cannot."""
    try:
        app.abort()
        return app
    except Hung:
        raise
    except Exception:  # noqa: BLE001 - a fatal or fenced client: a new instance fences it
        try:
            app.close()
        except Exception:  # noqa: BLE001 - closing a broken client is best effort
            pass
        fresh = make()
        fresh.init()
        return fresh


def run_case(client: str, point: str, delay_ms: int, workdir: Path) -> CaseResult:
    result = CaseResult(client, point, delay_ms)
    broker = SemelBroker(workdir / "data", log_path=workdir / "broker.log")
    broker.start()
    app = chaos = None
    try:
        with Client(broker.bootstrap) as c:
            c.create_topic(OUT, 1)
            c.create_topic(IN, 1)
        make = lambda: APPS[client](broker.bootstrap)  # noqa: E731
        app = make()
        app.init()
        for i in range(BEFORE):
            _transaction(app, f"v{i}", i + 1)
        chaos = BackgroundRestart(broker)

        def after(step: str) -> None:
            if step == point:
                chaos.arm(delay_ms)
        try:
            _transaction(app, "victim", BEFORE + 1, after)
            result.victim_committed = True
        except Hung:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the victim is allowed
            result.victim_error = f"{type(exc).__name__}: {exc}"[:300]
        restarted = chaos.wait()
        if not result.victim_committed:
            app = _recover(app, make)
        while time.monotonic() - restarted < RESUME_BOUND_S:
            result.attempts += 1
            try:
                _transaction(app, "next", BEFORE + 2)
                result.resume_s = time.monotonic() - restarted
                break
            except Hung:
                raise
            except Exception as exc:  # noqa: BLE001 - retried as an application would
                result.next_error = f"{type(exc).__name__}: {exc}"[:300]
                time.sleep(0.1)
                app = _recover(app, make)
        # Settled: the next transaction's commit returned, and it could only begin once the
        # victim was complete (same transactional id), so the end read is final.
        result.values = read_to_end(broker.bootstrap, OUT, 1)
        with Client(broker.bootstrap) as c:
            result.committed_offset = committed_with_metadata(c, GROUP, [(IN, 0)])[(IN, 0)][0]
    except Hung as exc:
        result.hung = str(exc)
        app = None  # its stuck thread still holds it; closing could block as well
    finally:
        if app is not None:
            try:
                app.close()
            except Exception:  # noqa: BLE001
                pass
        if chaos is not None:
            chaos.join()
        broker.close()
    return result


def cases(seed: int, per_client: int) -> list[tuple[str, str, int]]:
    """(client, point, delay_ms): every step point once per client, then seeded
    commit delays in 0..50 ms, `per_client` cases per client in all."""
    rng = random.Random(seed)
    out = []
    for client in CLIENTS:
        for i in range(per_client):
            point = POINTS[i] if i < len(POINTS) - 1 else "commit"
            out.append((client, point, rng.randint(0, 50)))
    return out
