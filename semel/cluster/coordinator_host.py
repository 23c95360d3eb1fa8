"""A coordinator driven by its seat on a replicated internal partition: the joint
between the cluster view, `CoordinatorSeat` and a coordinator.

In a cluster each partition of `__transaction_state` and `__consumer_offsets` has its
own coordinator (semel.coordinator.partitioned), living on that partition's
leader. `SeatedCoordinator` listens to its partition's states and runs what the seat
decides:

- leading at a newer epoch: drop whatever is in memory, wait until the high watermark
  reaches the log end (everything about to be replayed is on every in-sync replica),
  replay, and serve at that epoch, which is also the coordinator epoch written into
  markers; the transaction coordinator then rolls Prepare* records forward;
- anything else (another leader, no leader): drop memory at once, so requests get
  NOT_COORDINATOR and in-flight writes are answered NOT_COORDINATOR.

The coordinator (semel.coordinator.ports.Loadable), given at `start`, offers three calls, none of which awaits between reading the
log and changing memory: `unload()`, `load(plog, epoch)` (synchronous replay) and
`serve(epoch)` (start answering; background work such as rolling forward).
Requests are gated on `error()` (semel.broker.coordinator_gate).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from ..protocol.errors import KafkaError
from .coordinator_seat import LOAD, CoordinatorSeat, Seat

log = logging.getLogger("semel.cluster.coordinator_host")

# How long one wait for the high watermark lasts before the load looks again (the seat
# may have moved on meanwhile); and the pause when replication is not running yet.
HW_WAIT_S = 1.0
RETRY_S = 0.1


class SeatedCoordinator:
    """The CoordinatorSeat (semel.coordinator.ports) of one internal partition.

    `view` is the ClusterView, `logs` the LogManager, `replicas()` the ReplicaManager
    (None until replication runs)."""

    def __init__(self, view: Any, node_id: int, logs: Any, replicas: Callable[[], Any], topic: str, partition: int):
        self.view = view
        self.logs = logs
        self.replicas = replicas
        self.topic = topic
        self.partition = partition
        self.coordinator: Any = None
        self.seat = CoordinatorSeat(node_id)
        self._load_task: asyncio.Task[None] | None = None
        self._running = False

    # -- lifecycle ---------------------------------------------------------------------
    def start(self, coordinator: Any) -> None:
        """Follow the partition's states, loading, serving and dropping `coordinator`
        (after the replication data plane started, so its listener has taken the
        partition's role before ours runs)."""
        self.coordinator = coordinator
        self._running = True
        self.view.add_listener(self.on_partition)
        st = self.view.partition(self.topic, self.partition)
        if st is not None:
            self.on_partition(st)

    async def stop(self) -> None:
        self._running = False
        await self._cancel_load()

    # -- what requests see -------------------------------------------------------------
    def error(self) -> KafkaError:
        """NONE while serving; COORDINATOR_LOAD_IN_PROGRESS while loading; else NOT_COORDINATOR."""
        return self.seat.error()

    def serving(self) -> bool:
        return self.seat.serving()

    @property
    def epoch(self) -> int:
        return self.seat.epoch

    # -- the seat's decisions ------------------------------------------------------------
    def on_partition(self, st: Any) -> None:
        """ClusterView listener: runs synchronously, so memory is dropped before any
        request handled after this state arrived."""
        if not self._running or (st.topic, st.partition) != (self.topic, self.partition):
            return
        action = self.seat.observe(st)
        if action is None:
            return
        kind, epoch = action
        if self._load_task is not None:
            self._load_task.cancel()
            self._load_task = None
        self.coordinator.unload()
        if kind == LOAD:
            log.info("%s-%d: leader at epoch %d, loading the coordinator", self.topic, self.partition, epoch)
            self._load_task = asyncio.get_running_loop().create_task(
                self._load(epoch), name=f"load-{self.topic}-{self.partition}")
        else:
            log.info("%s-%d: not the leader any more (epoch %d), coordinator unloaded",
                     self.topic, self.partition, epoch)

    def _still_loading(self, epoch: int) -> bool:
        return self._running and self.seat.state is Seat.LOADING and self.seat.epoch == epoch

    async def _load(self, epoch: int) -> None:
        while self._still_loading(epoch):
            plog = self.logs.get(self.topic, self.partition)
            replicas = self.replicas()
            if plog is None or replicas is None:
                await asyncio.sleep(RETRY_S)
                continue
            end = plog.log_end_offset
            # The error is not the point: only whether the high watermark got there.
            await replicas.wait_for_hw(self.topic, self.partition, end, HW_WAIT_S)
            if not self._still_loading(epoch):
                return
            if not self.seat.may_finish_load(plog.high_watermark, end) or plog.log_end_offset != end:
                await asyncio.sleep(RETRY_S)
                continue
            try:
                self.coordinator.load(plog, epoch)      # no await: the replayed end is `end`
            except Exception:   # a damaged log: stay loading (COORDINATOR_LOAD_IN_PROGRESS), say why
                log.exception("%s-%d: loading the coordinator at epoch %d failed", self.topic, self.partition, epoch)
                return
            if not self.seat.loaded(epoch):
                self.coordinator.unload()
                return
            log.info("%s-%d: coordinator serving at epoch %d (log end %d)", self.topic, self.partition, epoch, end)
            self.coordinator.serve(epoch)
            return

    async def _cancel_load(self) -> None:
        task, self._load_task = self._load_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
