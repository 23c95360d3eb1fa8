"""Replication data plane (issue 13): followers fetch from leaders, leaders keep the
ISR and the high watermark, acks=all waits for the high watermark.

Roles follow the ClusterView: a listener call per partition change makes this broker
the partition's leader (stamp the leader epoch on appends, track every follower's
log end) or a follower (truncate by leader epoch, then fetch). Kafka's rules:

- Follower: fetch from the log end (Fetch v12, replica_id = own node id, current
  leader epoch, last fetched epoch) and append what comes back as given
  (PartitionLog.append_replicated). The leader checks the last fetched epoch against
  its own history and, where the logs diverged (a leader change), answers a
  diverging epoch instead of records (KIP-320/KIP-595); the follower truncates by it
  (`truncation_point`) and fetches again, so no OffsetForLeaderEpoch round trip.
  A log with records but no epochs asks OffsetForLeaderEpoch first (KIP-101/KIP-279).
  One fetcher, so one connection, per leader broker, batching every partition there.
  Follower high watermark = min(leader's high watermark, own log end).
- Leader: a follower's fetch offset is its log end; the high watermark is the
  smallest log end over the ISR and only grows. A follower that has not caught up
  for replica_lag_time_max_ms leaves the ISR; one that reaches the high watermark
  joins again; both by compare-and-set (ClusterView.alter_isr), decided by the pure
  `isr_change`, re-read and decided again when the CAS loses.
- acks=all completes when the high watermark passes the batch (`wait_for_hw`);
  NOT_ENOUGH_REPLICAS before the append when the ISR is below min.insync.replicas,
  NOT_ENOUGH_REPLICAS_AFTER_APPEND when it fell below while waiting.

Followers do not fsync each fetch (Kafka's default): an acknowledged record is on
every ISR member, and the leader's own flush policy still applies to it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from ..storage import checked_file
from ..storage.errors import AppendError, StorageError
from .peer import PeerAuthError, PeerConnection, PeerDialer, PeerError
from .reassignment import THROTTLE_RATE, Throttle
from .state import ClusterView, PartitionState

log = logging.getLogger("semel.cluster.replica")

FETCH_VERSION = 12            # replica_id and current_leader_epoch, topic names
EPOCH_VERSION = 4             # OffsetForLeaderEpoch with replica_id
UNDEFINED = -1
_FENCING = (KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.NOT_LEADER_OR_FOLLOWER,
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION)

TopicPartition = tuple[str, int]

# Every partition's high watermark, saved now and then in the data directory (Kafka's
# replication-offset-checkpoint), so a restarted broker does not start from zero.
HW_FILE = "replication-offset.checkpoint"
_HW_HEADER = "semel-hw 1 "
HW_SAVE_INTERVAL_S = 5.0


def encode_hws(hws: dict[TopicPartition, int]) -> bytes:
    return checked_file.encode(_HW_HEADER, "".join(f"{t} {p} {hw}\n" for (t, p), hw in sorted(hws.items())).encode())


def decode_hws(data: bytes) -> dict[TopicPartition, int]:
    """The saved high watermarks; {} when the file is damaged (they are only a head start)."""
    body = checked_file.decode(_HW_HEADER, data)
    out: dict[TopicPartition, int] = {}
    try:
        for line in (body or b"").decode("ascii").splitlines():
            t, p, hw = line.split()
            out[(t, int(p))] = int(hw)
    except ValueError:
        return {}
    return out


# ================================================================ pure decisions
@dataclass
class FollowerProgress:
    """What a leader knows of one follower: its log end and when it was last caught up."""
    leo: int = UNDEFINED
    last_caught_up_ms: float = 0.0
    last_fetch_ms: float = 0.0
    last_fetch_leader_leo: int = UNDEFINED
    # When it last left the ISR: it may join again only on a fetch made after that, as
    # in Kafka, where expansion is decided on a fetch. Without it a follower SIGKILLed on
    # an idle partition still looked caught up (its last fetch reached the log end) and
    # the leader put it back every ISR check until replica_lag_time_max_ms ran out,
    # holding the high watermark each time.
    left_isr_ms: float = 0.0

    def on_fetch(self, fetch_offset: int, leader_leo: int, now_ms: float) -> None:
        """Kafka's rule: caught up now if the fetch reaches the leader's log end; caught up
        at the previous fetch if it reaches what the log end was then (a follower chasing
        a busy leader is never exactly at the end, yet keeps up)."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_ms = now_ms
        elif fetch_offset >= self.last_fetch_leader_leo >= 0:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.leo = fetch_offset
        self.last_fetch_ms, self.last_fetch_leader_leo = now_ms, leader_leo


