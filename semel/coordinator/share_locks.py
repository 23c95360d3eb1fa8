"""Acquisition locks that run out, released by the coordinator runtime's timers.

Every acquired record carries a deadline (share_partition.InFlight.deadline). A fetch
releases what ran out as it looks, but a share-partition nobody fetches from would keep
expired records acquired until then: describe, the metrics and the other members'
next fetch would see them held. So each share-partition with records acquired has one
runtime timer, due at its earliest deadline; when it fires it releases what ran out
(available again, or archived at the delivery limit) and sets itself again for the
next deadline, if any record is still acquired.

A timer runs on the event loop between operations, as every operation decides
synchronously, so it never interleaves with a fetch's acquisition.
"""
from __future__ import annotations

from functools import partial
from typing import Callable, Iterable

from .group_timers import Timers
from .share_partition import SharePartition
from .share_state import ShareState

KIND = "share-lock"


def next_deadline(sp: SharePartition) -> int | None:
    """The earliest lock deadline of the share-partition (None: nothing acquired)."""
    return sp.next_deadline()


class LockTimers:
    """One timer per share-partition holding acquired records. `serving` says whether
    this broker coordinates the share groups now; `expired(group, topic, partition)`
    is told after a timer released records (the coordinator writes the new state)."""

    def __init__(self, timers: Timers, state: ShareState, serving: Callable[[], bool],
                 expired: Callable[[str, str, int], None]) -> None:
        self.timers = timers
        self.state = state
        self.serving = serving
        self.expired = expired

    def arm(self, group_id: str, keys: Iterable[tuple[str, int]]) -> None:
        """Make sure each share-partition of `keys` has its timer. A new lock never runs
        out before the ones already held (same duration, later start), so a timer
        already set stays."""
        for topic, p in keys:
            key = (KIND, group_id, topic, p)
            sp = self.state.partition(group_id, topic, p)
            if sp is None or self.timers.active(key):
                continue
            deadline = next_deadline(sp)
            if deadline is not None:
                self.timers.set(key, deadline - self.timers.now(), partial(self._fire, key))

    def _fire(self, key: tuple[str, str, str, int]) -> None:
        _, group_id, topic, p = key
        sp = self.state.partition(group_id, topic, p)
        if sp is None or not self.serving():
            return
        if sp.expire(self.timers.now(), self.state.limits(group_id)):
            self.expired(group_id, topic, p)
        self.arm(group_id, [(topic, p)])

    def cancel_all(self) -> None:
        """The coordinator unloads: locks die with its memory."""
        self.timers.cancel_if(lambda key: isinstance(key, tuple) and key[:1] == (KIND,))
