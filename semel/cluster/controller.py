"""The cluster controller: replica assignment and leader election.

The decisions are pure functions of (partition state, live brokers) so they can be
checked exhaustively; `Controller` is the thin shell that runs them on the broker
holding the controller seat and writes each result by compare-and-set on the
partition's version. Because every write compares the version it was decided on,
two controllers acting at once (the old one not yet aware its lease ended, the new
one just elected) cannot both change a partition from the same state: one CAS wins,
the other re-reads. Leader epochs therefore only grow and each epoch has one leader.

Election rules (Kafka's, clean election only):
- a partition whose leader is live keeps it; dead brokers leave its ISR;
- a partition whose leader is dead (or that has none) gets the first replica, in
  assignment order, that is live and in the ISR, with leader_epoch + 1;
- with no live ISR member it becomes leaderless (leader -1, epoch + 1) and keeps
  its last ISR, so the first of those brokers to return leads again: no unclean
  election, no data loss of acknowledged writes;
- a broker coming back does not take leadership back at once (no needless moves);
  the balance check (Kafka's auto.leader.rebalance.enable) runs every
  leader.imbalance.check.interval.seconds and hands leadership back to preferred
  replicas only where a broker's share of partitions led elsewhere is above
  leader.imbalance.per.broker.percentage (semel.cluster.elections).

A reassignment in progress completes here too (semel.cluster.reassignment.finish).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Sequence

from .elections import PREFERRED, imbalanced, run_election
from .etcd import EtcdError
from .reassignment import finish as finish_reassignment
from .state import NO_LEADER, PartitionState

if TYPE_CHECKING:
    from .metadata import EtcdClusterView

log = logging.getLogger("semel.cluster.controller")


def assign_replicas(brokers: Iterable[int], partitions: int, replication_factor: int,
                    start: int | None = None, shift: int | None = None) -> list[tuple[int, ...]]:
    """Kafka's rack-unaware spread: partition p's first replica is broker (start + p) % n,
    its followers follow at a distance that grows by one every n partitions, so both
    leaders and followers spread evenly. ValueError when rf exceeds the live brokers."""
    ids = sorted(brokers)
    n = len(ids)
    if replication_factor < 1 or replication_factor > n:
        raise ValueError(f"replication factor {replication_factor} needs that many live brokers (have {n})")
    start = random.randrange(n) if start is None else start % n
    shift = random.randrange(n) if shift is None else shift
    out = []
    for p in range(partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[(first + 1 + (shift + j) % (n - 1)) % n])
        out.append(tuple(replicas))
    return out


def assign_new_partitions(brokers: Sequence[int], existing: int, total: int,
                          replication_factor: int) -> list[tuple[int, ...]]:
    """Replicas for the partitions a topic gains (existing .. total-1), round-robin over the
    live brokers as assign_replicas spreads a topic of `total` partitions, so the new
    leaders spread evenly. ValueError when rf exceeds the live brokers."""
    return assign_replicas(brokers, total, replication_factor)[existing:]


def decide(st: PartitionState, live: Iterable[int]) -> PartitionState | None:
    """The state the controller wants for this partition given the live brokers,
    or None when it is already right. Never touches version (the CAS does)."""
    live = set(live)
    isr_live = tuple(r for r in st.isr if r in live)
    if st.leader != NO_LEADER and st.leader in live:
        if isr_live != st.isr and isr_live:
            return replace(st, isr=isr_live)
        return None
    candidates = [r for r in st.replicas if r in isr_live]
    if candidates:
        return replace(st, leader=candidates[0], leader_epoch=st.leader_epoch + 1, isr=isr_live)
    if st.leader != NO_LEADER:
        # Offline: keep the last ISR so one of them (and only they) may lead again.
        return replace(st, leader=NO_LEADER, leader_epoch=st.leader_epoch + 1)
    return None


def _etcd_failed(view: EtcdClusterView, exc: EtcdError) -> None:
    """Counted in the view's outage log (one line per outage)."""
    view.outage.failed("controller step", exc)


class Controller:
    """Runs on every broker; acts only while this broker holds the controller seat.

    `view` is an EtcdClusterView (partitions(), brokers(), write_partition(),
    try_become_controller(), add_change_listener()).
    """

    def __init__(self, view: EtcdClusterView, poll_s: float = 1.0, *, rebalance: bool = True, imbalance_percentage: int = 10,
                 imbalance_check_interval_s: float = 300):
        self.view = view
        self.poll_s = min(poll_s, imbalance_check_interval_s)
        self.rebalance = rebalance
        self.imbalance_percentage = imbalance_percentage
        self.imbalance_check_interval_s = imbalance_check_interval_s
        self._next_balance_check = time.monotonic() + imbalance_check_interval_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        view.add_change_listener(self._wake.set)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="cluster-controller")

    async def stop(self) -> None:
        # A flag as well as the cancel: Python 3.11's wait_for can swallow a cancel that
        # lands as the wake event fires, and the loop would then run on for ever.
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def active(self) -> bool:
        return self.view.controller_id() == self.view.node_id

    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self.step()
            except EtcdError as exc:
                _etcd_failed(self.view, exc)
            except Exception:   # a bug here must not stop elections for good
                log.exception("controller step failed")
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    async def step(self) -> None:
        if self.view.fenced:
            return     # its view may be stale and its seat gone: no decision from here
        if self.view.controller_id() is None and await self.view.try_become_controller():
            log.info("broker %d is the controller", self.view.node_id)
        if self.active:
            await self.reconcile()
            if self.rebalance and time.monotonic() >= self._next_balance_check:
                self._next_balance_check = time.monotonic() + self.imbalance_check_interval_s
                await self.balance_leaders()

    async def reconcile(self) -> int:
        """Apply decide() to every partition; the number of partitions changed."""
        live = set(self.view.brokers())
        changed = 0
        for st in self.view.partitions():
            want = decide(st, live) or finish_reassignment(st, live)
            if want is None:
                continue
            stored = await self.view.write_partition(st, want)
            if stored is None:   # changed under us (a leader's ISR change, another controller)
                continue         # the watch brings the new state and wakes us again
            changed += 1
            if stored.leader != st.leader:
                log.info("%s-%d: leader %d -> %d, epoch %d, isr %s", st.topic, st.partition,
                         st.leader, stored.leader, stored.leader_epoch, list(stored.isr))
        return changed

    async def balance_leaders(self) -> int:
        """Kafka's automatic preferred-leader election: the partitions the imbalance check
        picks get a preferred election; the number moved."""
        moved = 0
        for st in imbalanced(self.view.partitions(), self.view.brokers(), self.imbalance_percentage):
            if not self.active:   # the seat went elsewhere meanwhile: its holder decides
                break
            if await run_election(self.view, st.topic, st.partition, PREFERRED) == 0:
                moved += 1
        if moved:
            log.info("leader balance: %d partitions back on their preferred replica", moved)
        return moved