def high_watermark(current_hw: int, leader: int, leader_leo: int, isr: tuple[int, ...],
                   progress: dict[int, FollowerProgress]) -> int:
    """Smallest log end over the ISR; never below the current high watermark."""
    leos = [leader_leo if r == leader else progress[r].leo if r in progress else UNDEFINED for r in isr]
    return max(current_hw, min(leos, default=leader_leo))


def isr_change(state: PartitionState, leader_leo: int, hw: int, progress: dict[int, FollowerProgress],
               now_ms: float, lag_max_ms: int, epoch_start: int, alive=None) -> tuple[int, ...] | None:
    """The ISR the leader should ask for, or None when it should stay as it is.

    Out: members other than the leader not caught up within lag_max_ms. In: replicas
    whose log end reached the high watermark and the start of the leader's epoch
    (Kafka's conditions), caught up within lag_max_ms, and registered as alive when
    `alive` (broker ids) is given: a broker whose session ended may still fetch for a
    moment while it shuts down, and taking it back in would hold the high watermark
    (and every acks=all answer) until lag_max_ms dropped it again (KIP-841: no ISR
    expansion to a fenced broker). The leader always stays, so the ISR is never
    empty. Order follows the replica list."""
    def fresh(r: int) -> bool:
        p = progress.get(r)
        return p is not None and now_ms - p.last_caught_up_ms <= lag_max_ms

    def joins(r: int) -> bool:
        p = progress.get(r)
        return (p is not None and p.leo >= max(hw, epoch_start) and fresh(r)
                and p.last_fetch_ms >= p.left_isr_ms and (alive is None or r in alive))

    keep = {r for r in state.isr if r == state.leader or fresh(r)}
    add = {r for r in state.replicas if r not in state.isr and joins(r)}
    new = tuple(r for r in state.replicas if r in keep | add | {state.leader})
    return None if set(new) == set(state.isr) else new


def truncation_point(epochs, log_end: int, hw: int, leader_epoch: int, end_offset: int) -> tuple[int, bool]:
    """Where a follower cuts its log, given the leader's answer (leader_epoch, end_offset)
    to "where does my latest epoch end?", and whether it is done (KIP-279).

    The answer names the largest epoch the leader has at or below the one asked; the
    follower keeps what both agree on: up to the smaller of the two ends of that epoch.
    When the follower lacks that epoch itself, it cuts to where its own history above
    it begins and asks again with its then latest epoch. No common epoch at all (an
    undefined answer): keep what is committed, the high watermark (Kafka's fallback)."""
    if leader_epoch == UNDEFINED or end_offset == UNDEFINED:
        return min(hw, log_end), True
    mine, my_end = epochs.end_offset_for(leader_epoch, log_end)
    if mine == UNDEFINED:
        return min(end_offset, log_end), True
    return min(end_offset, my_end), mine == leader_epoch


