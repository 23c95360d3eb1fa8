"""The leader side of replication and the roles: one ReplicaManager per broker in a
cluster makes this broker each partition's leader, follower or neither, as the
ClusterView says.

A listener call per partition change makes this broker the partition's leader (stamp
the leader epoch on appends, track every follower's log end) or a follower (truncate
by leader epoch, then fetch: semel.cluster.replica_fetcher). As leader, Kafka's rules
(decided by semel.cluster.replica_rules):

- A follower's fetch offset is its log end (fsynced under the durable flush policy:
  semel.cluster.replica_fetcher); the high watermark is the smallest log
  end over the ISR and only grows. A follower that has not caught up for
  replica_lag_time_max_ms leaves the ISR; one that reaches the high watermark joins
  again; both by compare-and-set (ClusterView.alter_isr), decided by `isr_change`,
  re-read and decided again when the CAS loses.
- acks=all completes when the high watermark passes the batch (`wait_for_hw`);
  NOT_ENOUGH_REPLICAS before the append when the ISR is below min.insync.replicas,
  NOT_ENOUGH_REPLICAS_AFTER_APPEND when it fell below while waiting.
- A leader that would be left alone in its ISR, below min.insync.replicas, because none
  of its followers reaches it, while they are registered and enough to take writes,
  hands leadership to them instead (replica_rules.hand_over), once they have been
  silent for 1.5 lease times (a dead one is unregistered by then).
- An ISR change that cannot reach etcd is retried by the next check; the outage is
  logged once (the view's OutageLog), never as a task's unretrieved exception.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..protocol.errors import KafkaError
from ..storage import LogManager
from ..storage.fs import FileSystem
from ..storage.log import PartitionLog
from .hw_checkpoint import HW_SAVE_INTERVAL_S, load_hws, save_hws
from .offline import OfflineLogs
from .peer import PeerDialer
from .reassignment import THROTTLE_RATE, Throttle
from .etcd import EtcdError
from .replica_fetcher import Durable, FetchSettings, LeaderFetcher
from .replica_rules import (UNDEFINED, FollowerProgress, TopicPartition, check_leader, diverging_epoch,
                            append_error, hand_over, high_watermark, isr_change, leader_epoch_error, min_insync_of)
from .session import OutageLog
from .state import ClusterView, PartitionState

log = logging.getLogger("semel.cluster.replica_manager")


@dataclass(frozen=True)
class ReplicaSettings:
    """The broker's replication settings, as semel.broker.wiring reads them from its config."""
    lag_time_max_ms: int          # replica_lag_time_max_ms: longer behind leaves the ISR
    min_insync_replicas: int      # for a topic that sets no min.insync.replicas
    hw_checkpoint: Path           # where the high watermarks are saved (cluster.hw_checkpoint)
    fetch: FetchSettings


@dataclass
class LeaderState:
    state: PartitionState
    plog: PartitionLog
    epoch_start: int
    progress: dict[int, FollowerProgress]
    waiters: list[Any] = field(default_factory=list)    # [upto, min_isr, future]
    isr_busy: bool = False
    # While an ISR change is in flight the high watermark counts the members of both
    # the old and the asked-for ISR (Kafka's "maximal ISR"): a replica about to join
    # must not find the high watermark already past its log end.
    pending_isr: tuple[int, ...] = ()

    def hw_isr(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.state.isr + self.pending_isr))


