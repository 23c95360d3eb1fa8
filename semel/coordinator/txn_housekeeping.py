"""The transaction coordinator's housekeeping: timeouts, expiry, compaction.

A TxnHousekeeping belongs to one TransactionCoordinator (semel.coordinator.txn). Every
`transaction_abort_check_interval_ms` while the coordinator serves (a periodic pass of
the coordinator runtime) it aborts the
transactions past their timeout, expires transactional ids idle for longer than
`transactional_id_expiration_ms`, compacts the coordinator's log by rewriting it once it
holds many more records than live ids, and warns of transitions that stay pending.
What to abort, expire or rewrite is the shard's to say (coordinator.txn_shard); the
pass writes those ops through its coordinator (HousekeptCoordinator).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from ..protocol import records
from ..protocol.errors import KafkaError
from .coordinator_log import CoordinatorLog
from .txn_shard import TxnOp, TxnShard
from .txn_states import TxnMeta, TxnState, encode_value, now_ms

log = logging.getLogger("semel.txn")


class HousekeptCoordinator(Protocol):
    """What housekeeping needs of its transaction coordinator."""
    shard: TxnShard

    def busy(self) -> bool:
        """Is a record waiting for its replay, or an id's first record being written?"""

    async def commit(self, op: TxnOp[Any]) -> tuple[KafkaError, bool]: ...

    async def abort_with_bump(self, meta: TxnMeta) -> KafkaError: ...


class HousekeepingConfig(Protocol):
    """The broker settings housekeeping reads (semel.broker.config)."""
    transactional_id_expiration_ms: int
    transaction_abort_check_interval_ms: int
    transaction_log_compact_records: int


class TimeoutStats(Protocol):
    def txn_timed_out(self) -> None: ...


class TxnHousekeeping:
    """`coordinator` the host, `clog` its log, `stats` counts the timeouts."""

    def __init__(self, coordinator: HousekeptCoordinator, clog: CoordinatorLog,
                 config: HousekeepingConfig, stats: TimeoutStats) -> None:
        self.coordinator = coordinator
        self.shard = coordinator.shard
        self.clog = clog
        self.config = config
        self.stats = stats

    async def run_once(self) -> None:
        """One housekeeping pass; the coordinator runtime runs it every
        `transaction_abort_check_interval_ms` while the coordinator serves (never on a
        log this broker does not coordinate) and logs a pass that fails."""
        await self.abort_timed_out()
        await self.expire_idle()
        await self.maybe_compact()
        warn_stuck(self.shard.txns)

    async def maybe_compact(self) -> bool:
        """Compaction by rewrite: once the log holds many more records than there
        are live transactional ids, append the current state of every id and drop
        the segments entirely before it. Replay then reads a bounded log, so restart
        time and disk follow the live state, not the history.

        Memory is exactly the log's last word for each id only while no appended
        record still waits for its fsync and apply; compaction waits for such a
        moment (and for no transition in flight), then copies memory synchronously."""
        txns = self.shard.txns
        threshold = max(self.config.transaction_log_compact_records, 4 * len(txns))
        if self.clog.records_since_compaction < threshold:
            return False
        if self.coordinator.busy() or any(m.pending is not None for m in txns.values()):
            return False
        live = [(m.txn_id.encode(), encode_value(m)) for m in self.shard.snapshot()]
        data = b"".join(records.build_batch(live[i:i + 500]) for i in range(0, len(live), 500))
        return await self.clog.rewrite(data, len(live))

    async def abort_timed_out(self) -> int:
        expired = self.shard.timed_out(time.monotonic())
        for meta in expired:
            if not self.shard.still_timed_out(meta):
                continue  # the client ended it (or a parent joined it) while an earlier abort was logged
            log.info("aborting %s: transaction timed out after %d ms", meta.txn_id, meta.timeout_ms)
            if not await self.coordinator.abort_with_bump(meta):
                self.stats.txn_timed_out()
        return len(expired)

    async def expire_idle(self) -> int:
        idle = self.shard.idle(now_ms() - self.config.transactional_id_expiration_ms)
        for meta in idle:
            # An id used again while an earlier tombstone was being logged keeps its lock: refused.
            await self.coordinator.commit(self.shard.expire(meta))
        return len(idle)


def warn_stuck(txns: Mapping[str, TxnMeta], after_ms: int = 30_000) -> None:
    """A transition that has been completing for long means markers cannot be
    written (full disk?); say so instead of leaving clients to time out silently.
    Counted from when the transition began (TxnMeta.pending_since)."""
    now = time.monotonic()
    for meta in txns.values():
        if meta.pending is not None and now - meta.pending_since > after_ms / 1000:
            log.warning("%s has been completing %s for %d s", meta.txn_id, TxnState(meta.pending).name,
                        now - meta.pending_since)