def diverging_epoch(epochs, log_start: int, log_end: int, fetch_offset: int,
                    last_fetched_epoch: int) -> tuple[int, int] | KafkaError | None:
    """The leader's check of a follower's fetch (KIP-320/KIP-595): None when the follower's
    log up to fetch_offset can continue the leader's; else (epoch, end offset), the
    largest epoch the leader has at or below the follower's last one and where it ends
    here, for the follower to truncate by; OFFSET_OUT_OF_RANGE when the leader knows no
    such epoch. No epoch given (an empty log) or an offset below the log start: the
    read decides, as before."""
    if last_fetched_epoch < 0 or fetch_offset < log_start:
        return None
    epoch, end = epochs.end_offset_for(last_fetched_epoch, log_end)
    if epoch == UNDEFINED or end == UNDEFINED:
        return KafkaError.OFFSET_OUT_OF_RANGE
    if epoch < last_fetched_epoch or end < fetch_offset:
        return epoch, end
    return None


# ================================================================ leader side
@dataclass
class LeaderState:
    state: PartitionState
    plog: object                       # PartitionLog
    epoch_start: int
    progress: dict[int, FollowerProgress]
    waiters: list = field(default_factory=list)    # [upto, min_isr, future]
    isr_busy: bool = False
    # While an ISR change is in flight the high watermark counts the members of both
    # the old and the asked-for ISR (Kafka's "maximal ISR"): a replica about to join
    # must not find the high watermark already past its log end.
    pending_isr: tuple[int, ...] = ()

    def hw_isr(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(self.state.isr + self.pending_isr))


