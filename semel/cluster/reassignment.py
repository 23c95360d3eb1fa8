"""Partition reassignment (Kafka's KIP-455): move a partition's replicas while it serves.

AlterPartitionReassignments writes the target into the partition's state in etcd
(`begin`): `replicas` becomes the target followed by the original replicas that leave,
`adding` the target replicas new to the partition, `removing` the original ones not in
the target, `origin` the original replicas in their order. Nothing else changes then: the leader keeps leading, the ISR stays, and
the adding replicas start fetching as followers (every broker holds every partition's
log, so a new replica starts from an empty or stale log and catches up the usual way:
truncation by leader epoch, then fetches). The leader takes each into the ISR once it
has caught up, as any follower. The controller then finishes it (`finish`): once
every target replica is in the ISR, replicas = target, the ISR loses the removed
replicas, and a leader that is removed (or gone) hands over to the first target
replica in the ISR with the leader epoch bumped, as an election does. Every write is
a compare-and-set on the partition's version, so a reassignment never races a leader's
ISR change or an election.

acks=all holds throughout: the high watermark counts the ISR only, and the ISR only
grows by caught-up replicas before the removed ones leave. Cancelling (a null target)
is `begin` with the original replicas as the target: the adding replicas leave and
the replicas are as before, in their order.

The leader may limit how fast adding replicas fetch (`Throttle`, bytes/s over all of
them, Kafka's leader.replication.throttled.rate): they get no records while the
budget is spent, so a reassignment does not starve the replication of the ISR.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Iterable, Sequence

from ..protocol.errors import KafkaError
from .state import NO_LEADER, PartitionState

THROTTLE_RATE = "leader.replication.throttled.rate"


def original(st: PartitionState) -> tuple[int, ...]:
    """The replicas before the ongoing reassignment, in their order (the replicas when
    there is none)."""
    if not st.reassigning:
        return st.replicas
    return st.origin or tuple(r for r in st.replicas if r not in st.adding)


def target(st: PartitionState) -> tuple[int, ...]:
    """The replicas the ongoing reassignment ends with (the replicas when there is none)."""
    return tuple(r for r in st.replicas if r not in st.removing)


def begin(st: PartitionState, new: Sequence[int] | None, brokers: Iterable[int]
          ) -> PartitionState | tuple[KafkaError, str]:
    """The state that starts (or replaces, or with `new` None cancels) a reassignment of
    `st` to the replicas `new`; (error, message) when it may not. `brokers`: the
    registered ones, which every new target replica must be."""
    orig = original(st)
    if new is None:
        if not st.reassigning:
            return KafkaError.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment in progress"
        new = orig
    new = tuple(new)
    if not new or len(set(new)) != len(new):
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, "the target replicas must be distinct and not empty"
    unknown = sorted(set(new) - set(orig) - set(brokers))
    if unknown:
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, f"brokers {unknown} are not registered"
    removing = tuple(r for r in orig if r not in new)
    replicas = new + removing
    isr = tuple(r for r in st.isr if r in replicas)
    if not isr:
        return KafkaError.INVALID_REPLICA_ASSIGNMENT, "no replica of the result would be in sync"
    adding = tuple(r for r in new if r not in orig)
    out = replace(st, replicas=replicas, isr=isr, adding=adding, removing=removing,
                  origin=orig if adding or removing else ())
    if st.leader != NO_LEADER and st.leader not in replicas:
        # A replica being added that led (it was in the ISR) and is dropped by a new
        # target or a cancel: elect among what stays.
        out = replace(out, leader=next(r for r in replicas if r in isr), leader_epoch=st.leader_epoch + 1)
    return finish(out, brokers) or out


def finish(st: PartitionState, live: Iterable[int]) -> PartitionState | None:
    """The controller's step: the state that completes the reassignment once every
    target replica is in the ISR, None while it must wait (or there is none). The
    leader stays if it is a live target replica; otherwise the first live target
    replica in the ISR leads at the next epoch."""
    if not st.reassigning:
        return None
    tgt = target(st)
    if not set(tgt) <= set(st.isr):
        return None
    live = set(live)
    out = replace(st, replicas=tgt, isr=tuple(r for r in st.isr if r in tgt), adding=(), removing=(), origin=())
    if st.leader in tgt and st.leader in live:
        return out
    candidates = [r for r in tgt if r in live]
    if not candidates:
        return None
    return replace(out, leader=candidates[0], leader_epoch=st.leader_epoch + 1)


class Throttle:
    """A token bucket of `rate` bytes/s shared by the fetches of adding replicas on one
    leader (0: unlimited). `allow()` before a throttled read, `spend(n)` after it; the
    bucket holds at most one second of budget, so an idle spell does not buy a burst."""

    def __init__(self, rate: int = 0, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self._clock = clock
        self._tokens = float(rate)
        self._at = clock()

    def set_rate(self, rate: int) -> None:
        if rate != self.rate:
            self.rate = rate
            self._tokens = min(self._tokens, float(rate))

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def allow(self) -> int:
        """Bytes a throttled read may take now: 0 while the budget is spent, -1 unlimited."""
        if self.rate <= 0:
            return -1
        self._refill()
        return int(self._tokens) if self._tokens >= 1 else 0

    def spend(self, n: int) -> None:
        if self.rate > 0:
            self._refill()
            self._tokens -= n
