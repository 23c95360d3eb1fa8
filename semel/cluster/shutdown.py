"""Controlled shutdown (Kafka's controlled.shutdown.enable): before a broker of a cluster
stops on SIGTERM, it hands every partition it leads to an in-sync peer and leaves the
ISR of the partitions it follows, so clients move at once instead of waiting out its
session, and acks=all stops waiting for a broker that is going away.

Coordinators go with the internal partitions: the transaction and group coordinators
live on the leaders of `__transaction_state` and `__consumer_offsets`
(semel.cluster.coordinator_host), so handing those partitions over hands them over.

Each change is an election as the controller's (leader epoch + 1, written by
compare-and-set on the partition's version). The broker first stops fetching as a
follower, so no leader adds it back to an ISR while it leaves (and the balance check,
which moves leadership only to in-sync replicas, cannot give it any back). A partition
no in-sync peer can take (replication factor 1, a shrunk ISR) keeps this broker as its
leader until it stops; the wait for the rest is bounded.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable

from .etcd import EtcdError
from .state import ClusterView, PartitionState

if TYPE_CHECKING:
    from .replica_manager import ReplicaManager

log = logging.getLogger("semel.cluster.shutdown")

POLL_S = 0.05


def handoff(st: PartitionState, me: int, live: Iterable[int]) -> PartitionState | None:
    """The state a broker going away wants for one partition, None when nothing to do:
    its leadership to the first in-sync live peer in assignment order, and itself out of
    the ISR (of a partition it follows too, while its leader stays in the ISR)."""
    live = set(live)
    peers = tuple(r for r in st.isr if r != me and r in live)
    if st.leader == me:
        target = next((r for r in st.replicas if r in peers), None)
        if target is None:
            return None
        return replace(st, leader=target, leader_epoch=st.leader_epoch + 1, isr=peers)
    if me in st.isr and st.has_leader and st.leader in st.isr:
        return replace(st, isr=tuple(r for r in st.isr if r != me))
    return None


async def controlled_shutdown(view: ClusterView, replicas: ReplicaManager | None, timeout_s: float) -> int:
    """Hand over what this broker can, for at most timeout_s; the partitions still led
    here at the end (those with no in-sync peer, or left when time ran out)."""
    me = view.node_id
    if replicas is not None:
        replicas.fetching_paused = True
    deadline = time.monotonic() + timeout_s
    moved = 0
    while True:
        todo = [(st, want) for st in view.partitions()
                if (want := handoff(st, me, view.brokers())) is not None]
        if not todo:
            break
        if time.monotonic() >= deadline:
            log.warning("controlled shutdown: %d partitions not handed over after %.0fs", len(todo), timeout_s)
            break
        # All at once: while a write is pending, a partition this broker follows waits for
        # it (it has stopped fetching but is still in the ISR), so one round trip, not one each.
        moved += sum(await asyncio.gather(*(_write(view, st, want) for st, want in todo)))
        await asyncio.sleep(POLL_S)
    kept = sum(1 for st in view.partitions() if st.leader == me)
    log.info("controlled shutdown: %d leaderships handed over, %d kept", moved, kept)
    return kept


async def _write(view: ClusterView, st: PartitionState, want: PartitionState) -> int:
    """One hand-over by compare-and-set; 1 when it moved leadership."""
    try:
        stored = await view.write_partition(st, want)
        if stored is None:   # changed meanwhile: read it and decide again
            await view.read_partition(st.topic, st.partition)
            return 0
        return int(stored.leader != st.leader)
    except EtcdError as exc:
        log.warning("controlled shutdown: %s-%d: %s", st.topic, st.partition, exc)
        return 0
