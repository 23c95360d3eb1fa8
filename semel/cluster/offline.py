"""Partitions whose disk failed on this broker: out of service, handed over, and back
once the disk works (as Kafka takes a log directory offline).

A write or fsync of a partition's log that failed (EIO, a full disk) may leave the
page cache holding what the disk does not (after a failed fsync the kernel may drop
the dirty pages, and a retried fsync then succeeds without them), so this broker stops
trusting the log: it stops leading and following the partition (a held acks=all is
answered NOT_LEADER_OR_FOLLOWER, never acknowledged) and leaves its ISR by
compare-and-set (elections.leave_isr), so the controller elects another in-sync
replica at once. Then, after a delay that grows from 1 s to 30 s, it probes the
partition's directory (a small file written, fsynced, renamed and removed) and reopens
the log from its files (recovery cuts whatever does not check out). Once both work,
the partition is followed again and its leader takes it back into the ISR when it has
caught up. Where this broker is the partition's last in-sync replica it stays in the
ISR (never empty) and the partition has no serving leader until the disk is back.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Callable

from ..backoff import Backoff
from ..storage import LogManager
from ..storage.errors import StorageError
from ..storage.fs import FileSystem
from .elections import leave_isr
from .etcd import EtcdError
from .replica_rules import TopicPartition
from .state import ClusterView

log = logging.getLogger("semel.cluster.offline")

PROBE = ".disk-probe"
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
CAS_TRIES = 5


@dataclass
class Offline:
    reason: str
    retry_at: float
    pace: Backoff
    left_isr: bool = False        # the compare-and-set out of the ISR went through
    failed_tries: int = field(default=0)


class OfflineLogs:
    """The partitions this broker took out of service for a disk failure (see the
    module docstring). The replica manager calls `check` for the partitions it serves
    and `retry_due` in its upkeep loop; `holds(tp)` tells it to take no role there."""

    def __init__(self, view: ClusterView, logs: LogManager, fs: FileSystem,
                 clock: Callable[[], float] = time.monotonic):
        self.view = view
        self.logs = logs
        self.fs = fs
        self._clock = clock
        self.offline: dict[TopicPartition, Offline] = {}
        self._seen: dict[TopicPartition, int] = {}     # storage failures already acted on

    def holds(self, tp: TopicPartition) -> bool:
        return tp in self.offline

    def newly_failed(self, tp: TopicPartition) -> str | None:
        """Why tp's log must go offline now (a write or fsync failed since the last
        look, or the log took itself offline), None when it is fine."""
        plog = self.logs.get(*tp)
        if plog is None or tp in self.offline:
            return None
        failures = plog.storage_failures
        if failures > self._seen.get(tp, 0):
            self._seen[tp] = failures
            return f"{failures} failed write(s) or fsync(s)"
        if plog.failed_reason is not None:
            return plog.failed_reason
        return None

    def take(self, tp: TopicPartition, reason: str) -> None:
        pace = Backoff(math.inf, first_s=RETRY_FIRST_S, max_s=RETRY_MAX_S)
        self.offline[tp] = Offline(reason, self._clock() + pace.step(), pace)
        log.warning("%s-%d: offline on this broker (%s); handing it over until the disk works", *tp, reason)

    async def leave_isrs(self) -> None:
        """Leave the ISR of every offline partition not yet out of it (retried each round
        while etcd does not answer)."""
        for tp, off in list(self.offline.items()):
            if off.left_isr:
                continue
            try:
                off.left_isr = await self._leave_isr(tp)
            except EtcdError as exc:
                log.info("%s-%d: cannot leave the ISR yet: %s", *tp, exc)

    async def _leave_isr(self, tp: TopicPartition) -> bool:
        me = self.view.node_id
        st = self.view.partition(*tp)
        for _ in range(CAS_TRIES):
            if st is None:
                return True
            want = leave_isr(st, me)
            if want is None:
                return True           # not in it, or its last member
            if await self.view.write_partition(st, want) is not None:
                log.info("%s-%d: left the ISR (disk failure); isr now %s", *tp, list(want.isr))
                return True
            st = await self.view.read_partition(*tp)
        return False

    def retry_due(self) -> list[TopicPartition]:
        """Offline partitions whose disk works again: probed and reopened now; they are
        no longer held and the caller takes their roles again."""
        back = []
        now = self._clock()
        for tp, off in list(self.offline.items()):
            if now < off.retry_at or not off.left_isr:
                continue
            try:
                self._probe(tp)
                self.logs.reopen(*tp)
            except (OSError, StorageError) as exc:
                off.failed_tries += 1
                off.retry_at = now + off.pace.step()
                if off.failed_tries == 1 or off.failed_tries % 10 == 0:   # once, then sparingly
                    log.warning("%s-%d: disk still failing (%s); next try in %.0f s", *tp, exc, off.retry_at - now)
                continue
            del self.offline[tp]
            self._seen.pop(tp, None)
            log.info("%s-%d: disk works again; log reopened, following to catch up", *tp)
            back.append(tp)
        return back

    def _probe(self, tp: TopicPartition) -> None:
        d = self.logs.partition_dir(*tp)
        self.fs.write_atomic(d / PROBE, b"probe", sync_dir=True)
        self.fs.unlink(d / PROBE)
        self.fs.fsync_dir(d)