class ReplicaManager:
    """One per broker in a cluster (its ClusterNode role's `replicas`); see the module docstring.

    `logs` is the broker's LogManager, `fs` the FileSystem the high-watermark
    checkpoint goes through, `notify(topic, partition)` wakes the readers and long
    polls waiting on a partition, `dialer` reaches the leaders (the inter-broker
    listener and login)."""

    def __init__(self, view: ClusterView, logs: LogManager, fs: FileSystem, notify: Callable[[str, int], None],
                 dialer: PeerDialer, settings: ReplicaSettings, durable: Durable | None = None):
        self.view = view
        self.node_id = view.node_id
        self.logs = logs
        self.fs = fs
        self.notify = notify
        self.dialer = dialer
        self.settings = settings
        self.durable = durable      # followers fsync before reporting (the durable flush policy)
        self.offline = OfflineLogs(view, logs, fs)     # partitions whose disk failed here
        self.leading: dict[TopicPartition, LeaderState] = {}
        self.following: dict[TopicPartition, tuple[int, int]] = {}   # -> (leader, leader epoch)
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._versions: dict[TopicPartition, int] = {}
        self._seen: set[TopicPartition] = set()
        self._saved_hws: dict[TopicPartition, int] = {}
        self._last_hw_save = 0.0
        self._task: asyncio.Task[None] | None = None
        self._running = False
        self.throttle = Throttle()
        # Followers here stop fetching while set: what a stopped (SIGSTOP) follower looks
        # like to its leaders, without stopping the rest of the broker.
        self.fetching_paused = False
        self.outage = view.outage or OutageLog(log, f"broker {view.node_id}")

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._saved_hws = load_hws(self.fs, self.settings.hw_checkpoint)
        self._running = True
        self.view.add_listener(self.on_partition)
        self.resync()
        self._task = asyncio.create_task(self._isr_loop(), name="replica-isr")

    async def stop(self) -> None:
        self._running = False
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._save_hws()
        for tp in list(self.leading):
            self._stop_leading(tp)
        for fetcher in list(self.fetchers.values()):
            await fetcher.close()
        self.fetchers.clear()
        self.following.clear()

    def resync(self) -> None:
        """Apply every partition's state (at start, and for logs created after their state arrived)."""
        for st in self.view.partitions():
            tp = (st.topic, st.partition)
            if tp not in self.leading and tp not in self.following:
                self.on_partition(st)

    # -- roles -----------------------------------------------------------------------------
    def on_partition(self, st: PartitionState) -> None:
        """ClusterView listener: become leader, follower or neither of one partition."""
        if not self._running:
            return
        tp = (st.topic, st.partition)
        if st.version < self._versions.get(tp, -1):
            return     # an older state arriving late (our own alter_isr result raced the watch)
        if self.offline.holds(tp):
            return     # its disk failed here: no role until it works again (_check_disks)
        plog = self.logs.get(*tp)
        if plog is not None:
            # A fetched write still in a worker thread lands before any role change:
            # becoming leader records the new epoch at the log end, which must count it.
            plog.settle()
        if plog is None or self.node_id not in st.replicas:
            self._stop_leading(tp)
            self._stop_following(tp)
            if plog is not None:
                plog.set_follower(True)    # not a replica (any more): nothing may write here
            return
        self._versions[tp] = st.version
        if tp not in self._seen:
            # At start, what the last saved checkpoint vouches for (never past the log
            # end recovery kept); a leader alone moves it to its log end below.
            self._seen.add(tp)
            saved = self._saved_hws.get(tp, plog.log_start_offset)
            plog.set_high_watermark(max(plog.log_start_offset, min(saved, plog.log_end_offset)))
        if st.leader == self.node_id:
            self._stop_following(tp)
            plog.set_follower(False)
            self._lead(tp, st, plog)
        else:
            self._stop_leading(tp)
            plog.set_leader_epoch(None)
            plog.set_follower(True)
            if st.has_leader:
                self._follow(tp, st)
            else:
                self._stop_following(tp)

    def forget(self, topic: str, partition: int) -> None:
        """The partition's topic was deleted (its logs go next): no role, no fetcher, no
        saved high watermark, so a topic created again under the name starts afresh."""
        tp = (topic, partition)
        self._stop_leading(tp)
        self._stop_following(tp)
        self._versions.pop(tp, None)
        self._seen.discard(tp)
        self._saved_hws.pop(tp, None)

    def _lead(self, tp: TopicPartition, st: PartitionState, plog: Any) -> None:
        ls = self.leading.get(tp)
        if ls is None or ls.state.leader_epoch != st.leader_epoch:
            self._stop_leading(tp)
            try:
                plog.epochs.assign(st.leader_epoch, plog.log_end_offset)
            except OSError as exc:   # appends will try again (PartitionLog.write_batches)
                log.error("%s-%d: cannot record leader epoch %d: %s", *tp, st.leader_epoch, exc)
            plog.set_leader_epoch(st.leader_epoch)
            now = self._now_ms()
            ls = LeaderState(st, plog, plog.log_end_offset,
                             {r: FollowerProgress(last_caught_up_ms=now) for r in st.replicas if r != self.node_id})
            self.leading[tp] = ls
            log.info("%s-%d: leader at epoch %d (log end %d, isr %s)", *tp, st.leader_epoch,
                     plog.log_end_offset, list(st.isr))
        else:
            now = self._now_ms()
            for r in set(ls.state.isr) - set(st.isr):
                if r in ls.progress:
                    ls.progress[r].left_isr_ms = now
            # A reassignment changes the replicas within an epoch: track those it adds
            # (not caught up until they fetch), forget those it removed.
            for r in st.replicas:
                if r != self.node_id and r not in ls.progress:
                    ls.progress[r] = FollowerProgress()
            for r in [r for r in ls.progress if r not in st.replicas]:
                del ls.progress[r]
        ls.state = st
        self._advance_hw(tp, ls)

    def _stop_leading(self, tp: TopicPartition) -> None:
        ls = self.leading.pop(tp, None)
        if ls is None:
            return
        ls.plog.set_high_watermark(ls.plog.high_watermark)   # a follower's is a number, not the log end
        ls.plog.set_leader_epoch(None)
        for _, _, fut in ls.waiters:
            if not fut.done():
                fut.set_result(KafkaError.NOT_LEADER_OR_FOLLOWER)

    def _follow(self, tp: TopicPartition, st: PartitionState) -> None:
        if self.following.get(tp) == (st.leader, st.leader_epoch):
            return
        self._stop_following(tp)
        self.following[tp] = (st.leader, st.leader_epoch)
        fetcher = self.fetchers.get(st.leader)
        if fetcher is None:
            fetcher = self.fetchers[st.leader] = LeaderFetcher(
                st.leader, self.view, self.logs, self.dialer, self.settings.fetch, lambda: self.fetching_paused,
                durable=self.durable)
        fetcher.add(tp, st.leader_epoch)

    def _stop_following(self, tp: TopicPartition) -> None:
        was = self.following.pop(tp, None)
        if was is not None and was[0] in self.fetchers:
            self.fetchers[was[0]].remove(tp)

    # -- leader: followers' fetches, high watermark, ISR -----------------------------------
    def leader_error(self, topic: str, partition: int, current_leader_epoch: int = -1) -> KafkaError:
        """A client's request (produce, fetch, list offsets, markers): NONE when the
        cluster view names this broker the partition's leader at the asker's epoch
        (replica_rules.check_leader)."""
        return check_leader(self.view, topic, partition, current_leader_epoch)

    def leading_error(self, topic: str, partition: int, current_leader_epoch: int) -> KafkaError:
        """NONE when this broker acts as the partition's leader at the asker's epoch (-1:
        any). An older epoch is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH (KIP-320)."""
        ls = self.leading.get((topic, partition))
        st = self.view.partition(topic, partition)
        known = max(st.leader_epoch if st is not None else UNDEFINED, ls.state.leader_epoch if ls else UNDEFINED)
        err = leader_epoch_error(current_leader_epoch, known)
        if err:
            return err
        return KafkaError.NONE if ls is not None else KafkaError.NOT_LEADER_OR_FOLLOWER

    def replica_fetch(self, topic: str, partition: int, replica_id: int, fetch_offset: int,
                      current_leader_epoch: int, last_fetched_epoch: int = UNDEFINED
                      ) -> KafkaError | tuple[int, int]:
        """A follower's Fetch for one partition: fence it, tell it where its log diverged
        ((epoch, end offset), see `diverging_epoch`), or record its log end."""
        tp = (topic, partition)
        err = self.leading_error(topic, partition, current_leader_epoch)
        if err:
            return err
        ls = self.leading[tp]
        progress = ls.progress.get(replica_id)
        if progress is None:
            return KafkaError.NOT_LEADER_OR_FOLLOWER     # not a replica of this partition
        plog = ls.plog
        diverged = diverging_epoch(plog.epochs, plog.log_start_offset, plog.log_end_offset, fetch_offset,
                                   last_fetched_epoch)
        if diverged is not None:
            return diverged      # its log end is not a position in our log: not progress
        progress.on_fetch(fetch_offset, ls.plog.log_end_offset, self._now_ms())
        self._advance_hw(tp, ls)
        if replica_id not in ls.state.isr and progress.leo >= ls.plog.high_watermark:
            self._schedule_isr_check(tp)
        return KafkaError.NONE

    def throttle_allowance(self, topic: str, partition: int, replica_id: int) -> int:
        """Bytes a follower's fetch may read from this partition now: -1 unlimited; for a
        replica a reassignment is adding, what the cluster's throttle
        (leader.replication.throttled.rate, bytes/s over all of them) has left."""
        ls = self.leading.get((topic, partition))
        if ls is None or replica_id not in ls.state.adding:
            return -1
        try:
            self.throttle.set_rate(int(self.view.config(THROTTLE_RATE) or 0))
        except ValueError:
            self.throttle.set_rate(0)
        return self.throttle.allow()

    def spend(self, size: int) -> None:
        """A throttled follower's fetch read `size` bytes."""
        self.throttle.spend(size)

    def epoch_end(self, topic: str, partition: int, current_leader_epoch: int,
                  leader_epoch: int) -> tuple[KafkaError, int, int]:
        """OffsetForLeaderEpoch: only the leader answers, at the asker's epoch (KIP-320
        fencing); the end of the requested epoch is the start of the next larger one, or
        the log end for the latest."""
        err = self.leading_error(topic, partition, current_leader_epoch)
        if err:
            return err, UNDEFINED, UNDEFINED
        plog = self.leading[(topic, partition)].plog
        epoch, end = plog.epochs.end_offset_for(leader_epoch, plog.log_end_offset)
        return KafkaError.NONE, epoch, end

    def led(self) -> list[PartitionState]:
        """The partitions led here, as their leader knows them (metrics)."""
        return [ls.state for ls in list(self.leading.values())]

    def _advance_hw(self, tp: TopicPartition, ls: LeaderState) -> None:
        plog = ls.plog
        old = plog.high_watermark
        if ls.hw_isr() == (self.node_id,):
            # Alone in the ISR: every append is committed as it lands, as on a single node
            # (no follower fetch would come to move a number). This is the only path for it:
            # with no number set, PartitionLog.high_watermark is the log end, so produce,
            # markers and coordinator appends need no call after each write.
            plog.set_high_watermark(None)
        else:
            if plog.replicated_hw is None:
                plog.set_high_watermark(old)       # what the leader alone had committed: its log end now
            plog.set_high_watermark(high_watermark(old, self.node_id, self._leader_position(plog), ls.hw_isr(),
                                                   ls.progress))
        if plog.high_watermark > old:
            self.notify(*tp)    # read_committed/uncommitted readers wait on it
        self._settle_waiters(ls)

    def _leader_position(self, plog: Any) -> int:
        """The leader's own log end as the high watermark counts it (the same rule as
        alone in the ISR, PartitionLog.durable_end): under the durable policy only what it
        has fsynced, as for its followers, so no reader is ever shown a record a power cut
        of the whole ISR could take (the leader may be the one elected again, and its
        followers would truncate to it)."""
        return int(plog.durable_end)

    def flushed(self, topic: str, partition: int) -> None:
        """The leader's fsync of the partition completed: the high watermark may move."""
        ls = self.leading.get((topic, partition))
        if ls is not None:
            self._advance_hw((topic, partition), ls)

    def _settle_waiters(self, ls: LeaderState) -> None:
        hw, isr = ls.plog.high_watermark, len(ls.state.isr)
        keep = []
        for w in ls.waiters:
            upto, min_isr, fut = w
            if fut.done():
                continue
            if hw >= upto:
                fut.set_result(KafkaError.NONE if isr >= min_isr else KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND)
            else:
                keep.append(w)
        ls.waiters = keep

    def min_insync(self, topic: str) -> int:
        info = self.logs.topic(topic)
        return min_insync_of(info.config if info is not None else None, self.settings.min_insync_replicas)

    def before_append(self, topic: str, partition: int, acks: int) -> KafkaError:
        """Produce, before anything is written: this broker must lead the partition, and
        acks=all needs at least min.insync.replicas in the ISR."""
        ls = self.leading.get((topic, partition))
        if ls is None:
            return KafkaError.NOT_LEADER_OR_FOLLOWER
        return append_error(acks, len(ls.state.isr), self.min_insync(topic))

    def reached(self, topic: str, partition: int, upto: int) -> bool:
        """Would `wait_for_hw` answer NONE now: leading, the high watermark at `upto`,
        the ISR at least min.insync.replicas?"""
        ls = self.leading.get((topic, partition))
        return (ls is not None and ls.plog.high_watermark >= upto
                and len(ls.state.isr) >= self.min_insync(topic))

    async def wait_for_hw(self, topic: str, partition: int, upto: int, timeout_s: float) -> KafkaError:
        """acks=all: NONE once the high watermark reaches `upto` (one past the batch)."""
        ls = self.leading.get((topic, partition))
        if ls is None:
            return KafkaError.NOT_LEADER_OR_FOLLOWER
        fut = asyncio.get_running_loop().create_future()
        ls.waiters.append([upto, self.min_insync(topic), fut])
        self._advance_hw((topic, partition), ls)    # its own fsync, done by now, may move it
        if not fut.done():
            # Wake the followers' long-polling fetches (Kafka completes delayed fetches on
            # every leader append). Produce notifies on its own; a coordinator's record is
            # appended without a request, and its wait lasted until each follower's fetch
            # ran out its max wait (500 ms per transaction step or offset commit).
            self.notify(topic, partition)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            return KafkaError.REQUEST_TIMED_OUT

    def _schedule_isr_check(self, tp: TopicPartition) -> None:
        ls = self.leading.get(tp)
        if ls is not None and not ls.isr_busy:
            ls.isr_busy = True
            asyncio.get_running_loop().create_task(self._update_isr_logged(tp, ls))

    async def _update_isr_logged(self, tp: TopicPartition, ls: LeaderState) -> None:
        """The task `_schedule_isr_check` starts: nothing may escape it unhandled (the ISR
        loop schedules the check again within lag_time_max_ms / 4)."""
        try:
            await self._update_isr(tp, ls)
        except EtcdError as exc:
            self.outage.failed(f"ISR change of {tp[0]}-{tp[1]}", exc)
        except Exception:
            log.exception("%s-%d: ISR change failed", *tp)

    async def _update_isr(self, tp: TopicPartition, ls: LeaderState) -> None:
        try:
            for _ in range(5):   # each lost CAS: re-read, decide again
                st = self.view.partition(*tp)
                if (st is None or self.leading.get(tp) is not ls or st.leader != self.node_id
                        or st.leader_epoch != ls.state.leader_epoch):
                    return
                plog = ls.plog
                new = isr_change(st, plog.log_end_offset, plog.high_watermark, ls.progress, self._now_ms(),
                                 self.settings.lag_time_max_ms, ls.epoch_start, alive=self.view.brokers())
                if new is None:
                    return
                wait_ms = self._hand_over_after_ms()
                handed = (hand_over(st, new, self.min_insync(tp[0]), self.view.brokers())
                          if wait_ms is not None else None)
                if handed is not None and wait_ms is not None:
                    if self._quiet_ms(ls, handed.isr) >= wait_ms:
                        await self._hand_over(tp, st, handed)
                    return    # neither shrink nor hand over yet: a dead follower may still look registered
                ls.pending_isr = new
                self._advance_hw(tp, ls)      # a joining replica fixes the high watermark from now on
                try:
                    done = await self.view.alter_isr(st, new)
                finally:
                    ls.pending_isr = ()
                    if self.leading.get(tp) is ls:
                        self._advance_hw(tp, ls)     # a lost CAS may leave the leader alone again
                self.outage.ok()
                if done is not None:
                    log.info("%s-%d: isr %s -> %s", *tp, list(st.isr), list(done.isr))
                    self.on_partition(done)
                    return
        finally:
            ls.isr_busy = False

    def _hand_over_after_ms(self) -> float | None:
        """How long the in-sync followers must have been silent before leadership goes to
        them: past the lag limit, and long enough that one that died has lost its
        registration (a lease, and half of one for etcd's expiry check and the watch).
        None where registrations are not sessions (an in-memory view: every broker always
        looks registered, so "registered" says nothing about a follower): never then."""
        lease_s = self.view.lease_ttl_s
        if not lease_s:
            return None
        return max(float(self.settings.lag_time_max_ms), 1500.0 * float(lease_s))

    def _quiet_ms(self, ls: LeaderState, followers: Iterable[int]) -> float:
        last = max((ls.progress[r].last_caught_up_ms for r in followers if r in ls.progress), default=0.0)
        return self._now_ms() - last

    async def _hand_over(self, tp: TopicPartition, st: PartitionState, handed: PartitionState) -> None:
        done = await self.view.write_partition(st, handed)
        self.outage.ok()
        if done is None:
            return       # the state moved on: the next check decides from it
        log.warning("%s-%d: no follower reaches this leader (isr %s would fall below min.insync.replicas); "
                    "leadership handed to %d at epoch %d, isr %s", *tp, list(st.isr), done.leader,
                    done.leader_epoch, list(done.isr))
        self.on_partition(done)

    async def _isr_loop(self) -> None:
        interval = max(self.settings.lag_time_max_ms / 4, 20) / 1000
        while self._running:
            await asyncio.sleep(interval)
            try:
                await self._check_disks()
                self.resync()
                for tp in list(self.leading):
                    self._schedule_isr_check(tp)
                if time.monotonic() - self._last_hw_save >= HW_SAVE_INTERVAL_S:
                    self._save_hws()
            except Exception:   # never let the loop die: ISR upkeep is what keeps acks=all going
                log.exception("ISR upkeep failed")

    async def _check_disks(self) -> None:
        """Take out of service every partition whose log's disk failed since the last
        round (semel.cluster.offline), and back those whose disk works again."""
        for tp in list(self.leading) + list(self.following):
            reason = self.offline.newly_failed(tp)
            if reason is not None:
                self._stop_leading(tp)
                self._stop_following(tp)
                self.offline.take(tp, reason)
        if self.offline.offline:
            await self.offline.leave_isrs()
            for tp in self.offline.retry_due():
                self._seen.discard(tp)        # a reopened log: its high watermark starts from the saved one
                st = self.view.partition(*tp)
                if st is not None:
                    self.on_partition(st)

    def _save_hws(self) -> None:
        """Atomically (temp file, fsync, rename); a failure only costs restart time."""
        self._last_hw_save = time.monotonic()
        hws = dict(self._saved_hws)
        for tp in list(self.leading) + list(self.following):
            plog = self.logs.get(*tp)
            if plog is not None and not plog.closed:
                hws[tp] = plog.high_watermark
        try:
            save_hws(self.fs, self.settings.hw_checkpoint, hws)
            self._saved_hws = hws
        except OSError as exc:
            log.warning("cannot save high watermarks: %s", exc)

    @staticmethod
    def _now_ms() -> float:
        return time.monotonic() * 1000

