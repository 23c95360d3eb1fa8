"""Named deadlines for the group coordinator (session, rebalance, initial delay,
pending sync, offsets retention, compaction), driven by a clock tests replace."""
from __future__ import annotations

import heapq
import itertools
import logging
from typing import Any, Callable

from ..clock import wall_ms

log = logging.getLogger("semel.coordinator.group")


def wall_clock_ms() -> int:
    return wall_ms()


class Timers:
    """Named deadlines. Setting a name again replaces its deadline; the heap keeps
    stale entries until they surface (heartbeats re-arm often), compacted when
    they outnumber the live ones."""

    def __init__(self, clock: Callable[[], int]):
        self._clock = clock
        self._heap: list[tuple[int, int, Any]] = []
        # A callback's result is not used (one that spawns a task returns it).
        self._live: dict[Any, tuple[int, int, Callable[[], object]]] = {}
        self._seq = itertools.count()
        self.on_change: Callable[[], None] | None = None

    def set(self, key: Any, delay_ms: int, callback: Callable[[], object]) -> None:
        deadline = self._clock() + max(0, int(delay_ms))
        seq = next(self._seq)
        self._live[key] = (deadline, seq, callback)
        heapq.heappush(self._heap, (deadline, seq, key))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [(d, s, k) for k, (d, s, _) in self._live.items()]
            heapq.heapify(self._heap)
        if self.on_change is not None:
            self.on_change()

    def cancel(self, key: Any) -> None:
        self._live.pop(key, None)

    def cancel_if(self, wanted: Callable[[Any], bool]) -> None:
        """Cancel every timer whose key `wanted` accepts."""
        for key in [k for k in self._live if wanted(k)]:
            del self._live[key]

    def active(self, key: Any) -> bool:
        return key in self._live

    def _is_stale(self, entry: tuple[int, int, Any]) -> bool:
        live = self._live.get(entry[2])
        return live is None or live[1] != entry[1]

    def now(self) -> int:
        """The clock the deadlines are on."""
        return self._clock()

    def next_deadline(self) -> int | None:
        while self._heap and self._is_stale(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def fire_due(self) -> int:
        """Run every callback whose deadline has passed; returns how many ran."""
        now, fired = self._clock(), 0
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._is_stale(entry):
                continue
            _, _, callback = self._live.pop(entry[2])
            fired += 1
            try:
                callback()
            except Exception:  # one broken timer must not stop the others
                log.exception("group timer %r failed", entry[2])
        return fired