class ReplicaManager:
    """One per broker in a cluster (broker.replicas); see the module docstring."""

    def __init__(self, broker, view: ClusterView, *, lag_time_max_ms: int | None = None,
                 fetch_wait_ms: int | None = None, fetch_max_bytes: int | None = None,
                 dialer: PeerDialer | None = None):
        cfg = broker.config
        self.broker = broker
        self.view = view
        self.node_id = view.node_id
        self.lag_time_max_ms = lag_time_max_ms or cfg.replica_lag_time_max_ms
        self.fetch_wait_ms = fetch_wait_ms or cfg.replica_fetch_wait_max_ms
        self.fetch_max_bytes = fetch_max_bytes or cfg.replica_fetch_max_bytes
        self.write_thread_bytes = cfg.replica_write_thread_bytes
        self.request_timeout_s = cfg.request_timeout_ms / 1000
        self.dialer = dialer or PeerDialer()   # the inter-broker listener and login
        self.leading: dict[TopicPartition, LeaderState] = {}
        self.following: dict[TopicPartition, tuple[int, int]] = {}   # -> (leader, leader epoch)
        self.fetchers: dict[int, LeaderFetcher] = {}
        self._versions: dict[TopicPartition, int] = {}
        self._seen: set[TopicPartition] = set()
        self._saved_hws: dict[TopicPartition, int] = {}
        self._last_hw_save = 0.0
        self._task: asyncio.Task | None = None
        self._running = False
        self.throttle = Throttle()
        # Followers here stop fetching while set: what a stopped (SIGSTOP) follower looks
        # like to its leaders, without stopping the rest of the broker.
        self.fetching_paused = False

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self._saved_hws = self._load_hws()
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
        plog = self.broker.logs.get(*tp) if self.broker.logs is not None else None
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

    def _lead(self, tp: TopicPartition, st: PartitionState, plog) -> None:
        ls = self.leading.get(tp)
        if ls is None or ls.state.leader_epoch != st.leader_epoch:
            self._stop_leading(tp)
            try:
                plog.epochs.assign(st.leader_epoch, plog.log_end_offset)
            except OSError as exc:   # appends will try again (PartitionLog._write)
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
            fetcher = self.fetchers[st.leader] = LeaderFetcher(self, st.leader)
        fetcher.add(tp, st.leader_epoch)

    def _stop_following(self, tp: TopicPartition) -> None:
        was = self.following.pop(tp, None)
        if was is not None and was[0] in self.fetchers:
            self.fetchers[was[0]].remove(tp)

    # -- leader: followers' fetches, high watermark, ISR -----------------------------------
    def leader_error(self, topic: str, partition: int, current_leader_epoch: int) -> KafkaError:
        """NONE when this broker leads the partition at the asker's epoch (-1: any).
        An older epoch is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH (KIP-320)."""
        ls = self.leading.get((topic, partition))
        st = self.view.partition(topic, partition)
        known = max(st.leader_epoch if st is not None else UNDEFINED, ls.state.leader_epoch if ls else UNDEFINED)
        if 0 <= current_leader_epoch < known:
            return KafkaError.FENCED_LEADER_EPOCH
        if current_leader_epoch > known:
            return KafkaError.UNKNOWN_LEADER_EPOCH
        return KafkaError.NONE if ls is not None else KafkaError.NOT_LEADER_OR_FOLLOWER

    def replica_fetch(self, topic: str, partition: int, replica_id: int, fetch_offset: int,
                      current_leader_epoch: int, last_fetched_epoch: int = UNDEFINED
                      ) -> KafkaError | tuple[int, int]:
        """A follower's Fetch for one partition: fence it, tell it where its log diverged
        ((epoch, end offset), see `diverging_epoch`), or record its log end."""
        tp = (topic, partition)
        err = self.leader_error(topic, partition, current_leader_epoch)
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
        config = getattr(self.view, "config", None)
        try:
            self.throttle.set_rate(int(config(THROTTLE_RATE) or 0) if config is not None else 0)
        except ValueError:
            self.throttle.set_rate(0)
        return self.throttle.allow()

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
            plog.set_high_watermark(high_watermark(old, self.node_id, plog.log_end_offset, ls.hw_isr(), ls.progress))
        if plog.high_watermark > old:
            self.broker.notifier.notify(*tp)    # read_committed/uncommitted readers wait on it
        self._settle_waiters(ls)

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
        info = self.broker.logs.topics().get(topic) if self.broker.logs is not None else None
        value = info.config.get("min.insync.replicas") if info is not None else None
        return int(value) if value is not None else self.broker.config.min_insync_replicas

    def before_append(self, topic: str, partition: int, acks: int) -> KafkaError:
        """Produce, before anything is written: this broker must lead the partition, and
        acks=all needs at least min.insync.replicas in the ISR."""
        ls = self.leading.get((topic, partition))
        if ls is None:
            return KafkaError.NOT_LEADER_OR_FOLLOWER
        if acks == -1 and len(ls.state.isr) < self.min_insync(topic):
            return KafkaError.NOT_ENOUGH_REPLICAS
        return KafkaError.NONE

    async def wait_for_hw(self, topic: str, partition: int, upto: int, timeout_s: float) -> KafkaError:
        """acks=all: NONE once the high watermark reaches `upto` (one past the batch)."""
        ls = self.leading.get((topic, partition))
        if ls is None:
            return KafkaError.NOT_LEADER_OR_FOLLOWER
        fut = asyncio.get_running_loop().create_future()
        ls.waiters.append([upto, self.min_insync(topic), fut])
        self._settle_waiters(ls)
        if not fut.done():
            # Wake the followers' long-polling fetches (Kafka completes delayed fetches on
            # every leader append). Produce notifies on its own; a coordinator's record is
            # appended without a request, and its wait lasted until each follower's fetch
            # ran out its max wait (500 ms per transaction step or offset commit).
            self.broker.notifier.notify(topic, partition)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            return KafkaError.REQUEST_TIMED_OUT

    def _schedule_isr_check(self, tp: TopicPartition) -> None:
        ls = self.leading.get(tp)
        if ls is not None and not ls.isr_busy:
            ls.isr_busy = True
            asyncio.get_running_loop().create_task(self._update_isr(tp, ls))

    async def _update_isr(self, tp: TopicPartition, ls: LeaderState) -> None:
        try:
            for _ in range(5):   # each lost CAS: re-read, decide again
                st = self.view.partition(*tp)
                if (st is None or self.leading.get(tp) is not ls or st.leader != self.node_id
                        or st.leader_epoch != ls.state.leader_epoch):
                    return
                plog = ls.plog
                new = isr_change(st, plog.log_end_offset, plog.high_watermark, ls.progress, self._now_ms(),
                                 self.lag_time_max_ms, ls.epoch_start, alive=self.view.brokers())
                if new is None:
                    return
                ls.pending_isr = new
                self._advance_hw(tp, ls)      # a joining replica fixes the high watermark from now on
                try:
                    done = await self.view.alter_isr(st, new)
                finally:
                    ls.pending_isr = ()
                    if self.leading.get(tp) is ls:
                        self._advance_hw(tp, ls)     # a lost CAS may leave the leader alone again
                if done is not None:
                    log.info("%s-%d: isr %s -> %s", *tp, list(st.isr), list(done.isr))
                    self.on_partition(done)
                    return
        finally:
            ls.isr_busy = False

    async def _isr_loop(self) -> None:
        interval = max(self.lag_time_max_ms / 4, 20) / 1000
        while self._running:
            await asyncio.sleep(interval)
            try:
                self.resync()
                for tp in list(self.leading):
                    self._schedule_isr_check(tp)
                if time.monotonic() - self._last_hw_save >= HW_SAVE_INTERVAL_S:
                    self._save_hws()
            except Exception:   # never let the loop die: ISR upkeep is what keeps acks=all going
                log.exception("ISR upkeep failed")

    def _hw_path(self):
        return self.broker.config.data_dir / HW_FILE

    def _load_hws(self) -> dict[TopicPartition, int]:
        try:
            return decode_hws(self.broker.fs.read_file(self._hw_path()))
        except FileNotFoundError:
            return {}

    def _save_hws(self) -> None:
        """Atomically (temp file, fsync, rename); a failure only costs restart time."""
        self._last_hw_save = time.monotonic()
        hws = dict(self._saved_hws)
        for tp in list(self.leading) + list(self.following):
            plog = self.broker.logs.get(*tp)
            if plog is not None and not plog.closed:
                hws[tp] = plog.high_watermark
        try:
            self.broker.fs.write_atomic(self._hw_path(), encode_hws(hws), sync_dir=True)
            self._saved_hws = hws
        except OSError as exc:
            log.warning("cannot save high watermarks: %s", exc)

    @staticmethod
    def _now_ms() -> float:
        return time.monotonic() * 1000


