"""The follower side of replication: one fetcher, so one connection, per leader broker,
batching every partition this broker follows there.

Kafka's rules: fetch from the log end (Fetch v12, replica_id = own node id, current
leader epoch, last fetched epoch) and append what comes back as given
(PartitionLog.append_replicated). The leader checks the last fetched epoch against
its own history and, where the logs diverged (a leader change), answers a diverging
epoch instead of records (KIP-320/KIP-595); the follower truncates by it
(replica_rules.truncation_point) and fetches again, so no OffsetForLeaderEpoch round
trip. A log with records but no epochs asks OffsetForLeaderEpoch first
(KIP-101/KIP-279). Follower high watermark = min(leader's high watermark, own log end).

A follower's fetch offset is also its position for the leader's high watermark, so
under the durable flush policy (`--flush-mode always`, the default) a follower fsyncs
what it fetched before its next fetch reports it (`durable`, the broker's group-commit
flusher: one fsync round per log, the logs of one round in a few worker jobs). An
acks=all record is then on the disk of every ISR member before it is acknowledged, and
a power cut of the whole cluster loses none: whichever ISR member leads next has it.
Under the other policies a follower reports what it wrote (Kafka's default), which a
power cut can take.

A partition whose answers keep failing (a batch damaged on the leader's disk fails its
CRC here at every fetch) is refetched after a growing delay and warned about sparingly
(RefusedPartition); the other partitions on that leader are fetched as usual.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ..backoff import Backoff
from ..protocol.api_keys import ApiKey
from ..protocol.errors import KafkaError
from ..protocol.messages import request_class
from ..storage import LogManager, PartitionLog
from ..storage.types import AppendInfo
from ..storage.errors import AppendError, StorageError
from .peer import PeerAuthError, PeerConnection, PeerDialer, PeerError
from .replica_rules import UNDEFINED, TopicPartition, truncation_point
from .state import ClusterView

log = logging.getLogger("semel.cluster.replica_fetcher")

FETCH_VERSION = 12            # replica_id and current_leader_epoch, topic names
EPOCH_VERSION = 4             # OffsetForLeaderEpoch with replica_id
_FENCING = (KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.NOT_LEADER_OR_FOLLOWER,
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION)
REFETCH_FIRST_S = 0.05        # a failing partition's first refetch waits as long as a failed round does
REFETCH_MAX_S = 5.0           # ...and the delay doubles up to this; its warning repeats at most this often

# fsync these logs up to these offsets; the outcome per log (None or the StorageError).
# The broker's GroupCommitFlusher.sync_each.
Durable = Callable[[list[tuple[PartitionLog, int]]], Awaitable[list[StorageError | None]]]


def refetch_backoff() -> Backoff:
    return Backoff(math.inf, first_s=REFETCH_FIRST_S, max_s=REFETCH_MAX_S)


@dataclass(frozen=True)
class FetchSettings:
    """How a follower fetches (the broker's replica_* settings)."""
    wait_ms: int                  # replica_fetch_wait_max_ms: a fetch's long-poll
    max_bytes: int                # replica_fetch_max_bytes, per partition
    write_thread_bytes: int       # records at least this large are written in a worker thread
    request_timeout_s: float


class RefusedPartition:
    """A followed partition whose fetched answers keep failing: a batch damaged on the
    leader's disk fails its CRC here at every fetch, a leader's disk error, a local write
    that fails. Such a fault usually lasts, so the partition is refetched after a delay
    that grows (the shared Backoff: doubling, with jitter, up to its max_s) rather than
    every round, and warned about when it starts and then at most once per max_s with
    how many refetches failed meanwhile: a lasting fault floods neither the leader nor
    the log. The follower drops it at the partition's next good answer or new leader
    epoch, so a repaired batch is taken at the next refetch, a new leader's at once."""

    def __init__(self, pace: Backoff, clock: Callable[[], float]):
        self.pace = pace
        self._clock = clock
        self.retry_at = clock()
        self.unreported = 0
        self.reported_at: float | None = None

    def ready(self) -> bool:
        return self._clock() >= self.retry_at

    def failed(self) -> int:
        """One more failed fetch: the next waits longer. Returns how many failures to
        report in a warning now (the first, then one summary per max_s); 0: stay quiet."""
        now = self._clock()
        self.retry_at = now + self.pace.step()
        self.unreported += 1
        if self.reported_at is not None and now - self.reported_at < self.pace.max_s:
            return 0
        count, self.unreported, self.reported_at = self.unreported, 0, now
        return count


@dataclass
class _Followed:
    epoch: int
    truncate: bool = True
    refused: RefusedPartition | None = None     # set while its answers keep failing


class LeaderFetcher:
    """Fetches every partition this broker follows on one leader broker, over one connection."""

    def __init__(self, leader_id: int, view: ClusterView, logs: LogManager, dialer: PeerDialer,
                 settings: FetchSettings, paused: Callable[[], bool],
                 pace: Callable[[], Backoff] = refetch_backoff, durable: Durable | None = None):
        self.leader_id = leader_id
        self.view = view
        self.node_id = view.node_id
        self.logs = logs
        self.dialer = dialer
        self.settings = settings
        # True while the replica manager pauses fetching (what a stopped follower looks like).
        self.paused = paused
        self._pace = pace         # a new refused partition's refetch pacing
        self._durable = durable   # None: report what was written, fsynced or not
        self._clock = time.monotonic
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
            info = self.view.brokers().get(self.leader_id)
            if info is None:
                await asyncio.sleep(0.1)
                continue
            try:
                self._conn = await self.dialer.connect(info, f"semel-replica-{self.node_id}")
                while self.parts:
                    await self._round()
            except PeerAuthError:     # logged by the dialer; a login refused now is refused in a second
                await asyncio.sleep(1)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, PeerError) as exc:
                log.info("fetcher %d -> %d: %s; reconnecting", self.node_id, self.leader_id, exc or type(exc).__name__)
                await asyncio.sleep(0.1)
            except Exception:     # a disk failure, a bug: keep the fetcher alive, retry slowly
                log.exception("fetcher %d -> %d failed; retrying", self.node_id, self.leader_id)
                await asyncio.sleep(1)
            finally:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

    async def _round(self) -> None:
        if self.paused():
            await asyncio.sleep(0.05)
            return
        ready = {tp: f for tp, f in self.parts.items() if f.refused is None or f.refused.ready()}
        if not ready:
            await self._hold(min(f.refused.retry_at for f in self.parts.values() if f.refused is not None))
            return
        pending = {tp: f for tp, f in ready.items() if f.truncate}
        if pending:
            if not await self._truncate(pending):
                await asyncio.sleep(0.05)     # the leader has not taken over yet
            return
        if not await self._fetch(ready):
            await asyncio.sleep(0.05)

    async def _hold(self, until: float) -> None:
        """Every partition waits for a refetch: sleep until the first is due, or a new
        partition or leader epoch comes (add)."""
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), max(0.0, until - self._clock()))
        except asyncio.TimeoutError:
            pass

    def _log(self, tp: TopicPartition) -> PartitionLog | None:
        return self.logs.get(*tp)

    def _connection(self) -> PeerConnection:
        if self._conn is None:     # closed under a round: _run reconnects
            raise ConnectionResetError(f"no connection to leader {self.leader_id}")
        return self._conn

    async def _truncate(self, pending: dict[TopicPartition, _Followed]) -> bool:
        """One OffsetForLeaderEpoch round for the partitions that must truncate; True on progress."""
        cls = request_class(ApiKey.OFFSET_FOR_LEADER_EPOCH)
        T = cls.OffsetForLeaderTopic
        by_topic: dict[str, list[object]] = {}
        for (topic, p), f in pending.items():
            plog = self._log((topic, p))
            if plog is None:
                continue
            by_topic.setdefault(topic, []).append(T.OffsetForLeaderPartition(
                partition=p, current_leader_epoch=f.epoch, leader_epoch=plog.epochs.latest_epoch))
        resp = await self._connection().call(ApiKey.OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION, self.settings.request_timeout_s,
                                     replica_id=self.node_id,
                                     topics=[T(topic=t, partitions=ps) for t, ps in by_topic.items()])
        progress = False
        for t in resp.topics:
            for r in t.partitions:
                tp = (t.topic, r.partition)
                now = self.parts.get(tp)
                if now is None or tp not in pending or now is not pending[tp] or r.error_code:
                    continue
                progress = True
                now.truncate = not self._truncate_one(tp, r.leader_epoch, r.end_offset)
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

    async def _make_durable(self, parts: dict[TopicPartition, _Followed]) -> dict[TopicPartition, _Followed]:
        """fsync what the last round wrote before the fetch offsets report it; the
        partitions whose fsync failed sit this round out (refused), so a position the
        disk does not hold never reaches the leader."""
        if self._durable is None:
            return parts
        dirty = [(tp, plog) for tp in parts if (plog := self._log(tp)) is not None
                 and plog.flushed_offset < plog.log_end_offset]
        if not dirty:
            return parts
        outcomes = await self._durable([(plog, plog.log_end_offset) for _, plog in dirty])
        out = dict(parts)
        for (tp, _), exc in zip(dirty, outcomes):
            if exc is not None:
                f = out.pop(tp)
                self._refused(tp, f, logging.ERROR, "fsync of replicated records failed: %s", exc)
        return out

    async def _fetch(self, parts: dict[TopicPartition, _Followed]) -> bool:
        """One Fetch for these followed partitions; True when nothing went wrong."""
        parts = await self._make_durable(parts)
        cls = request_class(ApiKey.FETCH)
        T = cls.FetchTopic
        sent: dict[TopicPartition, _Followed] = {}
        by_topic: dict[str, list[object]] = {}
        for tp, f in parts.items():
            plog = self._log(tp)
            if plog is None:
                continue
            sent[tp] = f
            by_topic.setdefault(tp[0], []).append(T.FetchPartition(
                partition=tp[1], current_leader_epoch=f.epoch, fetch_offset=plog.log_end_offset,
                last_fetched_epoch=plog.epochs.latest_epoch, log_start_offset=plog.log_start_offset,
                partition_max_bytes=self.settings.max_bytes))
        if not sent:
            return False
        resp = await self._connection().call(
            ApiKey.FETCH, FETCH_VERSION, self.settings.request_timeout_s + self.settings.wait_ms / 1000,
            replica_id=self.node_id, max_wait_ms=self.settings.wait_ms, min_bytes=1,
            max_bytes=self.settings.max_bytes * 8, isolation_level=0, session_id=0, session_epoch=-1,
            topics=[T(topic=t, partitions=ps) for t, ps in by_topic.items()], forgotten_topics_data=[],
            rack_id="")
        if resp.error_code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
            # Our login lacks ClusterAction there: say so once a minute, not per partition per round.
            raise self.dialer.refused(self.leader_id, "fetch denied: the inter-broker principal needs "
                                                        "ClusterAction on the cluster (a super user)")
        if self.paused():
            return True       # paused while the fetch was out: as if the answer never came
        ok = True
        writing: list[Awaitable[bool]] = []
        for t in resp.responses:
            for r in t.partitions:
                tp = (t.topic, r.partition_index)
                now = self.parts.get(tp)
                if now is None or now is not sent.get(tp):
                    continue          # leadership moved while the fetch was out
                done = self._apply(tp, now, r)
                if isinstance(done, bool):
                    ok = done and ok
                else:
                    writing.append(done)
        # Every partition's write runs at once (one worker thread each); the next fetch,
        # whose offsets report these logs' ends, goes out only once all have landed.
        for done in await asyncio.gather(*writing) if writing else ():
            ok = done and ok
        return ok

    # `r`, here and below: one partition of a decoded Fetch answer (kafka-python's
    # message classes are untyped).
    def _apply(self, tp: TopicPartition, f: _Followed, r: Any) -> bool | Awaitable[bool]:
        """Apply one partition's answer: True/False (went right or not), or, for records
        written in a worker thread, an awaitable of that. Runs without an await from the
        caller's role check to the write's start, so the write belongs to this role."""
        plog = self._log(tp)
        if plog is None:
            return True           # the topic's logs went with it while the fetch was out
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
        if err in _FENCING:
            return False          # a leader change under way: its new epoch comes soon
        if err is not KafkaError.NONE:
            return self._refused(tp, f, logging.WARNING, "fetch from leader %d: %s", self.leader_id, err.name)
        div = r.diverging_epoch
        if div is not None and div.epoch >= 0:
            self._truncate_one(tp, div.epoch, div.end_offset)    # the next fetch checks again
            return True
        if r.records:
            in_thread = len(r.records) >= self.settings.write_thread_bytes
            try:
                if in_thread:
                    return self._landed(tp, f, r, plog.append_replicated_begin(r.records))
                plog.append_replicated(r.records)
            except StorageError as exc:
                return self._refused(tp, f, logging.ERROR, "replicated append failed: %s", exc)
            except AppendError as exc:    # does not continue the local log: find out where we diverged
                f.truncate = True
                return self._refused(tp, f, logging.WARNING, "%s; truncating again", exc)
        self._follower_hw(plog, r)
        f.refused = None
        return True

    def _refused(self, tp: TopicPartition, f: _Followed, level: int, msg: str, *args: object) -> bool:
        """A failed answer for tp: refetch it later, and log it unless reported lately (False)."""
        if f.refused is None:
            f.refused = RefusedPartition(self._pace(), self._clock)
        count = f.refused.failed()
        if count > 1:
            msg += "; %d refetches failed since the last report"
            args += (count,)
        if count:
            log.log(level, "%s-%d: " + msg, *tp, *args)
        return False

    async def _landed(self, tp: TopicPartition, f: _Followed, r: Any, write: Awaitable[AppendInfo]) -> bool:
        """Wait for a write in a worker thread; then the follower's high watermark, unless
        the role changed meanwhile (that change settled the write and owns the log now)."""
        try:
            await write
        except StorageError as exc:
            return self._refused(tp, f, logging.ERROR, "replicated append failed: %s", exc)
        plog = self._log(tp)
        if self.parts.get(tp) is f and not self._closing and plog is not None:
            self._follower_hw(plog, r)
            f.refused = None
        return True

    @staticmethod
    def _follower_hw(plog: PartitionLog, r: Any) -> None:
        plog.set_high_watermark(max(plog.log_start_offset, min(r.high_watermark, plog.log_end_offset)))


