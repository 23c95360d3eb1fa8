"""The coordinator runtime: the lifecycle every coordinator partition shares.

A coordinator (the transaction coordinator, the group coordinator) is a *shard*: the
state of one internal partition and the operations on it. Everything around that
state is the same for every coordinator and is written here once:

  status     which requests it may serve, as a transition table (`TRANSITIONS`):
             new -> stopped (started) -> loading (its seat leads the partition)
             -> active (loaded and serving) -> stopped (the seat moved on, or stop);
             `error()` is what a request gets in each status.
  load       memory is the replay of the log: `load` clears the shard and hands it
             every batch of the partition through its `replay`, the only way its state
             is rebuilt; `unload` forgets it and answers what still waits.
  writes     `write` (over coordinator_log.CoordinatorLog): append now, wait for the
             commit point through the partition's `writer` (fsynced, then past the high
             watermark), replay in log order, answer.
  timers     named deadlines (`timers`, group_timers.Timers) fired by one loop, and
             periodic passes (`every`) that run only while serving.
  tasks      the background work a shard asks for (`spawn`): cancelled at unload when
             the shard says so, waited for (briefly) at stop.

The seat (ports.CoordinatorSeat) decides *when* to load, serve and unload; the runtime
says *what* each of those does. Per-partition event order is the asyncio order in which
requests reach the shard: an operation decides synchronously and appends before its
first await, so the log order is the order operations were decided in.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from enum import Enum
from typing import Any, Protocol

from ..clock import mono_ms
from ..protocol.errors import KafkaError
from ..protocol.records import BatchHeader
from ..storage.log import PartitionLog
from .coordinator_log import CoordinatorLog
from .group_timers import Timers
from .offsets import scan_log
from .ports import PartitionWriter

log = logging.getLogger("semel.coordinator.runtime")


class Status(Enum):
    NEW = "new"            # built, not started: COORDINATOR_NOT_AVAILABLE
    STOPPED = "stopped"    # not the coordinator of its partition: NOT_COORDINATOR
    LOADING = "loading"    # replaying its log: COORDINATOR_LOAD_IN_PROGRESS
    ACTIVE = "active"      # loaded and serving


# (status, event) -> next status. "load" may come in any status (a seat regained at a
# newer epoch loads again); "serve" only after a load; "unload" and "stop" end serving.
TRANSITIONS: dict[tuple[Status, str], Status] = {
    (Status.NEW, "start"): Status.STOPPED,
    **{(s, "load"): Status.LOADING for s in Status},
    (Status.LOADING, "serve"): Status.ACTIVE,
    (Status.ACTIVE, "serve"): Status.ACTIVE,
    **{(s, "unload"): Status.STOPPED for s in Status},
    **{(s, "stop"): Status.STOPPED for s in Status},
}

ERRORS = {Status.NEW: KafkaError.COORDINATOR_NOT_AVAILABLE, Status.STOPPED: KafkaError.NOT_COORDINATOR,
          Status.LOADING: KafkaError.COORDINATOR_LOAD_IN_PROGRESS, Status.ACTIVE: KafkaError.NONE}


class IllegalTransition(Exception):
    pass


class Shard(Protocol):
    """What the runtime needs of a coordinator's state: forget it, and rebuild it one
    batch of its log at a time (`buf[pos:]` holds the batch `hdr` describes)."""

    def clear(self) -> None: ...

    def replay(self, buf: bytes | memoryview, pos: int, hdr: BatchHeader) -> None: ...


class CoordinatorRuntime:
    """The lifecycle of one coordinator partition. `topic` names its internal topic,
    `writer` is what waits for a record's commit point (None: a write counts at once,
    for tests), `clock` stamps batches and drives the timers (None: wall clock for
    batches, the monotonic clock for deadlines)."""

    def __init__(self, topic: str, writer: PartitionWriter | None, *, sync_writes: bool = True,
                 clock: Callable[[], int] | None = None, timer_clock: Callable[[], int] | None = None) -> None:
        self.topic = topic
        self.status = Status.NEW
        self.epoch: int | None = None     # the leader epoch loaded at (cluster); None on a single node
        self.log = CoordinatorLog(topic, writer, self.spawn, sync_writes=sync_writes, clock=clock)
        self.timers = Timers(timer_clock or mono_ms)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._services: list[asyncio.Task[None]] = []
        self._wake: asyncio.Event | None = None

    # --- status ---------------------------------------------------------------------------

    def move(self, event: str) -> Status:
        nxt = TRANSITIONS.get((self.status, event))
        if nxt is None:
            raise IllegalTransition(f"{self.topic}: {event} while {self.status.value}")
        self.status = nxt
        return nxt

    def error(self) -> KafkaError:
        """NONE while serving; why not otherwise."""
        return ERRORS[self.status]

    def serving(self) -> bool:
        return self.status is Status.ACTIVE

    # --- load and unload ---------------------------------------------------------------

    def load(self, shard: Shard, plog: PartitionLog, epoch: int | None) -> int:
        """Rebuild `shard` from `plog` (synchronously: nothing runs between reading the
        log and changing memory); returns how many records the log holds."""
        self.move("load")
        self.epoch = epoch
        self.log.plog = plog
        if not plog.fsync_repair.trusted:
            # A failed fsync left a tail the log cuts back (storage.fsync_repair): cut it
            # now, so memory never takes records the log is about to drop.
            plog.check_writable()
        started = time.monotonic()
        shard.clear()
        records = 0
        for buf, pos, hdr in scan_log(plog):
            records += hdr.record_count
            shard.replay(buf, pos, hdr)
        self.log.records_since_compaction = records
        log.debug("%s: replayed %d record(s) in %.3fs", self.topic, records, time.monotonic() - started)
        return records

    def serve(self) -> None:
        self.move("serve")

    def unload(self, *, cancel_tasks: bool) -> None:
        """Not the coordinator (any more): writes still waiting are answered
        NOT_COORDINATOR; with `cancel_tasks` the shard's background work stops too."""
        self.move("unload")
        if cancel_tasks:
            for task in list(self._tasks):
                task.cancel()
        self.log.fail_all(KafkaError.NOT_COORDINATOR)

    # --- the write path ------------------------------------------------------------------

    def write(self, batch: bytes, replay: Callable[[], None], *, durable: bool = True,
              what: str = "a record") -> "asyncio.Future[tuple[KafkaError, bool]]":
        """Append `batch` now, wait for its commit point, `replay` it in log order, answer
        (NONE, True). A batch that never reached the log is answered (error, False) and
        not replayed. One whose commit wait failed is in the log (a restart would replay
        it), so memory follows the log: it is replayed and answered (error, True).
        `durable=False`: it counts once appended. `what` names it in the log line."""
        def committed(_info: object) -> tuple[KafkaError, bool]:
            replay()
            return KafkaError.NONE, True

        def unsynced(error: KafkaError) -> tuple[KafkaError, bool]:
            log.log(self.log.failure_level, "%s: %s not made durable here; it stays in the log", self.topic, what)
            replay()
            return error, True

        return self.log.write(lambda: self.log.append(batch), committed, lambda error: (error, False),
                              unsynced=unsynced, durable=durable)

    # --- start and stop ---------------------------------------------------------------

    def start(self, *, run_timers: bool = True) -> None:
        """Started (not serving until the seat loads it); with `run_timers` a task fires
        the timers as they fall due."""
        self.move("start")
        if run_timers:
            self._wake = asyncio.Event()
            self.timers.on_change = self._wake.set
            self._services.append(asyncio.create_task(self._timer_loop(), name=f"{self.topic}-timers"))

    def every(self, interval_s: float, name: str, job: Callable[[], Awaitable[None]]) -> None:
        """Run `job` every `interval_s` while serving (a periodic write: expiry,
        compaction), one pass at a time; a failed pass is logged, the next one runs."""
        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_s)
                if not self.serving():
                    continue   # never expire or compact a log this broker does not coordinate
                try:
                    await job()
                except Exception:
                    log.exception("%s: %s failed", self.topic, name)
        self._services.append(asyncio.create_task(loop(), name=f"{self.topic}-{name}"))

    async def stop(self, *, cancel_tasks: bool, wait_s: float = 5) -> None:
        """Stop serving and the periodic work; the shard's background tasks are cancelled
        (`cancel_tasks`) or given `wait_s` to finish. Writes whose commit wait ends
        unanswered are answered NOT_COORDINATOR."""
        self.move("stop")
        services, self._services = self._services, []
        for task in services:
            task.cancel()
        if cancel_tasks:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*services, *self._tasks, return_exceptions=True)
        else:
            await asyncio.gather(*services, return_exceptions=True)
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=wait_s)
        self.log.fail_all(KafkaError.NOT_COORDINATOR)

    # --- background work ----------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run `coro` in the background, owned by this partition (see unload, stop)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: coordinator task failed", self.topic, exc_info=task.exception())

    @property
    def tasks(self) -> set[asyncio.Task[Any]]:
        """The background tasks still running."""
        return self._tasks

    async def idle(self) -> None:
        """Wait until every background task has finished (for tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- timers ---------------------------------------------------------------------------

    def fire_timers(self) -> int:
        """Run the deadlines that are due by the timers' clock (tests call this after
        advancing a fake clock; the timer loop calls it otherwise)."""
        return self.timers.fire_due()

    async def _timer_loop(self) -> None:
        """Sleep until the next deadline (or until a timer is set), fire what is due.
        Every timeout depends on this loop, so it logs and carries on after any
        unexpected error instead of dying silently."""
        assert self._wake is not None
        while True:
            try:
                self._wake.clear()
                deadline = self.timers.next_deadline()
                delay = None if deadline is None else (deadline - self.timers.now()) / 1000
                if delay is None or delay > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), delay)
                    except asyncio.TimeoutError:
                        pass
                self.fire_timers()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: timer loop failed; continuing", self.topic)
                await asyncio.sleep(0.1)