# ================================================================ follower side
@dataclass
class _Followed:
    epoch: int
    truncate: bool = True


class LeaderFetcher:
    """Fetches every partition this broker follows on one leader broker, over one connection."""

    def __init__(self, manager: ReplicaManager, leader_id: int):
        self.m = manager
        self.leader_id = leader_id
        self.parts: dict[TopicPartition, _Followed] = {}
        self._wake = asyncio.Event()
        self._conn: PeerConnection | None = None
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"replica-fetcher-{leader_id}")

    def add(self, tp: TopicPartition, epoch: int) -> None:
        """Follow tp at a new leader epoch. Fetches carry the last fetched epoch, so the
        leader tells where the logs diverged; only a log with records but no epochs
        (nothing to compare) asks OffsetForLeaderEpoch first."""
        plog = self._log(tp)
        blind = plog is not None and plog.epochs.latest_epoch == UNDEFINED and plog.log_end_offset > plog.log_start_offset
        self.parts[tp] = _Followed(epoch, truncate=blind)
        self._wake.set()

    def remove(self, tp: TopicPartition) -> None:
        self.parts.pop(tp, None)

    async def close(self) -> None:
        # The flag as well as the cancel: Python 3.11's wait_for can swallow a cancel
        # that lands just as its inner call completes, and the loop would go on.
        self._closing = True
        self.parts.clear()
        self._wake.set()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._conn is not None:
            self._conn.close()

    async def _run(self) -> None:
        while not self._closing:
            if not self.parts:
                self._wake.clear()
                await self._wake.wait()
                continue
            info = self.m.view.brokers().get(self.leader_id)
            if info is None:
                await asyncio.sleep(0.1)
                continue
            try:
                self._conn = await self.m.dialer.connect(info, f"semel-replica-{self.m.node_id}")
                while self.parts:
                    await self._round()
            except PeerAuthError:     # logged by the dialer; a login refused now is refused in a second
                await asyncio.sleep(1)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, PeerError) as exc:
                log.info("fetcher %d -> %d: %s; reconnecting", self.m.node_id, self.leader_id, exc or type(exc).__name__)
                await asyncio.sleep(0.1)
            except Exception:     # a disk failure, a bug: keep the fetcher alive, retry slowly
                log.exception("fetcher %d -> %d failed; retrying", self.m.node_id, self.leader_id)
                await asyncio.sleep(1)
            finally:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

    async def _round(self) -> None:
        if self.m.fetching_paused:
            await asyncio.sleep(0.05)
            return
        pending = {tp: f for tp, f in self.parts.items() if f.truncate}
        if pending:
            if not await self._truncate(pending):
                await asyncio.sleep(0.05)     # the leader has not taken over yet
            return
        if not await self._fetch():
            await asyncio.sleep(0.05)

    def _log(self, tp: TopicPartition):
        return self.m.broker.logs.get(*tp)

    async def _truncate(self, pending: dict[TopicPartition, _Followed]) -> bool:
        """One OffsetForLeaderEpoch round for the partitions that must truncate; True on progress."""
        cls = request_class(23)
        T = cls.OffsetForLeaderTopic
        by_topic: dict[str, list] = {}
        for (topic, p), f in pending.items():
            plog = self._log((topic, p))
            if plog is None:
                continue
            by_topic.setdefault(topic, []).append(T.OffsetForLeaderPartition(
                partition=p, current_leader_epoch=f.epoch, leader_epoch=plog.epochs.latest_epoch))
        resp = await self._conn.call(23, EPOCH_VERSION, self.m.request_timeout_s, replica_id=self.m.node_id,
                                     topics=[T(topic=t, partitions=ps) for t, ps in by_topic.items()])
        progress = False
        for t in resp.topics:
            for r in t.partitions:
                tp = (t.topic, r.partition)
                f = self.parts.get(tp)
                if f is None or tp not in pending or f is not pending[tp] or r.error_code:
                    continue
                progress = True
                f.truncate = not self._truncate_one(tp, r.leader_epoch, r.end_offset)
        return progress

    def _truncate_one(self, tp: TopicPartition, leader_epoch: int, end_offset: int) -> bool:
        """Cut the local log where the leader's answer says it diverges; True when done."""
        plog = self._log(tp)
        if plog is None:
            return True
        target, done = truncation_point(plog.epochs, plog.log_end_offset, plog.high_watermark, leader_epoch,
                                        end_offset)
        before = plog.log_end_offset
        plog.truncate_to(target)             # also drops epochs beginning at the cut, records or not
        if plog.log_end_offset < before:
            log.info("%s-%d: truncated %d -> %d (leader %d epoch %d ends at %d)", *tp, before,
                     plog.log_end_offset, self.leader_id, leader_epoch, end_offset)
        return done

    async def _fetch(self) -> bool:
        """One Fetch for every followed partition; True when nothing went wrong."""
        cls = request_class(1)
        T = cls.FetchTopic
        sent: dict[TopicPartition, _Followed] = {}
        by_topic: dict[str, list] = {}
        for tp, f in self.parts.items():
            plog = self._log(tp)
            if plog is None:
                continue
            sent[tp] = f
            by_topic.setdefault(tp[0], []).append(T.FetchPartition(
                partition=tp[1], current_leader_epoch=f.epoch, fetch_offset=plog.log_end_offset,
                last_fetched_epoch=plog.epochs.latest_epoch, log_start_offset=plog.log_start_offset,
                partition_max_bytes=self.m.fetch_max_bytes))
        if not sent:
            return False
        resp = await self._conn.call(
            1, FETCH_VERSION, self.m.request_timeout_s + self.m.fetch_wait_ms / 1000,
            replica_id=self.m.node_id, max_wait_ms=self.m.fetch_wait_ms, min_bytes=1,
            max_bytes=self.m.fetch_max_bytes * 8, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[T(topic=t, partitions=ps) for t, ps in by_topic.items()], forgotten_topics_data=[],
            rack_id="")
        if resp.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            # Our login lacks ClusterAction there: say so once a minute, not per partition per round.
            raise self.m.dialer.refused(self.leader_id, "fetch denied: the inter-broker principal needs "
                                                        "ClusterAction on the cluster (a super user)")
        if self.m.fetching_paused:
            return True       # paused while the fetch was out: as if the answer never came
        ok = True
        writing = []
        for t in resp.responses:
            for r in t.partitions:
                tp = (t.topic, r.partition_index)
                f = self.parts.get(tp)
                if f is None or f is not sent.get(tp):
                    continue          # leadership moved while the fetch was out
                done = self._apply(tp, f, r)
                if isinstance(done, bool):
                    ok = done and ok
                else:
                    writing.append(done)
        # Every partition's write runs at once (one worker thread each); the next fetch,
        # whose offsets report these logs' ends, goes out only once all have landed.
        for done in await asyncio.gather(*writing) if writing else ():
            ok = done and ok
        return ok

    def _apply(self, tp: TopicPartition, f: _Followed, r):
        """Apply one partition's answer: True/False (went right or not), or, for records
        written in a worker thread, an awaitable of that. Runs without an await from the
        caller's role check to the write's start, so the write belongs to this role."""
        plog = self._log(tp)
        err = KafkaError(r.error_code)
        if err is KafkaError.OFFSET_OUT_OF_RANGE:
            if r.log_start_offset > plog.log_end_offset:
                # The leader no longer has what comes next here: start over at its log start.
                log.warning("%s-%d: log end %d is below leader %d's log start %d; starting over there",
                            *tp, plog.log_end_offset, self.leader_id, r.log_start_offset)
                plog.reset_to(r.log_start_offset)
            else:
                f.truncate = True
            return False
        if err is not KafkaError.NONE:
            if err not in _FENCING:
                log.warning("%s-%d: fetch from leader %d: %s", *tp, self.leader_id, err.name)
            return False
        div = r.diverging_epoch
        if div is not None and div.epoch >= 0:
            self._truncate_one(tp, div.epoch, div.end_offset)    # the next fetch checks again
            return True
        if r.records:
            in_thread = len(r.records) >= self.m.write_thread_bytes
            try:
                if in_thread:
                    return self._landed(tp, f, r, plog.append_replicated_begin(r.records))
                plog.append_replicated(r.records)
            except StorageError as exc:
                log.error("%s-%d: replicated append failed: %s", *tp, exc)
                return False
            except AppendError as exc:    # does not continue the local log: find out where we diverged
                log.warning("%s-%d: %s; truncating again", *tp, exc)
                f.truncate = True
                return False
        self._follower_hw(plog, r)
        return True

    async def _landed(self, tp: TopicPartition, f: _Followed, r, write) -> bool:
        """Wait for a write in a worker thread; then the follower's high watermark, unless
        the role changed meanwhile (that change settled the write and owns the log now)."""
        try:
            await write
        except StorageError as exc:
            log.error("%s-%d: replicated append failed: %s", *tp, exc)
            return False
        if self.parts.get(tp) is f and not self._closing:
            self._follower_hw(self._log(tp), r)
        return True

    @staticmethod
    def _follower_hw(plog, r) -> None:
        plog.set_high_watermark(max(plog.log_start_offset, min(r.high_watermark, plog.log_end_offset)))

